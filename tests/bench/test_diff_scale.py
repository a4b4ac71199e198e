"""`warpolicy.bench.diff_scale`: the scaled diff finds the same cells pruned or not (the
timings are printed, never asserted)."""

from __future__ import annotations

from warpolicy.bench.diff_scale import run


def test_the_scaled_diff_finds_the_same_cells_both_ways():
    line = run(40, 12)
    assert "same cells" in line and "41 cells" in line  # base and every backend, decode
