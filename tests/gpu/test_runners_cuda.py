"""GPU: the example engine under every sound policy, every step identical to a sequential
reference; and a short overlap benchmark with zero corrupted steps for the sound policies."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
from gpu_support import NEEDS_CUDA

pytestmark = [*NEEDS_CUDA]

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "tiny_engine.py"


@pytest.fixture(scope="module")
def te():
    spec = importlib.util.spec_from_file_location("tiny_engine_example_cuda", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _platform():
    from warpolicy.runtime.manager import new_plugin_manager, open_platform

    return open_platform(new_plugin_manager(load_entry_points=False, environ={}), "cuda")


@pytest.mark.parametrize("policy", ["in_graph", "post_replay", "none", "engine"])
def test_example_engine_matches_sequential_reference(te, policy):
    from warpolicy.registry.vocabulary import ForwardMode

    platform = _platform()
    engine = te.TinyEngine(te.resolve_policy(policy, platform, "fa3", "dflash"), platform=platform)
    engine.capture()
    decode = engine.runners[ForwardMode.DECODE]
    if policy in ("in_graph", "engine"):
        assert all(cb.planted for cb in decode.captured.values())  # a real in-graph node
        assert decode.policy_for(decode.buckets[0]).label == "in_graph"
    schedule = te.build_schedule(engine.cfg, 400, seed=1)
    ref = engine.run(schedule, overlap=False)
    for _ in range(3):
        assert te.compare(engine.run(schedule), ref) == []


def test_example_engine_force_coarse_matches_reference(te):
    platform = _platform()
    engine = te.TinyEngine(
        te.resolve_policy("in_graph", platform, "fa3", "none"), platform=platform
    )
    engine.capture()
    schedule = te.build_schedule(engine.cfg, 200, seed=2)
    assert (
        te.compare(engine.run(schedule, force_coarse=True), engine.run(schedule, overlap=False))
        == []
    )


def test_overlap_bench_small_sound_policies_never_corrupt():
    from warpolicy.bench.overlap import format_overlap, run_overlap_bench

    result = run_overlap_bench(layers=4, batch=16, steps=40, repeats=1)
    print(format_overlap(result))
    assert result["targets"]["sound_policies_zero_corrupted"]
    by = {r["name"]: r for r in result["rows"]}
    assert by["in_graph"]["resolved"] == "in_graph"
