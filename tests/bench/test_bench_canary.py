"""``warpolicy bench canary`` on the simulated platform: the rows, the targets, the factory
path and the command (numbers are host times there; only the GPU run's figures mean anything)."""

from __future__ import annotations

import json

import pytest

from warpolicy.bench.canary import COST_ROWS, LEAD_ROWS, format_canary, run_canary_bench
from warpolicy.cli.main import main
from warpolicy.errors import InputError


def test_the_synthetic_run_has_every_cost_and_lead_row():
    result = run_canary_bench(device="sim", steps=20, lead_rate=1.0)
    (model,) = result["models"]
    assert [r["name"] for r in model["cost"]] == [name for name, _ in COST_ROWS]
    assert [r["name"] for r in model["lead"]] == [name for name, _ in LEAD_ROWS]
    every = model["cost"][-1]
    assert every["checked"] == every["runs"] * 20 and every["violations"] == 0
    assert 0 < every["max_sample_bytes"] <= every["max_bytes"]
    assert model["cost"][0]["checked"] == 0  # off
    assert all(r["lead_samples"] == 20 for r in model["lead"])
    assert model["targets"]["no_violation_on_the_safe_model"]
    text = format_canary(result)
    assert "cost per sample" in text and "release lead" in text and "targets:" in text


def test_a_factory_subject_is_checked_with_its_extra_outputs_as_state():
    result = run_canary_bench(
        device="sim", steps=12, factory="canary_support:synthetic_factory", lead_rate=1.0
    )
    (model,) = result["models"]
    assert model["model"] == "in_graph"
    every = model["cost"][-1]
    assert every["checked"] == 12 and every["violations"] == 0 and every["failures"] == 0


@pytest.mark.parametrize("kw", [{"steps": 0}, {"lead_rate": 0.0}, {"lead_rate": 1.5}])
def test_bad_options_are_one_line(kw):
    with pytest.raises(InputError):
        run_canary_bench(device="sim", **kw)


def test_the_command_prints_json(capsys):
    pytest.importorskip("torch")  # the benchmark runs the runtime
    code = main(["bench", "canary", "--device", "sim", "--steps", "10", "--format", "json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0 and out["models"][0]["cost"][0]["name"] == "off"
