"""``warpolicy bench widen`` and ``bench launch-sites`` on the simulated platform: they run, report
every runner (the widener off both ways) and name the nodes (the numbers are the CPU's)."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("torch")  # the benchmarks/subjects run torch models (the no-torch nox sessions)

from warpolicy.cli.main import main


def test_bench_widen_reports_the_off_runners_against_the_baseline(capsys):
    code = main(
        ["bench", "widen", "--device", "sim", "--steps", "5", "--repeat", "2"]
        + ["--format", "json"]
    )
    doc = json.loads(capsys.readouterr().out)
    assert code == 0
    assert [r["runner"] for r in doc["rows"]] == [
        "off by argument (baseline)",
        "off, environment unset",
    ]
    assert doc["rows"][0]["ratio"] == 1.0 and doc["rows"][1]["us_per_step"] > 0


def test_bench_launch_sites_names_every_torch_launch(capsys):
    code = main(["bench", "launch-sites", "--device", "sim", "--repeat", "2", "--layers", "4"])
    out = capsys.readouterr().out
    assert code == 0 and "recorder cost" in out and "budget 10 ms" in out
    assert int(out.rsplit(",", 1)[1].split()[0]) > 0  # "..., N nodes named"
