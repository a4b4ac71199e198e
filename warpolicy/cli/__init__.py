"""The ``warpolicy`` command line."""
