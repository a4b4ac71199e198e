"""Benchmarks: decision latency, overlap, fence (each prints ratios measured in one run)."""
