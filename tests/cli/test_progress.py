"""Progress on stderr: one line per finished item without a terminal, a bar redrawn in place
with one, nothing with --quiet; stdout's data is the same either way."""

from __future__ import annotations

import io
import itertools
import json

import pytest

from warpolicy.audit import run_audit
from warpolicy.cli.main import main
from warpolicy.cli.progress import StderrProgress


def test_lines_without_a_terminal():
    stream = io.StringIO()
    clock = itertools.count(0.0, 0.5)
    progress = StderrProgress(
        "warpolicy audit", stream=stream, terminal=False, clock=lambda: next(clock)
    )
    progress.note("building the subjects")
    assert stream.getvalue() == ""  # said once it is over: a failure in it stays one line
    progress.planned(2)
    for label, outcome in (("fa3 decode", "safe"), ("fa3 extend", "unsafe")):
        progress.started(label)
        progress.finished(label, outcome)
    assert stream.getvalue().splitlines() == [
        "warpolicy audit: building the subjects (0.5 s)",
        "warpolicy audit: [1/2] fa3 decode: safe (0.5 s)",
        "warpolicy audit: [2/2] fa3 extend: unsafe (0.5 s)",
    ]


def test_a_bar_on_a_terminal_then_the_same_lines():
    stream = io.StringIO()
    progress = StderrProgress("warpolicy bench", stream=stream, terminal=True, clock=lambda: 1.0)
    progress.planned(4)
    progress.started("in_graph")
    assert stream.getvalue().endswith("[-----" + "-" * 15 + "] [1/4] in_graph ...")
    progress.finished("in_graph", "1.42x")
    progress.started("post_replay")
    shown = stream.getvalue()
    assert "\r\x1b[2Kwarpolicy bench: [1/4] in_graph: 1.42x (0.0 s)\n" in shown
    assert shown.endswith("[#####" + "-" * 15 + "] [2/4] post_replay ...")


def test_an_unknown_total_counts_without_a_bar():
    stream = io.StringIO()
    progress = StderrProgress("x", stream=stream, terminal=False)
    progress.started("a")
    progress.finished("a", "ok")
    assert stream.getvalue().startswith("x: [1] a: ok")


class Recorder:
    def __init__(self):
        self.calls = []

    def planned(self, total):
        self.calls.append(("planned", total))

    def started(self, label):
        self.calls.append(("started", label))

    def finished(self, label, outcome):
        self.calls.append(("finished", label, outcome))

    def note(self, text):
        self.calls.append(("note", text))


def test_run_audit_reports_every_entry_as_it_goes():
    pytest.importorskip("torch")
    recorder = Recorder()
    report = run_audit(
        synthetic="in_graph,late_swa_read", device="sim", trials=2, progress=recorder
    )
    finished = [c for c in recorder.calls if c[0] == "finished"]
    assert recorder.calls[0] == ("planned", len(report.entries))
    assert [(c[1], c[2]) for c in finished] == [
        (f"{e.backend} {e.mode.label}", e.verdict.label) for e in report.entries
    ]
    started = [c[1] for c in recorder.calls if c[0] == "started"]
    assert started == [c[1] for c in finished]
    assert "unsafe" in {c[2] for c in finished}


def test_the_audit_command_prints_progress_on_stderr_only(capsys):
    pytest.importorskip("torch")
    argv = [
        "audit",
        "--synthetic",
        "in_graph",
        "--device",
        "sim",
        "--trials",
        "2",
        "--format",
        "json",
    ]
    main(argv)
    out, err = capsys.readouterr()
    lines = err.splitlines()
    assert lines and all(line.startswith("warpolicy audit: [") for line in lines)
    assert len(lines) == len(json.loads(out)["entries"])
    main([*argv, "--quiet"])
    quiet_out, quiet_err = capsys.readouterr()
    assert quiet_err == "" and json.loads(quiet_out)["entries"] == json.loads(out)["entries"]


@pytest.mark.parametrize(
    "argv, rows_of",
    [
        (["overlap", "--steps", "12"], lambda doc: [r["name"] for r in doc["rows"]]),
        (
            ["overlap", "--steps", "12", "--factory", "overlap_subjects:writer"],
            lambda doc: [f"{s['name']} {r['name']}" for s in doc["subjects"] for r in s["rows"]],
        ),
        (
            ["canary", "--steps", "12"],
            lambda doc: [
                f"{m['model']} {part}" for m in doc["models"] for part in ("cost", "release lead")
            ],
        ),
    ],
)
def test_a_benchmark_reports_each_variant_on_stderr(capsys, argv, rows_of):
    pytest.importorskip("torch")
    code = main(["bench", *argv, "--device", "sim", "--format", "json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    items = [line for line in err.splitlines() if "] " in line]
    labels = [line.split("] ", 1)[1].rsplit(": ", 1)[0] for line in items]
    assert labels == rows_of(json.loads(out))
    assert all(line.startswith(f"warpolicy bench {argv[0]}: [") for line in items)
    assert main(["bench", *argv, "--device", "sim", "--format", "json", "-q"]) == 0
    quiet_out, quiet_err = capsys.readouterr()
    assert quiet_err == "" and json.loads(quiet_out).keys() == json.loads(out).keys()
