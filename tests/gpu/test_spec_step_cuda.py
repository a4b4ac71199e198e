"""Speculative steps on a real GPU: which phase's read-done event the scheduler may wait on.

EAGLE-like three-phase step (draft decode, target verify, draft extend): the draft extend
spins, then rereads ``req_to_token`` after verify. The scheduler (`OverlapLoop`) writes the
next step's table rows on the schedule stream as soon as the barrier allows. Handing out
verify's in-graph event (the negative control) must corrupt most trials; the step's own choice
(the draft extend's event, the EAGLE family's last reader) must corrupt none. DFlash-like
two-phase step (draft, verify): verify is the last reader and releases from inside its graph
with no corruption; a verify that rereads the table after its marker is caught (positive
control for that shape). Counts are printed for the notes.

Run on the GPU box: ``PYTHONPATH=. python -m pytest -q -s -m cuda tests/gpu/test_spec_step_cuda.py``.
"""

from __future__ import annotations

import pytest
import torch
from gpu_support import NEEDS_CUDA

pytestmark = [*NEEDS_CUDA]

from warpolicy.registry.engine import PolicyEngine  # noqa: E402
from warpolicy.registry.vocabulary import IN_GRAPH, NONE, POST_REPLAY, ForwardMode  # noqa: E402
from warpolicy.runtime.manager import new_plugin_manager, open_platform  # noqa: E402
from warpolicy.runtime.policy import fixed_policy  # noqa: E402
from warpolicy.runtime.runners import (  # noqa: E402
    DecodeRunner,
    DraftExtendRunner,
    OverlapLoop,
    SpecStep,
    VerifyRunner,
)

ROWS, CTX, BATCH = 512, 64, 32
SPIN_CYCLES = 2_000_000  # ~1 ms on an H200: the late reader is still pending at the release
TABLES = 4
TRIALS = 60
VERIFY, DRAFT_EXTEND = ForwardMode.TARGET_VERIFY, ForwardMode.DRAFT_EXTEND


class PhaseModel:
    """One phase's adapter: gathers ``req_to_token`` rows by a fixed request index.

    ``spin_before_read`` delays the gather inside the graph (a reader late in the step);
    ``late_read`` gathers again after the marker (a reread the marker does not cover);
    ``tail_spin`` is work after the marker (what an early release overlaps).
    """

    def __init__(
        self,
        table: torch.Tensor,
        index: torch.Tensor,
        *,
        spin_before_read: int = 0,
        late_read: bool = False,
        tail_spin: int = 0,
    ) -> None:
        self.table, self.index = table, index
        self.shared_buffers = {"req_to_token": table}
        self.spin_before_read, self.late_read, self.tail_spin = (
            spin_before_read,
            late_read,
            tail_spin,
        )
        self.out: dict[int, torch.Tensor] = {}

    def bucket_sizes(self, mode):
        return (BATCH,)

    def batch_size(self, batch):
        return BATCH

    def prepare_bucket(self, bucket):
        self.out.setdefault(bucket, torch.zeros(bucket, CTX, dtype=torch.long, device="cuda"))

    def host_prep(self, batch, bucket):
        pass  # the scheduler wrote this step's rows into the shared table

    def graph_prep(self, bucket):
        if self.spin_before_read:
            torch.cuda._sleep(self.spin_before_read)
        torch.index_select(self.table, 0, self.index[:bucket], out=self.out[bucket])

    def forward(self, bucket):
        if self.tail_spin:
            torch.cuda._sleep(self.tail_spin)
        if self.late_read:
            torch.cuda._sleep(SPIN_CYCLES)
            torch.index_select(self.table, 0, self.index[:bucket], out=self.out[bucket])
        return self.out[bucket]


@pytest.fixture
def platform():
    p = open_platform(new_plugin_manager(load_entry_points=False, environ={}), "cuda")
    if not p.external_events_supported():
        pytest.skip("this torch has no external events")
    return p


@pytest.fixture
def engine():
    return PolicyEngine.load(environ={})


def state():
    g = torch.Generator().manual_seed(0)
    tables = [torch.randint(0, 1 << 20, (ROWS, CTX), generator=g).cuda() for _ in range(TABLES)]
    index = torch.randperm(ROWS, generator=g)[:BATCH].cuda()
    return tables, index, tables[0].clone()


def run_trials(platform, step: SpecStep, tables, index, table, trials: int = TRIALS):
    """Overlapped steps; returns (corrupted trials, barrier kinds, handed-out sources)."""
    p = platform
    table.copy_(tables[0])
    p.synchronize()
    fwd = p.new_stream()
    loop = OverlapLoop(platform=p, forward_stream=fwd)
    results, kinds, sources = [], set(), set()
    for k in range(trials):

        def write_next(k: int = k) -> None:  # the next step's rows, as early as allowed
            table.copy_(tables[(k + 1) % TABLES])

        outs = loop.step(None, write_next, runner=step)
        with p.stream(fwd):
            results.append([o.clone() for o in outs])
        kinds.add(loop.last_barrier)
        rd = loop.last_read_done
        sources.add(None if rd is None else (rd.source, rd.policy))
    loop.drain()
    corrupted = 0
    for k, outs in enumerate(results):
        expected = tables[k % TABLES].index_select(0, index)
        corrupted += any(not torch.equal(o, expected) for o in outs)
    return corrupted, kinds, sources


def eagle_phases(platform, index, table, verify_policy, extend_policy="post_replay"):
    return [
        DecodeRunner(PhaseModel(table, index), fixed_policy("in_graph"), platform, name="draft"),
        VerifyRunner(
            PhaseModel(table, index),
            fixed_policy(verify_policy),
            platform,
            name="verify",
            draft_tokens=1,
        ),
        # a draft backend that declares draft_extend post_replay: its event is real
        DraftExtendRunner(
            PhaseModel(table, index, spin_before_read=SPIN_CYCLES),
            fixed_policy(extend_policy),
            platform,
            name="draft_extend",
        ),
    ]


def test_eagle_like_step_releases_after_the_draft_extend(platform, engine):
    tables, index, table = state()
    phases = eagle_phases(platform, index, table, "in_graph")
    # negative control: the scheduler waits on verify's in-graph event while the draft extend,
    # which reads the rows after it, wrongly declares it reads nothing (``none`` would be
    # unknown, a reader: the step coarse, issue 26)
    undeclared = eagle_phases(platform, index, table, "in_graph", "nothing")
    wrong = SpecStep(undeclared, last_reader=VERIFY, name="verify_release")
    wrong.capture()
    bad, bad_kinds, bad_sources = run_trials(platform, wrong, tables, index, table)
    # the phase step's choice from the registry (EAGLE family: the last phase, draft extend)
    right = SpecStep.for_algorithm(phases, engine.spec("eagle"))
    good, kinds, sources = run_trials(platform, right, tables, index, table)
    print(
        f"\n[spec step cuda] eagle-like, verify's event (negative control): corrupted "
        f"{bad}/{TRIALS}"
    )
    print(
        f"[spec step cuda] eagle-like, phase step's choice ({right.reader.name}): corrupted "
        f"{good}/{TRIALS}"
    )
    assert bad_kinds == {"event"} and bad_sources == {("verify", IN_GRAPH)}
    assert bad > TRIALS // 2  # the control must fail most trials
    assert right.reader.mode is DRAFT_EXTEND
    assert kinds == {"event"} and sources == {("draft_extend", POST_REPLAY)}
    assert good == 0


# verify's cell reads draft_extend_staged and no action plugin is registered here: said once
@pytest.mark.filterwarnings("ignore:.*no warpolicy_batch_action implementation:RuntimeWarning")
def test_eagle_like_step_under_the_default_registry_is_coarse_and_clean(platform, engine):
    """The default registry: verify publishes nothing for EAGLE, draft extend is unknown."""
    tables, index, table = state()
    compiled = engine.compile("fa3", "eagle")
    phases = [
        DecodeRunner(PhaseModel(table, index), compiled, platform, name="draft"),
        VerifyRunner(PhaseModel(table, index), compiled, platform, name="verify", draft_tokens=1),
        DraftExtendRunner(
            PhaseModel(table, index, spin_before_read=SPIN_CYCLES),
            compiled,
            platform,
            name="draft_extend",
        ),
    ]
    step = SpecStep.for_algorithm(phases, engine.spec("eagle"))
    step.capture()
    corrupted, kinds, sources = run_trials(platform, step, tables, index, table, trials=20)
    print(f"\n[spec step cuda] eagle-like, default registry (coarse): corrupted {corrupted}/20")
    assert kinds == {"coarse"} and sources == {None} and corrupted == 0
    # verify's cell reads draft_extend_staged (per batch): no stager ran, so every step decided
    # none there (its bucket is captured for the earliest, in_graph, and never publishes it)
    assert step.phases[1].runner.last_step.decided is NONE


@pytest.mark.parametrize("late_read", [False, True])
def test_dflash_like_step_releases_in_verify_graph(platform, engine, late_read):
    tables, index, table = state()
    compiled = engine.compile("fa3", "dflash")  # decode and verify in_graph under DFlash
    # The positive control turns the capture self-check off: with it on, the runner itself
    # demotes the late-reading verify bucket to post_replay (checked below).
    phases = [
        DecodeRunner(PhaseModel(table, index), compiled, platform, name="draft"),
        VerifyRunner(
            PhaseModel(table, index, tail_spin=SPIN_CYCLES, late_read=late_read),
            compiled,
            platform,
            name="verify",
            draft_tokens=1,
            self_check="off" if late_read else "warn",
        ),
    ]
    step = SpecStep.for_algorithm(phases, engine.spec("dflash"))
    step.capture()
    assert all(cb.planted for cb in phases[1].captured.values())
    corrupted, kinds, sources = run_trials(platform, step, tables, index, table)
    what = "verify rereads after its marker (positive control)" if late_read else "in-graph"
    print(f"\n[spec step cuda] dflash-like, {what}: corrupted {corrupted}/{TRIALS}")
    assert kinds == {"event"} and sources == {("verify", IN_GRAPH)}
    if late_read:
        assert corrupted > 0  # the trial can fail
        checked = VerifyRunner(
            PhaseModel(table, index, tail_spin=SPIN_CYCLES, late_read=True),
            compiled,
            platform,
            name="verify-checked",
            draft_tokens=1,
        )
        with pytest.warns(RuntimeWarning, match="demoted to post_replay"):
            checked.capture()
        assert checked.policy_for(BATCH) is POST_REPLAY  # the self-check caught the late read
    else:
        assert corrupted == 0


def test_audit_refutes_the_verify_release_of_an_eagle_like_step(platform):
    """``warpolicy audit`` on a phase step: a factory's builder returns a `SpecStep`. The draft
    extend reads shared rows after verify: wrongly declared ``nothing`` there, the
    verify release races and the audit says UNSAFE; declaring ``post_replay`` there moves the
    step's release after it (issue 17 class 12: never an earlier one), and nothing races."""
    from warpolicy.audit.dynamic import AuditSubject, audit_mode
    from warpolicy.audit.report import SAFE, UNSAFE
    from warpolicy.audit.subject import stalled_model

    tables, index, table = state()

    class Shared:
        shared_buffers = {"req_to_token": table}

    def subject(reader, verify_policy, extend_policy="post_replay"):
        def build(model):
            stall = getattr(model, "stall", None)  # the audit's race-window stall, per phase
            phases = eagle_phases(platform, index, table, verify_policy, extend_policy)
            for runner in phases:
                if stall is not None:
                    runner.model = stalled_model(runner.model, stall)
            return SpecStep(phases, last_reader=reader)

        declared = {VERIFY: IN_GRAPH, DRAFT_EXTEND: POST_REPLAY}[reader]
        return AuditSubject(
            f"eagle_like_{reader.label}",
            Shared(),
            {reader: build},
            lambda mode, trial: None,
            platform,
            declared={reader: declared},
            spec="eagle",
        )

    unsafe = audit_mode(subject(VERIFY, "in_graph", "nothing"), VERIFY, trials=50, static=False)
    safe = audit_mode(subject(DRAFT_EXTEND, "in_graph"), DRAFT_EXTEND, trials=50, static=False)
    with pytest.warns(RuntimeWarning, match="so it reads shared state"):
        moved = audit_mode(subject(VERIFY, "in_graph"), VERIFY, trials=50, static=False)
    print(
        f"[spec step cuda] verify declared last, draft extend publishing: "
        f"{moved.dynamic.verdict.value} ({moved.dynamic.corrupted}/{moved.dynamic.trials})"
    )
    assert moved.dynamic.corrupted == 0 and moved.policy is POST_REPLAY
    print(
        f"\n[spec step cuda] audit eagle-like verify release: {unsafe.dynamic.verdict.value} "
        f"({unsafe.dynamic.corrupted}/{unsafe.dynamic.trials}); draft-extend release: "
        f"{safe.dynamic.verdict.value} ({safe.dynamic.corrupted}/{safe.dynamic.trials})"
    )
    assert unsafe.dynamic.verdict == UNSAFE
    assert safe.dynamic.verdict == SAFE
