"""``bench overlap --factory``: the overlap benchmark on a user's model, simulated platform.

The numbers are host times (meaningless); what is checked is the path: the factory's subjects,
the scheduler being the subject's ``make_batch``, the state put back before every run, the
prep-only ideal release from the protocol alone, every variant measured and compared, and the
one-line failures of the CLI.
"""

from __future__ import annotations

import json

import pytest
import torch
from overlap_subjects import TableModel, writer

from warpolicy.bench.command import render
from warpolicy.bench.overlap import PrepOnly
from warpolicy.bench.overlap_factory import (
    ROWS,
    SubjectSchedule,
    format_factory_overlap,
    run_factory_overlap,
    targets,
)
from warpolicy.cli.main import main
from warpolicy.errors import CudaUnavailableError, InputError
from warpolicy.registry.vocabulary import ForwardMode
from warpolicy.testing import sim_platform

NAMES = [name for name, *_ in ROWS]


def run(factory: str = "overlap_subjects:writer", **kw):
    return run_factory_overlap(factory, device="sim", steps=kw.pop("steps", 6), repeats=1, **kw)


def test_every_variant_is_measured_on_the_factory_s_model(tmp_path):
    trace = tmp_path / "trace.json"
    result = run(trace=str(trace))
    (one,) = result["subjects"]
    assert one["name"] == "writer" and one["mode"] == "decode" and one["buckets"] == [2, 4]
    rows = {r["name"]: r for r in one["rows"]}
    assert list(rows) == NAMES
    assert rows["in_graph"]["resolved"] == "in_graph"  # no graph model: the plant is trusted
    assert rows["derived"]["resolved"] == "post_replay"  # ... but derived cannot plant
    assert all(r["corrupted"] == 0 and r["checked"] == 6 for r in rows.values())
    assert rows["coarse"]["tokens_per_step"] == pytest.approx(3.0)  # buckets 2 and 4 alternate
    assert one["writes_shared"] and one["notes"] == []
    assert one["targets"]["sound_policies_zero_corrupted"]
    assert "release_minus_ideal_us" in rows["in_graph"]
    text = format_factory_overlap(result)
    assert "overlap benchmark of overlap_subjects:writer" in text and "tokens/s" in text
    assert "writer (decode, spec none, buckets [2, 4])" in text
    document = json.loads(render(result, "json", format_factory_overlap))
    assert document["subjects"][0]["rows"][0]["name"] == "coarse"
    names = {
        e["args"]["name"]
        for e in json.loads(trace.read_text())["traceEvents"]
        if e["ph"] == "M" and e["name"] == "process_name"
    }
    assert names == {f"writer:{n}" for n in NAMES}


def test_a_make_batch_that_writes_nothing_shared_is_said_to_show_no_race():
    result = run("overlap_subjects:two")
    writer, reader = result["subjects"]
    assert writer["writes_shared"] and not reader["writes_shared"]
    assert "race nothing here" in reader["notes"][0]
    assert "race nothing here" in format_factory_overlap(result)


def test_the_state_is_put_back_before_every_run():
    subject = writer(sim_platform())
    model = subject.model
    before, kv = model.table.clone(), model.kv.clone()
    schedule = SubjectSchedule(subject, ForwardMode.DECODE)
    schedule.write_step(3)
    model.kv.fill_(5.0)
    assert schedule.writes_shared() and not torch.equal(model.table, before)
    schedule.reset()
    assert torch.equal(model.table, before) and torch.equal(model.kv, kv)
    assert not schedule.writes_shared()
    with pytest.raises(KeyError):
        schedule.batch(3)  # batches are dropped with the state


def test_the_ideal_release_uses_the_protocol_alone():
    model = TableModel(writes=False)
    prep = PrepOnly(model)
    prep.prepare_bucket(2)
    prep.host_prep(torch.tensor([1, 2]), 2)
    prep.graph_prep(2)
    assert prep.forward(2) is None and prep.batch_size(torch.tensor([1, 2, 3])) == 3
    assert torch.equal(model.static[2]["gathered"], model.table[[1, 2]])

    class Bare:  # no batch_size: len() measures
        shared_buffers: dict = {}

    assert PrepOnly(Bare()).batch_size([1, 2]) == 2


def test_targets_are_the_done_when_bar():
    rows = [
        {"name": "coarse", "gap_closed": 0.0, "corrupted": 0, "sound": True},
        {"name": "post_replay", "gap_closed": 0.0, "corrupted": 0, "sound": True},
        {"name": "in_graph", "gap_closed": 0.96, "corrupted": 0, "sound": True},
        {"name": "derived", "gap_closed": 0.94, "corrupted": 0, "sound": True},
        {"name": "no_barrier", "gap_closed": 1.0, "corrupted": 9, "sound": False},
    ]
    assert targets(rows) == {
        "in_graph_closes_95pct": True,
        "derived_closes_95pct": False,
        "sound_policies_zero_corrupted": True,
    }
    rows[2]["corrupted"] = 1
    assert not targets(rows)["sound_policies_zero_corrupted"]


class TestFailures:
    def test_a_bad_factory_is_one_line(self):
        with pytest.raises(InputError, match="expected MODULE:CALLABLE"):
            run("no_colon")
        with pytest.raises(InputError, match="failed: RuntimeError: the model did not load"):
            run("overlap_subjects:broken")

    @pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA present")
    def test_without_cuda_it_needs_the_simulated_platform(self):
        with pytest.raises(CudaUnavailableError, match="--device sim"):
            run_factory_overlap("overlap_subjects:writer", steps=3)


class TestCli:
    def test_the_command_runs_the_factory(self, capsys):
        code = main(
            ["bench", "overlap", "--factory", "overlap_subjects:writer", "--device", "sim",
             "--steps", "4"]
        )  # fmt: skip
        out = capsys.readouterr().out
        assert code == 0 and "writer (decode" in out and "targets:" in out

    @pytest.mark.parametrize("extra", [["--layers", "3"], ["--window-us", "5"], ["--spec-step"],
                                       ["--model", "first_layer_rebuild"], ["--tp", "2"]])  # fmt: skip
    def test_synthetic_options_are_refused_with_a_factory(self, capsys, extra):
        code = main(["bench", "overlap", "--factory", "overlap_subjects:writer", *extra])
        err = capsys.readouterr().err
        assert code == 2 and err.count("\n") == 1 and "describe the synthetic model" in err

    @pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA present")
    def test_without_cuda_exit_2_in_one_line(self, capsys):
        code = main(["bench", "overlap", "--factory", "overlap_subjects:writer"])
        err = capsys.readouterr().err
        assert code == 2 and err.count("\n") == 1 and "needs a CUDA device" in err

    def test_the_llama_decode_needs_cuda_exit_2_in_one_line(self, capsys):
        code = main(
            ["bench", "overlap", "--factory", "warpolicy.bench.llama:decode", "--device", "sim"]
        )
        err = capsys.readouterr().err
        assert code == 2 and err.count("\n") == 1 and "CUDA" in err
