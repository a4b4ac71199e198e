"""report's fitting to a width: `fit_lines` and `render_table` with ``width``."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from warpolicy.registry.report import fit_lines, render_table

words = st.text(alphabet="abcdefghij_/:.,=()", min_size=1, max_size=30)
lines = st.builds(
    lambda indent, ws: " " * indent + " ".join(ws), st.integers(0, 8), st.lists(words, max_size=25)
)


@given(st.lists(lines, max_size=6), st.integers(20, 120))
def test_fit_lines_wraps_to_the_width_and_keeps_every_word(given_lines, width):
    fitted = fit_lines(given_lines, width)
    assert " ".join(fitted).split() == " ".join(given_lines).split()
    for line in fitted:
        # only a word longer than the room left may overflow, alone on its line
        assert len(line) <= width or len(line.split()) == 1


@given(st.lists(lines, max_size=6))
def test_no_width_changes_nothing(given_lines):
    assert fit_lines(given_lines, None) == given_lines


def test_a_continuation_hangs_under_its_line():
    out = fit_lines(["  flags: " + ", ".join(f"flag{i}=false" for i in range(12))], 40)
    assert out[0].startswith("  flags:") and all(line.startswith("      ") for line in out[1:])


ROWS = [
    ("aiter", "decode", "in_graph", "declared", "-"),
    ("dsv4", "extend", "none", "gate-a,gate-b", "x " * 30),
]
HEADER = ("backend", "mode", "policy", "because", "per batch")


def test_a_table_too_wide_keeps_the_leading_columns_and_moves_the_rest_below():
    full = render_table(HEADER, ROWS)
    assert max(len(line) for line in full.splitlines()) > 40
    fitted = render_table(HEADER, ROWS, width=30, quiet={"-", "declared"})
    lines = fitted.splitlines()
    assert max(len(line) for line in lines) <= 30
    assert lines[0].split() == ["backend", "mode", "policy"]
    assert "because: gate-a,gate-b" in fitted and "declared" not in fitted
    assert fitted.count("per batch:") == 1  # the row whose value is '-' says nothing


def test_a_table_that_fits_is_unchanged():
    assert render_table(HEADER[:3], [r[:3] for r in ROWS], width=80) == render_table(
        HEADER[:3], [r[:3] for r in ROWS]
    )
