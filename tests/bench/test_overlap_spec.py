"""``warpolicy bench overlap --spec-step`` (`warpolicy.bench.overlap_spec`) on the simulated
platform: every shape and run, the staged shape really staged (verify releases every step), the
lying stager's row, the staging cost columns, and JSON rows named by shape and run."""

from __future__ import annotations

import json

import pytest

from warpolicy.bench.command import render
from warpolicy.bench.overlap_spec import (
    LYING,
    SHAPES,
    format_overlap_spec,
    run_overlap_spec_bench,
)
from warpolicy.errors import InputError


@pytest.fixture(scope="module")
def result():
    return run_overlap_spec_bench(device="sim")


def test_every_shape_and_run_has_a_row(result):
    rows = {(r["shape"], r["run"]) for r in result["rows"]}
    expected = {(s, r) for s in SHAPES for r in ("coarse", "step", "no_barrier")}
    assert rows == expected | {("eagle_staged", LYING)}


def test_the_staged_shape_releases_at_verify_every_step(result):
    rows = {(r["shape"], r["run"]): r for r in result["rows"]}
    staged = rows[("eagle_staged", "step")]
    assert staged["reader"] == "verify (staged)"
    assert staged["staged_steps"] == staged["checked"] > 0
    # three tables of the draft extend: req_to_token, full_to_swa and the batch index
    assert staged["staging_bytes"] > rows[("eagle_staged", LYING)]["staging_bytes"] > 0
    assert staged["staging_us"] > 0
    assert rows[("eagle", "step")]["reader"] == "draft_extend"
    assert rows[("eagle", "step")]["staged_steps"] == 0
    assert rows[("eagle", "step")]["staging_bytes"] == 0
    assert rows[("dflash", "step")]["reader"] == "verify"
    assert result["targets"]["sound_runs_zero_corrupted"]
    assert result["targets"]["staged_steps_all_staged"]
    # the simulated platform runs in program order: the lying stager's race is not judged here
    assert "lying_stager_corrupts" not in result["targets"]


def test_text_and_json(result):
    text = format_overlap_spec(result)
    assert "eagle_staged" in text and "verify (staged)" in text and "meaningless" in text
    doc = json.loads(render(result, "json", format_overlap_spec))
    names = [(r["shape"], r["run"]) for r in doc["rows"]]
    assert ("eagle_staged", "step") in names and len(names) == len(set(names))
    with pytest.raises(InputError):
        render(result, "yaml", format_overlap_spec)
