"""GPU (issue 21 item 5): a per-batch declaration is safe where its action ran and coarse where
it did not. The synthetic prefill (`warpolicy.audit.synthetic_perbatch_model`) builds its
snapshot only above a threshold of query tokens (declared like DeepSeek-V4's sparse prefill:
``perbatch_prefill`` in `warpolicy.audit.synthetic_perbatch`); the dynamic audit (GPU stalls,
the scheduler's poison at the release) runs batches on both sides of the threshold:

* ``honest`` action (copies, then True): SAFE in every run, 0 corrupted trials, every bucket
  replayed and published ``pre_replay``;
* ``lying`` mutant (True without copying): UNSAFE, the race observed;
* ``failing`` action (False): the big bucket publishes nothing (coarse), the small ones
  ``pre_replay``;
* captured outputs equal the eager ones (to float32 rounding; bitwise on the CPU twin).

Each case prints one ``[perbatch cuda] ...`` line for the notes. The CPU twin is
tests/audit/test_synthetic_perbatch.py.
"""

from __future__ import annotations

import time

import pytest
import torch
from gpu_support import NEEDS_CUDA

from warpolicy.audit import Verdict, audit_mode
from warpolicy.audit.synthetic_perbatch import THRESHOLD
from warpolicy.audit.synthetic_perbatch_model import (
    PERBATCH_BUCKETS,
    make_perbatch,
    perbatch_config,
)
from warpolicy.bench.timing import scheduler_work
from warpolicy.registry.vocabulary import ForwardMode, WarReadDonePolicy
from warpolicy.runtime.policy import fixed_policy
from warpolicy.runtime.runners import OverlapLoop, PrefillRunner

pytestmark = [*NEEDS_CUDA]

EXTEND = ForwardMode.EXTEND
P = WarReadDonePolicy
TRIALS = 48  # 16 per bucket: two below or at the threshold, one above
RUNS = 2  # "in every run": the whole audit is repeated


def _line(case: str, text: str) -> None:
    print(f"[perbatch cuda] {case}: {text}")


def test_the_honest_snapshot_is_safe_on_both_sides_of_the_threshold():
    for run in range(RUNS):
        subject = make_perbatch(device="cuda", action="honest")
        entry = audit_mode(subject, EXTEND, trials=TRIALS, static=False)
        dyn = entry.dynamic
        plugin = subject.model.plugin
        _line(
            f"honest run {run}",
            f"{dyn.summary()} ({dyn.caught_line() or 'no poison caught'}); buckets "
            f"{list(PERBATCH_BUCKETS)}, threshold {THRESHOLD}; snapshots {plugin.performed}; "
            f"published {entry.policy.label if entry.policy is not None else None}",
        )
        assert dyn.verdict is Verdict.SAFE, dyn.reason
        assert dyn.trials == TRIALS and dyn.corrupted == 0
        assert plugin.performed == plugin.answered > 0  # the big bucket only, every step


def test_a_snapshot_that_reports_true_without_copying_is_caught():
    for run in range(RUNS):
        subject = make_perbatch(device="cuda", action="lying")
        entry = audit_mode(subject, EXTEND, trials=TRIALS, static=False)
        dyn = entry.dynamic
        _line(
            f"lying run {run}",
            f"{dyn.summary()} ({dyn.caught_line()}); first: {dyn.first}",
        )
        assert dyn.verdict is Verdict.UNSAFE, dyn.reason
        assert dyn.first is not None
        assert subject.model.plugin.performed == 0


def _each_bucket(subject, captured=True):
    runner = subject.runners[EXTEND](subject.model)
    if captured:
        runner.capture()
    published, outputs = [], []
    for trial in range(2 * len(PERBATCH_BUCKETS)):
        batch = subject.make_batch(EXTEND, trial)
        out = runner.run(batch)
        taken = runner.fence.take()
        torch.cuda.synchronize()
        if taken is not None:
            taken.discard()
        published.append((runner.last_step.bucket, None if taken is None else taken.policy))
        outputs.append(out[: batch.shape[0]].clone())
    return published, outputs


def test_a_failed_snapshot_is_coarse_for_the_big_bucket_only():
    subject = make_perbatch(device="cuda", action="failing")
    published, _ = _each_bucket(subject)
    _line("failing", f"published per (bucket, policy): {published}")
    expected = [(b, P.PRE_REPLAY if b <= THRESHOLD else None) for b in PERBATCH_BUCKETS]
    assert published == expected * 2


@pytest.mark.parametrize("action", ["honest", "failing"])
def test_captured_outputs_equal_the_eager_reference(action):
    _, got = _each_bucket(make_perbatch(device="cuda", action=action))
    _, want = _each_bucket(make_perbatch(device="cuda", action=action), captured=False)
    worst = max(float((a - b).abs().max()) for a, b in zip(got, want))
    _line(f"eager reference ({action})", f"{len(got)} batches, max |captured - eager| {worst}")
    # the same kernels captured or not; allow for a library choosing another algorithm in a graph
    assert all(torch.allclose(a, b, rtol=1e-5, atol=1e-6) for a, b in zip(got, want))


def test_overlap_figures_for_the_per_batch_prefill():
    """Not a timed assertion: the overlap the per-batch release buys on this shape. Steps
    alternate the buckets (two dense, one sparse that needs the snapshot); the scheduler's
    bookkeeping is a ~300 us pinned upload (`bench.timing.scheduler_work("copy")`). Rows:
    coarse (policy none), per batch (pre_replay, the sparse bucket after its snapshot), no
    barrier (the unsafe bound). Prints us/step and the share of the coarse-to-no-barrier gap
    the per-batch release closes."""
    config = perbatch_config(hidden=2048, layers=16, layer_rows=2048, dtype=torch.bfloat16)
    subject = make_perbatch(device="cuda", action="honest", config=config)
    platform, model = subject.platform, subject.model
    per_batch = subject.runners[EXTEND](model)
    per_batch.capture()
    coarse = PrefillRunner(model, fixed_policy("none"), platform, "coarse")
    coarse.capture()
    batches = [subject.make_batch(EXTEND, k) for k in range(60)]
    work = scheduler_work("copy", 300.0, torch.device("cuda"))
    rows = {}
    for name, runner, skip in (
        ("coarse", coarse, False),
        ("per_batch", per_batch, False),
        ("no_barrier", per_batch, True),
    ):
        loop = OverlapLoop(runner, platform, unsafe_skip_barrier=skip)
        for batch in batches[:10]:  # warm-up
            loop.step(batch, work)
        loop.drain()
        torch.cuda.synchronize()
        start = time.perf_counter()
        for batch in batches[10:]:
            loop.step(batch, work)
        loop.drain()
        torch.cuda.synchronize()
        rows[name] = (time.perf_counter() - start) / (len(batches) - 10) * 1e6
    gap = rows["coarse"] - rows["no_barrier"]
    closed = (rows["coarse"] - rows["per_batch"]) / gap if gap > 0 else float("nan")
    _line(
        "overlap",
        f"coarse {rows['coarse']:.1f} us/step, per batch {rows['per_batch']:.1f}, no barrier "
        f"{rows['no_barrier']:.1f}: gap closed {closed:.1%} (snapshots "
        f"{model.plugin.performed})",
    )
    assert rows["per_batch"] > 0
