"""Test support for warpolicy and its users' tests; nothing in the package imports it.

Shipped features live with their feature: the synthetic audit backends in `warpolicy.audit`,
benchmark and example models in `warpolicy.bench`.
"""
