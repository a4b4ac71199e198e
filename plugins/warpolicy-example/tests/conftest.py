# warpolicy's pytest fixtures: warpolicy_pm, warpolicy_sim, warpolicy_register
pytest_plugins = ["warpolicy.testing.fixtures"]
