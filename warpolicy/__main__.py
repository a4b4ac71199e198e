"""``python -m warpolicy``: the same as the ``warpolicy`` console script."""

from warpolicy.cli.main import run

if __name__ == "__main__":
    run()
