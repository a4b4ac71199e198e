"""``table`` and ``explain`` fit the terminal: ``COLUMNS=80`` gives no line over 80 columns and
loses no row or reason; ``--wide`` and output without a terminal keep one line per row; JSON
does not change with the width."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from warpolicy.cli import layout
from warpolicy.cli.main import main
from warpolicy.registry.loader import default_registry_path


def widest(text: str) -> int:
    """The longest line that could be wrapped: a line that is one word after its indentation
    (a registry path in an origin: its length depends on where the package is installed) stays
    whole by design (`fit_lines`)."""
    return max((len(line) for line in text.splitlines() if " " in line.strip()), default=0)


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    assert code == 0, err
    return out


def test_table_fits_80_columns_and_keeps_every_row(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    text = run(capsys, "table")
    assert widest(text) <= 80
    rows = json.loads(run(capsys, "table", "--format", "json"))["rows"]
    grid = {tuple(line.split()[:4]) for line in text.splitlines() if not line.startswith(" ")}
    for row in rows:  # every cell is still a row of the grid, its policy marked as before
        policy = row["policy"] + ("*" if row.get("per_batch") else "")
        assert (row["backend"], row["mode"], row["spec"], policy) in grid
    reasons = [",".join(r["reasons"][1:]) for r in rows if len(r["reasons"]) > 1]
    assert reasons and all(f"because: {why}" in text for why in reasons)


def test_wide_and_no_terminal_keep_one_line_per_row(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    wide = run(capsys, "table", "--wide")
    monkeypatch.delenv("COLUMNS")
    piped = run(capsys, "table")  # capsys is not a terminal: nothing to fit
    assert wide == piped
    assert max(len(line) for line in wide.splitlines()) > 80
    assert not any(line.startswith("    because:") for line in wide.splitlines())


@pytest.mark.parametrize("command", ["explain", "query"])
def test_explain_and_query_fit_80_columns_and_say_the_same_words(capsys, monkeypatch, command):
    argv = (command, "--backend", "fa3", "--mode", "extend", "--flag", "prefill_read_done=1")
    wide = run(capsys, *argv, "--wide")
    monkeypatch.setenv("COLUMNS", "80")
    fitted = run(capsys, *argv)
    assert max(len(line) for line in wide.splitlines()) > 80
    assert widest(fitted) <= 80
    assert fitted.split() == wide.split()
    assert fitted.splitlines()[0] == wide.splitlines()[0]  # the policy, alone on the first line


@pytest.mark.parametrize(
    "command", [("table",), ("explain", "--backend", "fa3", "--mode", "extend")]
)
def test_json_does_not_change_with_the_width(capsys, monkeypatch, command):
    monkeypatch.setenv("COLUMNS", "40")
    narrow = run(capsys, *command, "--format", "json")
    monkeypatch.delenv("COLUMNS")
    assert run(capsys, *command, "--format", "json") == narrow


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True

    def fileno(self) -> int:
        return 99


def test_output_width(monkeypatch):
    monkeypatch.setenv("COLUMNS", "100")
    assert layout.output_width() == 100
    assert layout.output_width(wide=True) is None
    for junk in ("0", "-3", "wide", ""):
        monkeypatch.setenv("COLUMNS", junk)
        monkeypatch.setattr("sys.stdout", io.StringIO())
        assert layout.output_width() is None, junk
    monkeypatch.delenv("COLUMNS")
    monkeypatch.setattr("sys.stdout", Terminal())
    monkeypatch.setattr(
        layout.os, "get_terminal_size", lambda fd: __import__("os").terminal_size((123, 40))
    )
    assert layout.output_width() == 123


def test_diff_fits_the_terminal_and_keeps_every_changed_cell(capsys, monkeypatch, tmp_path):
    old = tmp_path / "old.yaml"
    old.write_text(  # the packaged registry with every post_replay read end unknown
        Path(default_registry_path()).read_text(encoding="utf-8").replace("post_replay", "none")
    )
    argv = ("diff", str(old), str(default_registry_path()), "--limit", "0")
    monkeypatch.delenv("COLUMNS", raising=False)
    wide = main([*argv]), capsys.readouterr().out
    monkeypatch.setenv("COLUMNS", "70")
    fitted = main([*argv]), capsys.readouterr().out
    assert wide[0] == fitted[0] == 0
    assert max(len(line) for line in wide[1].splitlines()) > 70
    assert widest(fitted[1]) <= 70
    cells = json.loads(run(capsys, *argv, "--format", "json"))["cells"]
    assert cells and len([c for c in cells if c["change"] == "earlier"]) == fitted[1].count(
        "change: earlier"
    )
    monkeypatch.setenv("COLUMNS", "70")
    assert run(capsys, *argv, "--wide") == wide[1]


def test_plugins_fits_the_terminal(capsys, monkeypatch):
    wide = run(capsys, "plugins", "--wide")
    monkeypatch.setenv("COLUMNS", "30")
    fitted = run(capsys, "plugins")
    assert widest(fitted) <= 30 < max(map(len, wide.splitlines()))
    assert "hooks: platform" in fitted
