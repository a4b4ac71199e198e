"""The example engine (examples/tiny_engine.py) and the tiny model, on the fake platform.

These runs are thousands of tiny torch ops: they rely on the suite's one-intra-op-thread
setting (tests/conftest.py), without which a loaded machine turned 0.1 s into 27 s per run."""

from __future__ import annotations

import importlib.util
import sys
from collections import Counter
from pathlib import Path

import pytest
import torch

from warpolicy.registry.vocabulary import ForwardMode
from warpolicy.runtime.policy import fixed_policy
from warpolicy.testing import sim_impl, sim_platform
from warpolicy.testing.tiny_model import TinyConfig

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "tiny_engine.py"


def _load_example():
    spec = importlib.util.spec_from_file_location("tiny_engine_example", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # attrs needs the module importable by name
    spec.loader.exec_module(module)
    return module


te = _load_example()


@pytest.fixture
def schedule():
    return te.build_schedule(te.EXAMPLE_CONFIG, 90)


# -- the schedule ----------------------------------------------------------------------------------


def test_schedule_is_deterministic_and_uses_every_runner_path(schedule):
    again = te.build_schedule(te.EXAMPLE_CONFIG, 90)
    assert [(s.mode, s.batch.ids.tolist(), s.write_slots) for s in schedule] == [
        (s.mode, s.batch.ids.tolist(), s.write_slots) for s in again
    ]
    cfg = te.EXAMPLE_CONFIG
    caps = {
        ForwardMode.DECODE: max(cfg.decode_buckets),
        ForwardMode.EXTEND: max(cfg.prefill_buckets),
        ForwardMode.TARGET_VERIFY: max(cfg.verify_buckets),
    }
    paths = Counter((s.mode, len(s.batch) <= caps[s.mode]) for s in schedule)
    for mode in caps:
        assert paths[(mode, True)] > 0  # some steps replay a graph
    assert paths[(ForwardMode.DECODE, False)] > 0 and paths[(ForwardMode.TARGET_VERIFY, False)] > 0


def test_every_token_finds_its_slot_in_the_table(schedule):
    cfg = te.EXAMPLE_CONFIG
    table = torch.zeros(cfg.max_reqs + 1, cfg.max_ctx, dtype=torch.long)
    for s in schedule:
        table[list(s.write_rows), list(s.write_cols)] = torch.tensor(s.write_slots)
        b = s.batch
        assert torch.equal(table[b.rows, b.positions], b.out_cache_loc)
        assert int(b.out_cache_loc.min()) > 0 and int(b.rows.min()) > 0  # 0 is padding


def test_schedule_has_write_after_read_hazards(schedule):
    """Some step's writes rewrite a table entry the previous step reads (a reused row)."""
    hazards = 0
    for prev, nxt in zip(schedule, schedule[1:]):
        read = {
            (int(r), c)
            for r, p in zip(prev.batch.rows, prev.batch.positions)
            for c in range(int(p) + 1)
        }
        hazards += sum((r, c) in read for r, c in zip(nxt.write_rows, nxt.write_cols))
    assert hazards > 0


# -- the engine on the fake platform ----------------------------------------------------------------


@pytest.mark.parametrize("policy", ["in_graph", "post_replay", "none"])
def test_overlapped_run_matches_sequential_reference(schedule, policy):
    engine = te.TinyEngine(fixed_policy(policy), platform=sim_platform())
    engine.capture()
    ref = engine.run(schedule, overlap=False)
    outs = engine.run(schedule)
    assert len(outs) == len(schedule)
    assert te.compare(outs, ref) == []


def test_a_write_that_lands_before_the_read_is_caught(schedule):
    """The comparison the GPU test relies on can fail: apply each step's successor writes
    before the step runs (the race, made deterministic) and some step differs."""
    engine = te.TinyEngine(fixed_policy("in_graph"), platform=sim_platform())
    engine.capture()
    ref = engine.run(schedule, overlap=False)
    engine.state.reset()
    outs = []
    for k, step in enumerate(schedule):
        engine.apply_writes(step)
        if k + 1 < len(schedule):
            engine.apply_writes(schedule[k + 1])  # too early
        outs.append(engine.runners[step.mode].run(step.batch)[: len(step.batch)].clone())
    assert te.compare(outs, ref) != []


@pytest.mark.parametrize("late, changed", [(False, False), (True, True)])
def test_poison_at_the_planted_node_only_hurts_a_late_reader(late, changed):
    """The audit's view: poison the shared table when the in-graph event fires. The normal
    model read it all in graph_prep; the seeded late reader re-reads it after the node."""
    cfg = te.EXAMPLE_CONFIG
    schedule = te.build_schedule(cfg, 4, spec=False)
    platform = sim_platform()
    engine = te.TinyEngine(fixed_policy("in_graph"), platform=platform, late_shared_read=late)
    engine.capture()
    ref = engine.run(schedule, overlap=False)
    table = engine.state.req_to_token
    engine.state.reset()

    def poison(entry):
        if entry[0] == "record" and entry[3] == "in_graph":
            table.fill_(1)

    outs = []
    for step in schedule:
        engine.apply_writes(step)
        saved = table.clone()
        sim_impl(platform).listeners.append(poison)
        out = engine.runners[step.mode].run(step.batch)[: len(step.batch)].clone()
        sim_impl(platform).listeners.remove(poison)
        table.copy_(saved)
        outs.append(out)
    assert (te.compare(outs, ref) != []) is changed


def test_engine_policy_from_the_default_registry():
    platform = sim_platform()
    policy = te.resolve_policy("engine", platform, "fa3", "dflash")
    engine = te.TinyEngine(policy, platform=platform)
    engine.capture()
    assert engine.runners[ForwardMode.DECODE].policy_for(1).label == "in_graph"
    schedule = te.build_schedule(te.EXAMPLE_CONFIG, 30)
    assert te.compare(engine.run(schedule), engine.run(schedule, overlap=False)) == []


def test_example_main_runs_on_fake(capsys):
    assert te.main(["--device", "fake", "--steps", "20", "--policy", "post_replay"]) == 0
    out = capsys.readouterr().out
    assert "differing from the sequential reference: 0 of 20" in out


def test_tiny_config_buckets_are_per_mode():
    from warpolicy.testing.tiny_model import TinyPagedModel, TinyState, TinyWeights

    cfg = TinyConfig()
    model = TinyPagedModel(
        cfg, TinyWeights(cfg, torch.device("cpu")), TinyState(cfg, torch.device("cpu")), "verify"
    )
    assert tuple(model.bucket_sizes(ForwardMode.TARGET_VERIFY)) == cfg.verify_buckets
    assert tuple(model.bucket_sizes(ForwardMode.MIXED)) == ()
    assert list(model.shared_buffers) == ["req_to_token"]
