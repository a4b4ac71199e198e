"""The WAR canary on a real GPU: it catches what the graph walk cannot, then fails closed.

With the self-check off and the marker placement, every unsafe synthetic shape of the audit,
and a shape whose late reader goes through a pointer held in device memory (a Triton kernel:
invisible to the graph walk), runs overlapped with the scheduler's next writes racing it
(GPU spins widen the window: the forward is held at each launch so the host enqueues the step
and the writes first, and the graph spins after the release point). The canary checks every
step (rate 1). "The race fired" is judged independently: the step's output and the KV rows it
wrote differ from a sequential eager run. Each shape runs ``TRIALS`` fresh trials (a fresh
canary, runner and model each: a caught cell stays coarse for the rest of its process) of
``STEPS`` steps. Then ``10,000`` sampled steps of safe shapes (fp32 bitwise, and bf16 within a
declared tolerance) must raise no alarm, and the release lead must show what each barrier buys.

Run on the GPU box (about two minutes):
``PYTHONPATH=. python -m pytest -q -s -m cuda tests/gpu/test_canary_cuda.py``
(``WARPOLICY_CANARY_TRIALS`` / ``WARPOLICY_CANARY_SAFE_STEPS`` scale it). Each test prints one
``[canary cuda]`` line.
"""

from __future__ import annotations

import os
import time

import pytest
import torch
from gpu_support import NEEDS_CUDA

pytestmark = [*NEEDS_CUDA]

from canary_support import (  # noqa: E402
    UNSAFE_SHAPES,
    NamedFixed,
    ShapeTrial,
    reference_run,
    synthetic_model,
    synthetic_policy,
)

from warpolicy.audit.subject import make_stall, stalled_model  # noqa: E402
from warpolicy.audit.synthetic_model import SyntheticConfig, SyntheticModel  # noqa: E402
from warpolicy.registry.vocabulary import NONE, ForwardMode  # noqa: E402
from warpolicy.runtime.canary import Canary, CanaryConfig, Tolerance  # noqa: E402
from warpolicy.runtime.manager import new_plugin_manager, open_platform  # noqa: E402
from warpolicy.runtime.runners import DecodeRunner, OverlapLoop  # noqa: E402

TRIALS = int(os.environ.get("WARPOLICY_CANARY_TRIALS", "100"))
SAFE_STEPS = int(os.environ.get("WARPOLICY_CANARY_SAFE_STEPS", "10000"))
STEPS = 4  # per trial: the first races, the rest must run coarse and clean
BATCH = 4
STALL_US = 300.0  # in the graph: before the prep, and right after the marker
HEAD_STALL_US = 2000.0  # the forward held at each launch while the host enqueues step + writes
#: one bucket: a trial's capture is quick, and the race is always in that cell
CFG = SyntheticConfig(buckets={ForwardMode.DECODE: (BATCH,)})
POINTER = "pointer_late_read"


@pytest.fixture(scope="module")
def platform():
    pm = new_plugin_manager(load_entry_points=False, environ={})
    p = open_platform(pm, "cuda")
    if not p.external_events_supported():
        pytest.skip("this torch has no external events")
    return p


# -- a late reader the graph walk cannot see: a pointer held in device memory -------------------


def pointer_model_factory():
    """A synthetic model (default layout) whose forward, after the marker, gathers each token's
    KV slot from ``req_to_token`` through a Triton kernel that loads the table's address from an
    int64 tensor in device memory: the kernel's arguments hold only that tensor's address, so
    the graph walk never sees ``req_to_token`` read late."""
    triton = pytest.importorskip("triton")
    tl = pytest.importorskip("triton.language")

    @triton.jit
    def gather_through_pointer(holder_ptr, index_ptr, out_ptr, n, block: tl.constexpr):  # type: ignore[name-defined]  # Triton reads the annotation
        table = tl.load(holder_ptr).to(tl.pointer_type(tl.int64))
        offs = tl.arange(0, block)
        mask = offs < n
        index = tl.load(index_ptr + offs, mask=mask, other=0)
        tl.store(out_ptr + offs, tl.load(table + index, mask=mask, other=0), mask=mask)

    class PointerLateRead(SyntheticModel):
        def __init__(self, layout, cfg, device) -> None:
            super().__init__(layout, cfg, device)
            self.holder = torch.tensor(
                [self.req_to_token.data_ptr()], dtype=torch.int64, device=self.device
            )
            self.late_slots: dict[int, torch.Tensor] = {}

        def forward(self, bucket: int) -> torch.Tensor:
            s = self.static[bucket]
            slots = self.late_slots.get(bucket)
            if slots is None:
                slots = self.late_slots[bucket] = torch.zeros(
                    bucket, dtype=torch.int64, device=self.device
                )
            block = triton.next_power_of_2(bucket)
            gather_through_pointer[(1,)](self.holder, s.flat, slots, bucket, block=block)
            out = super().forward(bucket)
            out.add_(1e-3 * slots.to(out.dtype).unsqueeze(1))
            return out

    def factory(platform, cfg):
        from warpolicy.audit.synthetic_model import Layout

        return PointerLateRead(Layout(), cfg or CFG, platform.device)

    return factory


# -- detection --------------------------------------------------------------------------------


def detection(platform, name, model_factory=None, policy=None):
    """Trials of one shape: (race fired on a sampled step, caught there, flagged without a
    fired race, corrupted after the demotion, steps after the demotion, demoted trials)."""
    stall = make_stall(platform, STALL_US)
    head = make_stall(platform, HEAD_STALL_US)
    reference, slots = reference_run(name, platform, STEPS, BATCH, CFG, model_factory)
    fired_sampled = caught = false_flags = corrupted_after = after_steps = demoted = 0
    for _ in range(TRIALS):
        trial = ShapeTrial(
            name,
            platform,
            slots,
            BATCH,
            cfg=CFG,
            stall=stall,
            head_stall=head,
            model_factory=model_factory,
            policy=policy,
        )
        fired, after = trial.judge(reference, exact=False)
        first = trial.flagged[0] if trial.flagged else STEPS
        sampled_fired = [k for k in fired if k <= first]  # rate 1: sampled until demoted
        fired_sampled += len(sampled_fired)
        caught += sum(1 for k in trial.flagged if k in fired)
        false_flags += sum(1 for k in trial.flagged if k not in fired)
        corrupted_after += len(after)
        after_steps += STEPS - 1 - first if trial.flagged else 0
        demoted += trial.policy_after is NONE
    return fired_sampled, caught, false_flags, corrupted_after, after_steps, demoted


def report(name, fired, caught, false_flags, corrupted_after, after_steps, demoted, started):
    rate = 100.0 * caught / fired if fired else float("nan")
    print(
        f"\n[canary cuda] {name}: race fired on {fired} sampled steps, caught {caught} "
        f"({rate:.1f}%), flagged without a fired race {false_flags}, corrupted after the "
        f"demotion {corrupted_after}/{after_steps} steps, demoted in {demoted}/{TRIALS} "
        f"trials ({TRIALS} trials x {STEPS} steps, {time.perf_counter() - started:.1f} s)"
    )


def check(name, fired, caught, false_flags, corrupted_after, after_steps, demoted):
    assert fired >= TRIALS // 2, f"{name}: the race fired on only {fired} steps; widen the stalls"
    assert caught >= 0.99 * fired, f"{name}: caught {caught} of {fired}"
    assert corrupted_after == 0, f"{name}: {corrupted_after} corrupted steps after the demotion"
    assert demoted == caught + false_flags  # every flag demoted its cell


@pytest.mark.parametrize("name", UNSAFE_SHAPES)
def test_every_unsafe_shape_is_caught_where_its_race_fires(platform, name):
    started = time.perf_counter()
    result = detection(platform, name)
    report(name, *result, started)
    check(name, *result)


def test_a_late_reader_through_a_device_pointer_is_caught(platform):
    factory = pointer_model_factory()
    policy = synthetic_policy("in_graph", platform)
    # the walk cannot see it: with the self-check on, the marker is confirmed (not refuted)
    model = factory(platform, CFG)
    checked = DecodeRunner(model, policy, platform, name="pointer-walked", self_check="warn")
    checked.capture()
    walk = checked.capture_report[BATCH]
    started = time.perf_counter()
    result = detection(platform, POINTER, factory, policy)
    report(POINTER, *result, started)
    print(
        f"[canary cuda] {POINTER}: the marker self-check "
        f"{'ran: ' + ('confirmed' if walk.ok else 'REFUTED') if walk.walked else 'did not run'}"
        f" ({walk.detail}); policy after capture {checked.policy_for(BATCH).label}"
    )
    check(POINTER, *result)
    if walk.walked:
        assert walk.ok, f"the walk saw the pointer reader after all: {walk.detail}"


# -- no false alarm -------------------------------------------------------------------------------


def test_no_false_positive_over_ten_thousand_sampled_safe_steps(platform):
    """Safe shapes, overlapped with the same racing schedule, every step checked: fp32 in-graph
    and snapshot backends bitwise, a bf16 forward within a declared tolerance."""
    started = time.perf_counter()
    stall = make_stall(platform, 20.0)
    runs = (
        ("in_graph", CFG, None, 4 * SAFE_STEPS // 10),
        ("pre_replay_snapshot", CFG, None, 3 * SAFE_STEPS // 10),
        (
            "in_graph",
            SyntheticConfig(buckets={ForwardMode.DECODE: (BATCH,)}, dtype=torch.bfloat16),
            Tolerance(atol=1e-2, rtol=1e-2),
            SAFE_STEPS - 7 * SAFE_STEPS // 10,
        ),
    )
    checked = flagged = fired_total = 0
    parts = []
    for name, cfg, tolerance, steps in runs:
        reference, slots = reference_run(name, platform, steps, BATCH, cfg)
        trial = ShapeTrial(name, platform, slots, BATCH, cfg=cfg, stall=stall, tolerance=tolerance)
        fired, _ = trial.judge(reference, exact=False)
        fired_total += len(fired)
        checked += trial.canary.stats["checked"]
        flagged += len(trial.flagged)
        dtype = "bf16 tol" if tolerance is not None else "fp32 bitwise"
        parts.append(f"{name} {dtype} {trial.canary.stats['checked']}")
    print(
        f"\n[canary cuda] false positives: {flagged} of {checked} sampled safe steps "
        f"({', '.join(parts)}); race fired {fired_total} (must be 0); "
        f"{time.perf_counter() - started:.1f} s"
    )
    assert checked >= SAFE_STEPS and flagged == 0 and fired_total == 0


# -- the release lead -----------------------------------------------------------------------------


def test_the_release_lead_shows_what_each_barrier_buys(platform):
    """A spin after the marker (``STALL_US``) is forward time the in-graph release leads by; a
    post-replay or coarse release leads by about nothing."""
    leads = {}
    for policy in ("in_graph", "post_replay", "none"):
        model = synthetic_model("in_graph", platform, CFG)
        canary = Canary(platform, CanaryConfig(lead_rate=1.0, seed=0))
        runner = DecodeRunner(
            stalled_model(model, make_stall(platform, STALL_US)),
            NamedFixed(policy),
            platform,
            name=policy,
            canary=canary,
        )
        runner.capture()
        loop = OverlapLoop(runner)
        batch = model.make_batch(ForwardMode.DECODE, 0)
        for _ in range(40):
            loop.step(batch, None)
        loop.drain()
        (summary,) = canary.leads.values()
        leads[policy] = summary
    line = ", ".join(f"{p} median {s.median_us:.1f} us (n={s.count})" for p, s in leads.items())
    print(f"\n[canary cuda] release lead with a {STALL_US:g} us spin after the marker: {line}")
    assert leads["in_graph"].median_us > 0.5 * STALL_US
    assert leads["none"].median_us < 0.1 * STALL_US
    assert leads["post_replay"].median_us < 0.1 * STALL_US
