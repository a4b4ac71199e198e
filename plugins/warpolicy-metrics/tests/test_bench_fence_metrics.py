"""``warpolicy bench fence --metrics --nvtx`` with this plugin installed: the fence benchmark
times a step with each observer plugin registered, against the no-op observer."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("prometheus_client")

from warpolicy.cli.main import main


def run_cli(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_bench_fence_on_sim_times_the_metrics_and_nvtx_observers(capsys):
    code, out, err = run_cli(
        capsys,
        "bench",
        "fence",
        "--device",
        "sim",
        "--iterations",
        "60",
        "--metrics",
        "--nvtx",
        "--format",
        "json",
    )
    assert code == 0, err
    doc = json.loads(out)
    assert doc["platform"] == "sim" and doc["schema_version"] == 1
    for row in doc["overhead"]["per_policy"].values():
        assert set(row["plugins"]) == {"metrics", "nvtx"}
        noop = row["with_observer_us_median"]
        for plugin in row["plugins"].values():
            assert plugin["extra_over_noop_us"] == pytest.approx(plugin["us_median"] - noop)
    code, out, _ = run_cli(
        capsys, "bench", "fence", "--device", "sim", "--iterations", "60", "--metrics"
    )
    assert code == 0 and "with metrics:" in out and "over the no-op observer" in out
