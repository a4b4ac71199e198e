"""GPU: the hybrid decode (`warpolicy.bench.hybrid`) with one read-done per buffer class.

The oracle is a sequential run (writes, then the step, on one stream), never the fence: with
per-class events every overlapped step equals it; a declaration that omits the recurrent
class races the scheduler's recurrent-state writes and the WAR canary (checking every step)
catches it in every trial, then fails closed (the bucket coarse, later steps clean).

``PYTHONPATH=. python -m pytest -q -s -m cuda tests/gpu/test_hybrid_cuda.py`` prints one
``[hybrid cuda]`` line per test.
"""

from __future__ import annotations

import os

import attrs
import pytest
import torch
from gpu_support import NEEDS_CUDA

pytestmark = [*NEEDS_CUDA]

from warpolicy.bench.hybrid import DECLARED_CLASSES, HybridConfig, HybridDecode  # noqa: E402
from warpolicy.registry.vocabulary import IN_GRAPH  # noqa: E402
from warpolicy.runtime.canary import Canary, CanaryConfig  # noqa: E402
from warpolicy.runtime.manager import new_plugin_manager, open_platform  # noqa: E402
from warpolicy.runtime.release import class_policy_fns  # noqa: E402
from warpolicy.runtime.runners import DecodeRunner, OverlapLoop  # noqa: E402

TRIALS = int(os.environ.get("WARPOLICY_HYBRID_TRIALS", "10"))
STEPS = 24
#: the canary's run is longer: its checks slow the scheduler, so races come less often per step
#: (an H100 caught 8 of 10 trials in 24 steps)
CANARY_STEPS = 96
CFG = HybridConfig(layers=8, batch=16, ctx=128, hidden=512, ffn=2048)


@pytest.fixture(scope="module")
def platform():
    return open_platform(new_plugin_manager(load_entry_points=False, environ={}), "cuda")


def sequential(platform, model, runner, steps):
    outs = []
    for k in range(steps):
        batch = model.make_batch(runner.mode, k)
        outs.append(runner.run(batch).clone())
        taken = runner.fence.take()
        platform.synchronize()  # the host waits for everything instead: the event is free again
        if taken is not None:
            taken.discard()
    return outs


def overlapped(platform, model, runner, steps, per_class):
    loop = OverlapLoop(runner)
    model.make_batch(runner.mode, 0)
    platform.synchronize()
    outs = []
    for k in range(steps):
        nxt = k + 1
        if per_class:
            writes = (
                [(c, lambda c=c, n=nxt: model.write_class(c, n)) for c in model.write_classes()]
                if nxt < steps
                else []
            )
            out = loop.step(model.batch_of(k), class_writes=writes or [("metadata", lambda: None)])
        else:

            def write_next(n=nxt):
                if n < steps:
                    for c in model.write_classes():
                        model.write_class(c, n)

            out = loop.step(model.batch_of(k), write_next)
        outs.append(out.clone())
    loop.drain()
    return outs


def fresh(platform, classes, per_class, canary=None, seed=0, self_check="warn"):
    device = platform.device if platform.name == "cuda" else "cpu"
    model = HybridDecode(attrs.evolve(CFG, seed=seed), device)
    cell, per = class_policy_fns(classes)
    runner = DecodeRunner(
        model,
        cell,
        platform,
        class_policies=per if per_class else None,
        canary=canary,
        self_check=self_check,
    )
    runner.capture()
    return model, runner


def test_per_class_events_match_the_sequential_reference(platform):
    corrupted = checked = 0
    for trial in range(TRIALS):
        model, runner = fresh(platform, DECLARED_CLASSES, True, seed=trial)
        state = {n: t.clone() for n, t in model.shared_buffers.items()}
        ref = sequential(platform, model, runner, STEPS)
        for n, t in model.shared_buffers.items():
            t.copy_(state[n])
        outs = overlapped(platform, model, runner, STEPS, per_class=True)
        corrupted += sum(not torch.equal(a, b) for a, b in zip(outs, ref))
        checked += len(outs)
    print(f"[hybrid cuda] per-class events: {corrupted}/{checked} corrupted steps")
    assert corrupted == 0


def test_omitting_the_recurrent_class_corrupts_and_the_canary_catches_it(platform):
    raced = caught = 0
    for trial in range(TRIALS):
        # the independent oracle: the same trial without the canary against a sequential run
        # the self-check off: with it on, the walk sees the recurrent reads and demotes it
        model, runner = fresh(platform, {"metadata": IN_GRAPH}, False, seed=trial, self_check="off")
        state = {n: t.clone() for n, t in model.shared_buffers.items()}
        ref = sequential(platform, model, runner, STEPS)
        for n, t in model.shared_buffers.items():
            t.copy_(state[n])
        outs = overlapped(platform, model, runner, STEPS, per_class=False)
        raced += any(not torch.equal(a, b) for a, b in zip(outs, ref))
        canary = Canary(platform, CanaryConfig(rate=1.0, seed=trial))
        model, runner = fresh(
            platform, {"metadata": IN_GRAPH}, False, canary=canary, seed=trial, self_check="off"
        )
        overlapped(platform, model, runner, CANARY_STEPS, per_class=False)
        caught += canary.stats["violations"] > 0 and bool(runner.demoted)
    print(
        f"[hybrid cuda] omitted recurrent_state: raced in {raced}/{TRIALS} trials, canary "
        f"caught {caught}/{TRIALS}"
    )
    assert raced == TRIALS
    assert caught == TRIALS


def test_with_the_self_check_on_the_omitted_class_is_demoted_at_capture(platform):
    import warnings

    from warpolicy.registry.vocabulary import POST_REPLAY

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the demotion warning is the point
        _model, runner = fresh(platform, {"metadata": IN_GRAPH}, False)
    policies = {cb.policy for cb in runner.captured.values()}
    print(
        f"[hybrid cuda] omitted recurrent_state with the self-check on: {sorted(p.label for p in policies)}"
    )
    assert policies == {POST_REPLAY}
