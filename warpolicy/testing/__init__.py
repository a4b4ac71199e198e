"""Test support that ships with warpolicy: the fake platform plugin and small models."""
