"""Speculative steps as phases on the simulated platform: the draft-extend runner's publish
points, the step's mailbox clearing, the last-reader choice, failure of any phase falling back
to coarse, the overlap loop and the audit running a phase step."""

from __future__ import annotations

import warnings
from types import SimpleNamespace

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from warpolicy.bench.command import render
from warpolicy.errors import InputError
from warpolicy.registry.model import SpecAlgorithm
from warpolicy.registry.vocabulary import IN_GRAPH, NONE, POST_REPLAY, PRE_REPLAY, ForwardMode
from warpolicy.runtime.policy import fixed_policy
from warpolicy.runtime.runners import (
    DecodeRunner,
    DraftExtendRunner,
    OverlapLoop,
    Phase,
    SpecStep,
    VerifyRunner,
    last_reader_of,
)
from warpolicy.testing import sim_impl, sim_platform

DECODE, VERIFY, DRAFT_EXTEND = (
    ForwardMode.DECODE,
    ForwardMode.TARGET_VERIFY,
    ForwardMode.DRAFT_EXTEND,
)


def _declared_last_readers() -> dict:
    """Every spec algorithm of the default registry that declares ``last_reader:``."""
    from warpolicy.registry.loader import default_registry_path, load_registry

    registry = load_registry([default_registry_path()])
    return {
        n: s.last_reader for n, s in registry.spec_algorithms.items() if s.last_reader is not None
    }


#: The last shared reader each algorithm declares in capabilities.yaml.
INTENDED_LAST_READERS = _declared_last_readers()


class TableModel:
    """A phase's adapter: static input ``x``; the in-graph prep reads the shared ``table``;
    output ``x * scale + table[:bucket]``."""

    def __init__(
        self, table: torch.Tensor, scale: float = 1.0, buckets=(1, 2, 4, 8), fail: bool = False
    ) -> None:
        self.table = table
        self.scale = scale
        self.buckets = tuple(buckets)
        self.fail = fail
        self.shared_buffers = {"table": table}
        self.x: dict[int, torch.Tensor] = {}
        self.seen: dict[int, torch.Tensor] = {}
        self.out: dict[int, torch.Tensor] = {}

    def bucket_sizes(self, mode):
        return self.buckets

    def prepare_bucket(self, bucket):
        self.x.setdefault(bucket, torch.zeros(bucket))
        self.seen.setdefault(bucket, torch.zeros(bucket))
        self.out.setdefault(bucket, torch.zeros(bucket))

    def host_prep(self, batch, bucket):
        x = self.x[bucket]
        x[: len(batch)] = torch.tensor(batch, dtype=x.dtype)
        x[len(batch) :] = 0.0

    def graph_prep(self, bucket):
        self.seen[bucket].copy_(self.table[:bucket])

    def forward(self, bucket):
        if self.fail:
            raise RuntimeError("phase failed")
        torch.mul(self.x[bucket], self.scale, out=self.out[bucket])
        self.out[bucket] += self.seen[bucket]
        return self.out[bucket]


@pytest.fixture
def platform():
    return sim_platform()


def three_phases(platform, draft="in_graph", verify="none", extend="post_replay", table=None):
    """An EAGLE-shaped step: draft decode, target verify, draft extend (each its own runner)."""
    table = table if table is not None else torch.arange(8, dtype=torch.float32)
    return [
        DecodeRunner(TableModel(table, 1.0), fixed_policy(draft), platform, name="draft"),
        VerifyRunner(
            TableModel(table, 2.0), fixed_policy(verify), platform, name="verify", draft_tokens=1
        ),
        DraftExtendRunner(
            TableModel(table, 3.0), fixed_policy(extend), platform, name="draft_extend"
        ),
    ]


def captured_step(phases, **kw) -> SpecStep:
    step = SpecStep(phases, **kw)
    step.capture()
    return step


# -- the draft-extend runner ---------------------------------------------------------------------


class TestDraftExtendRunner:
    def run_once(self, platform, policy):
        model = TableModel(torch.arange(8, dtype=torch.float32))
        runner = DraftExtendRunner(model, fixed_policy(policy), platform)
        runner.capture()
        log = sim_impl(platform).log
        start = len(log)
        runner.run([1.0, 2.0])
        kinds = [
            (e[0], e[3] if e[0] == "record" else None)
            for e in log[start:]
            if e[0] in ("record", "replay")
        ]
        return runner, kinds

    def test_mode_and_no_marker(self, platform):
        runner, _ = self.run_once(platform, "in_graph")
        assert runner.mode is DRAFT_EXTEND
        assert runner.captured and not any(cb.planted for cb in runner.captured.values())
        assert not runner.fence.planted

    def test_pre_replay_publishes_before_replay(self, platform):
        runner, kinds = self.run_once(platform, "pre_replay")
        assert kinds == [("record", False), ("replay", None)]
        assert runner.fence.take().policy is PRE_REPLAY

    @pytest.mark.parametrize("policy", ["in_graph", "post_replay"])
    def test_in_graph_and_post_replay_publish_after_replay(self, platform, policy):
        runner, kinds = self.run_once(platform, policy)
        assert kinds == [("replay", None), ("record", False)]
        read_done = runner.fence.take()
        assert read_done.policy is POST_REPLAY and runner.last_step.policy is POST_REPLAY

    def test_none_publishes_nothing(self, platform):
        runner, kinds = self.run_once(platform, "none")
        assert kinds == [("replay", None)]
        assert runner.fence.take() is None

    def test_eager_in_graph_publishes_after_the_forward(self, platform):
        model = TableModel(torch.arange(8, dtype=torch.float32), buckets=())
        runner = DraftExtendRunner(model, fixed_policy("in_graph"), platform)
        runner.capture()
        runner.run([1.0])
        assert runner.last_step.bucket is None
        assert runner.fence.take().policy is POST_REPLAY


# -- the step's mailbox and the last reader ------------------------------------------------------


class TestMailbox:
    def test_eagle_hands_the_draft_extend_event(self, platform):
        step = captured_step(three_phases(platform), last_reader=DRAFT_EXTEND)
        outs = step.run([1.0, 2.0])
        assert [o.tolist() for o in outs] == [[1.0, 3.0], [2.0, 5.0], [3.0, 7.0]]
        read_done = step.fence.take()
        assert read_done.source == "draft_extend" and read_done.policy is POST_REPLAY
        assert step.fence.take() is None  # consume-once
        assert step.last_step.policy is POST_REPLAY
        assert [i.policy for i in step.phase_steps] == [IN_GRAPH, NONE, POST_REPLAY]

    def test_a_later_none_discards_an_earlier_event(self, platform):
        """Verify published in-graph, draft extend decided none: the step must be coarse."""
        step = captured_step(
            three_phases(platform, verify="in_graph", extend="none"), last_reader=DRAFT_EXTEND
        )
        step.run([1.0])
        assert step.phase_steps[1].policy is IN_GRAPH  # verify did publish ...
        assert step.fence.take() is None  # ... and the draft extend's none discarded it
        assert step.last_step.policy is NONE

    def test_dflash_hands_verify_event_even_with_a_later_phase(self, platform):
        phases = three_phases(platform, verify="in_graph", extend="nothing")
        step = captured_step(phases, last_reader=VERIFY)
        step.run([1.0])
        read_done = step.fence.take()
        assert read_done.source == "verify" and read_done.policy is IN_GRAPH
        assert read_done.event is phases[1].fence.event  # the planted node of verify's graph
        assert phases[2].fence.take() is None  # the later phase's fence was drained

    def test_default_last_reader_is_the_last_phase(self, platform):
        step = captured_step(three_phases(platform, verify="in_graph", extend="pre_replay"))
        assert step.reader.name == "draft_extend" and step.last_reader is None
        step.run([1.0])
        assert step.fence.take().policy is PRE_REPLAY

    def test_several_phases_of_the_last_readers_mode_pick_the_last(self, platform):
        table = torch.arange(8, dtype=torch.float32)
        first = DecodeRunner(TableModel(table), fixed_policy("in_graph"), platform, name="d1")
        second = DecodeRunner(TableModel(table), fixed_policy("post_replay"), platform, name="d2")
        step = captured_step([first, second], last_reader="decode")
        step.run([1.0])
        assert step.fence.take().source == "d2"

    def test_a_stale_event_never_survives_into_the_next_step(self, platform):
        step = captured_step(three_phases(platform), last_reader=DRAFT_EXTEND)
        step.run([1.0])  # not taken by the scheduler
        bad = captured_step(three_phases(platform, extend="none"), last_reader=DRAFT_EXTEND)
        bad.run([1.0])
        assert bad.fence.take() is None
        step.run([2.0])
        assert step.fence.take().step == step.phases[2].runner.fence.step

    def test_unknown_last_reader_is_an_input_error(self, platform):
        phases = three_phases(platform)[:2]
        with pytest.raises(InputError, match="draft_extend"):
            SpecStep(phases, last_reader=DRAFT_EXTEND)
        with pytest.raises(InputError):
            SpecStep([])

    def test_phases_must_share_a_platform(self, platform):
        other = sim_platform()
        table = torch.zeros(8)
        with pytest.raises(InputError, match="same platform"):
            SpecStep(
                [
                    DecodeRunner(TableModel(table), fixed_policy("none"), platform),
                    DraftExtendRunner(TableModel(table), fixed_policy("none"), other),
                ]
            )

    def test_phase_inputs_see_earlier_outputs(self, platform):
        phases = three_phases(platform)
        step = captured_step([phases[0], Phase(phases[1], lambda b, outs: outs[0].tolist()[:1])])
        outs = step.run([5.0, 6.0])
        assert outs[1].tolist() == [2 * 5.0 + 0.0]


class TestLastReaderFromTheRegistry:
    def test_accessor_reads_the_declared_field(self):
        assert last_reader_of(SimpleNamespace(last_reader="draft_extend")) is DRAFT_EXTEND
        assert last_reader_of(SimpleNamespace(last_reader=VERIFY)) is VERIFY
        assert last_reader_of(SimpleNamespace(last_reader=None)) is None
        assert last_reader_of(SpecAlgorithm("x")) is None  # undeclared: the last phase

    @pytest.mark.parametrize("name,reader", sorted(INTENDED_LAST_READERS.items()))
    def test_for_algorithm_picks_the_declared_phase(self, platform, name, reader):
        from warpolicy.registry.loader import default_registry_path, load_registry

        spec = load_registry([default_registry_path()]).spec(name)
        step = SpecStep.for_algorithm(three_phases(platform), spec)
        assert step.reader.mode is reader and step.name == f"{name}_step"

    def test_the_registry_covers_both_families(self):
        assert set(INTENDED_LAST_READERS.values()) == {DRAFT_EXTEND, VERIFY}
        assert INTENDED_LAST_READERS["eagle"] is DRAFT_EXTEND
        assert INTENDED_LAST_READERS["dflash"] is VERIFY


# -- failure of any phase -----------------------------------------------------------------------


class TestLateReaders:
    def test_a_phase_after_the_last_reader_that_publishes_becomes_the_release(self, platform):
        """Issue 17 class 12: verify(none), draft_extend(pre_replay), decode(in_graph) with
        ``last_reader: draft_extend``: the decode phase's release point is handed out, never
        the draft extend's (which precedes the decode's reads)."""
        phases = [
            VerifyRunner(
                TableModel(torch.arange(8.0)),
                fixed_policy("none"),
                platform,
                name="verify",
                draft_tokens=1,
            ),
            DraftExtendRunner(
                TableModel(torch.arange(8.0)),
                fixed_policy("pre_replay"),
                platform,
                name="draft_extend",
            ),
            DecodeRunner(
                TableModel(torch.arange(8.0)), fixed_policy("in_graph"), platform, name="draft"
            ),
        ]
        step = captured_step(phases, last_reader=DRAFT_EXTEND)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for _ in range(3):
                step.run([1.0])
                read_done = step.fence.take()
                assert read_done.source == "draft" and read_done.policy is IN_GRAPH
                read_done.discard()
        assert len(caught) == 1 and "phase draft (decode) runs after" in str(caught[0].message)
        assert step.reporter.counts["warning:late-reader:draft"] == 3

    def test_a_later_phase_that_decides_none_is_a_reader_and_the_step_coarse(self, platform):
        """Issue 26 finding 3: ``none`` is unknown, not "reads nothing": a draft extend after
        the declared last reader (verify) that answers ``none`` reads shared state for all we
        know, so the step hands out nothing (0.3.0 handed out verify's in-graph event)."""
        step = captured_step(
            three_phases(platform, verify="in_graph", extend="none"), last_reader=VERIFY
        )
        with pytest.warns(RuntimeWarning, match="runs after the declared last shared reader"):
            step.run([1.0])
        assert step.fence.take() is None and step.released_by.name == "draft_extend"
        assert step.last_step.policy is NONE

    def test_a_later_phase_that_reads_nothing_is_skipped(self, platform):
        phases = three_phases(platform, verify="in_graph", extend="nothing")
        assert phases[2].mode_policies().reads_nothing
        step = captured_step(phases, last_reader=VERIFY)
        step.run([1.0])
        assert step.fence.take().source == "verify" and step.released_by.name == "verify"


class TestFailure:
    @pytest.mark.parametrize("failing", [0, 1, 2])
    def test_a_raising_phase_leaves_the_mailbox_empty(self, platform, failing):
        phases = three_phases(platform, verify="in_graph")
        step = captured_step(phases, last_reader=DRAFT_EXTEND)
        phases[failing].model.fail = True
        with pytest.raises(RuntimeError, match="phase failed"):
            step.run([1.0])
        assert step.fence.take() is None and step.last_step.policy is NONE

    @pytest.mark.parametrize("failing", [0, 1, 2])
    def test_a_failed_publish_in_any_phase_is_coarse(self, platform, failing):
        phases = three_phases(platform, verify="post_replay")
        step = captured_step(phases, last_reader=DRAFT_EXTEND)
        fence = phases[failing].fence
        fence.after_replay = lambda *a, **k: None  # publishes nothing although it decided to
        with pytest.warns(RuntimeWarning, match="published nothing"):
            step.run([1.0])
        assert step.fence.take() is None and step.last_step.policy is NONE

    @settings(max_examples=60, deadline=None)
    @given(
        policies=st.lists(
            st.sampled_from(["nothing", "pre_replay", "in_graph", "post_replay", "none"]),
            min_size=3,
            max_size=3,
        ),
        failed=st.lists(st.booleans(), min_size=3, max_size=3),
        reader=st.sampled_from([None, DECODE, VERIFY, DRAFT_EXTEND]),
    )
    def test_handed_event_is_the_last_readers_or_nothing(self, policies, failed, reader):
        """The step hands the event of its last reading phase (the declared last reader, or a
        later phase that does not declare ``nothing``), and only when no reading phase failed."""
        platform = sim_platform()
        phases = three_phases(platform, *policies)
        step = captured_step(phases, last_reader=reader)
        for runner, fail in zip(phases, failed):
            if fail:
                runner.fence.after_replay = lambda *a, **k: None
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            step.run([1.0])
        got = step.fence.take()
        decided = [r.policy_for(r.last_step.bucket) for r in phases]  # before any failure
        nothing = [p == "nothing" for p in policies]  # the oracle: what each phase declares
        reading = [i for i in range(len(phases)) if i <= step.last_index or not nothing[i]]
        releasing = phases[reading[-1]]
        assert step.released_by.runner is releasing
        any_failed = any(failed[i] and decided[i] is not NONE for i in reading)
        if any_failed or releasing.last_step.policy is NONE:
            assert got is None
        else:
            assert got is not None and got.source == releasing.name
            assert got.policy is releasing.last_step.policy


# -- the overlap loop and the audit -------------------------------------------------------------


class TestOverlapLoop:
    def test_loop_waits_on_the_readers_event(self, platform):
        step = captured_step(three_phases(platform), last_reader=DRAFT_EXTEND)
        loop = OverlapLoop(platform=platform)
        log = sim_impl(platform).log
        writes = []
        out = loop.step([1.0], lambda: writes.append(platform.current_stream()), runner=step)
        assert len(out) == 3 and writes == [loop.schedule_stream]
        assert loop.last_barrier == "event" and loop.last_read_done.source == "draft_extend"
        waits = [e for e in log if e[0] == "wait_event" and e[1] == loop.schedule_stream.id]
        assert waits[-1][2] == loop.last_read_done.event.id

    def test_loop_is_coarse_when_the_reader_decides_none(self, platform):
        step = captured_step(
            three_phases(platform, verify="in_graph", extend="none"), last_reader=DRAFT_EXTEND
        )
        loop = OverlapLoop(step, platform)
        loop.step([1.0])
        loop.step([2.0])
        assert loop.last_barrier == "coarse" and loop.last_read_done is None


class TestAudit:
    """``warpolicy audit`` audits a phase step as it audits a runner (simulated race)."""

    def subject(self, platform, reader, extend="post_replay"):
        from warpolicy.audit.dynamic import AuditSubject

        table = torch.arange(8, dtype=torch.float32)

        class Shared:
            shared_buffers = {"table": table}

        def build(model):
            return SpecStep(
                three_phases(platform, verify="in_graph", extend=extend, table=table),
                last_reader=reader,
            )

        return AuditSubject(
            f"eagle_like_{reader.label}",
            Shared(),
            {reader: build},
            # trial t fills bucket 2**(t mod 4): 4 trials replay every bucket
            lambda mode, trial: [float(trial)] * (1 << (trial % 4)),
            platform,
            declared={reader: IN_GRAPH if reader is VERIFY else POST_REPLAY},
            spec="eagle",
        )

    def test_a_later_reader_that_claims_nothing_is_refuted(self, platform):
        """The draft extend reads the table but declares ``nothing`` and comes after the
        declared last reader: the step releases at verify's node, and the audit catches the
        race (a later phase deciding ``none`` makes the step coarse instead: issue 26)."""
        from warpolicy.audit.dynamic import audit_mode
        from warpolicy.audit.report import SAFE, UNSAFE

        unsafe = audit_mode(
            self.subject(platform, VERIFY, extend="nothing"), VERIFY, trials=4, static=False
        )
        safe = audit_mode(
            self.subject(platform, DRAFT_EXTEND), DRAFT_EXTEND, trials=4, static=False
        )
        assert unsafe.dynamic.verdict == UNSAFE and unsafe.dynamic.corrupted == 4
        assert unsafe.dynamic.first.output == "out[2]"  # the draft extend's output
        assert safe.dynamic.verdict == SAFE and safe.dynamic.corrupted == 0

    def test_a_later_phase_that_publishes_moves_the_release_after_it(self, platform):
        """Issue 17 class 12: with ``last_reader`` verify, a draft extend that decides to
        publish reads shared state by its own answer: the step releases after it (no race),
        one warning, every occurrence counted."""
        from warpolicy.audit.dynamic import audit_mode
        from warpolicy.audit.report import UNSAFE

        with pytest.warns(RuntimeWarning, match="decided post_replay, so it reads shared state"):
            entry = audit_mode(self.subject(platform, VERIFY), VERIFY, trials=4, static=False)
        assert entry.dynamic.verdict != UNSAFE and entry.dynamic.corrupted == 0
        assert entry.policy is POST_REPLAY  # later than the declared in_graph: demoted, sound


def test_overlap_spec_bench_runs_on_the_simulated_platform():
    from warpolicy.bench.overlap_spec import format_overlap_spec, run_overlap_spec_bench

    result = run_overlap_spec_bench(device="sim")
    rows = {(r["shape"], r["run"]): r for r in result["rows"]}
    assert set(rows) == {
        (s, r) for s in ("eagle", "dflash") for r in ("coarse", "step", "no_barrier")
    }
    assert rows[("eagle", "step")]["reader"] == "draft_extend"
    assert rows[("dflash", "step")]["reader"] == "verify"
    assert result["targets"]["sound_runs_zero_corrupted"]
    text = format_overlap_spec(result)
    assert "draft_extend" in text and "meaningless" in text
    with pytest.raises(InputError):
        render(result, "yaml", format_overlap_spec)
