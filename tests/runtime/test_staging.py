"""Staging (`warpolicy.runtime.runners.staging`) on the simulated platform: the stager's copies
and its per-batch report, the consumer copying late for a batch that was not staged, `SpecStep`
handing verify's event only for batches its stager staged, every failure the later release,
and the staging canary catching a stager that copies one buffer fewer.

Races are seeded as the canary's CPU tests seed them: the scheduler's next writes land at the
instant verify's in-graph node fires (`StepRace`); a staged consumer that reads a live buffer
then reads the next step's values. "Corrupted" is judged against an independent reference: the
same steps run sequentially (writes, then the step) with no staging and no canary.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from warpolicy.errors import InputError
from warpolicy.registry.engine import PolicyEngine
from warpolicy.registry.vocabulary import IN_GRAPH, POST_REPLAY, ForwardMode
from warpolicy.runtime.canary import Canary, CanaryConfig, CanarySpec
from warpolicy.runtime.hookspecs import hookimpl
from warpolicy.runtime.runners import (
    DraftExtendRunner,
    OverlapLoop,
    SpecStep,
    VerifyRunner,
)
from warpolicy.runtime.runners.staging import StagedPhase, Stager, TensorCopy
from warpolicy.testing import sim_impl, sim_runtime

VERIFY, DRAFT_EXTEND = ForwardMode.TARGET_VERIFY, ForwardMode.DRAFT_EXTEND
ROWS = 8
BATCHES = ([1.0, 2.0], [3.0, 4.0, 5.0, 6.0], [7.0], [8.0, 9.0, 1.5])


class Shared:
    """What the scheduler writes: two tables (``table`` and ``lens``), rewritten per step."""

    def __init__(self) -> None:
        self.table = torch.arange(ROWS, dtype=torch.int64)
        self.lens = torch.ones(ROWS, dtype=torch.int64)

    def write(self, step: int) -> None:
        self.table.copy_(torch.arange(ROWS, dtype=torch.int64) * 3 + 7 * step)
        self.lens.copy_(torch.arange(ROWS, dtype=torch.int64) + 11 * step)


class PhaseModel:
    """A phase reading ``table`` and ``lens`` in its in-graph prep; output ``2 x + table +
    lens`` per row. ``table`` / ``lens`` are what it reads (live or staged copies);
    ``shared_buffers`` what it reads live."""

    def __init__(self, table: torch.Tensor, lens: torch.Tensor, live: dict, buckets=(2, 4)):
        self.table, self.lens = table, lens
        self.shared_buffers = live
        self.buckets = buckets
        self.kv = torch.zeros(64)
        self.x: dict[int, torch.Tensor] = {}
        self.idx: dict[int, torch.Tensor] = {}
        self.out: dict[int, torch.Tensor] = {}

    def bucket_sizes(self, mode):
        return self.buckets

    def prepare_bucket(self, bucket):
        self.x.setdefault(bucket, torch.zeros(bucket))
        self.idx.setdefault(bucket, torch.zeros(bucket, dtype=torch.int64))
        self.out.setdefault(bucket, torch.zeros(bucket))

    def host_prep(self, batch, bucket):
        x = self.x[bucket]
        x.zero_()
        x[: len(batch)] = torch.tensor(batch, dtype=x.dtype)

    def graph_prep(self, bucket):
        torch.add(self.table[:bucket], self.lens[:bucket], out=self.idx[bucket])

    def forward(self, bucket):
        out = self.out[bucket]
        torch.add(self.x[bucket] * 2, self.idx[bucket].to(out.dtype), out=out)
        self.kv.index_add_(0, self.idx[bucket] % 64, out)
        return out

    def canary_spec(self, mode, bucket, batch):
        return CanarySpec(state={"kv": self.kv})


class StepRace:
    """A `StepProbe` landing the scheduler's next writes when verify's in-graph node fires, on
    a step whose stager staged (the step then hands that event): the widest window a GPU could
    give them."""

    def __init__(self, platform: Any, verify: VerifyRunner, stager: Stager) -> None:
        self.impl = sim_impl(platform)
        self.verify = verify
        self.stager = stager
        self._fn: Callable[[], None] | None = None
        self._done = False
        self.fired = 0
        self.impl.listeners.append(self._on_entry)

    def writes(self, fn: Callable[[], None]) -> Callable[[], None]:
        self._fn, self._done = fn, False

        def write_next() -> None:
            if not self._done:
                self._done = True
                fn()

        return write_next

    def mark(self, point: str, stream: Any) -> None:
        pass

    def _on_entry(self, entry: tuple) -> None:
        if self._fn is None or self._done or entry[0] != "record" or entry[3] != "in_graph":
            return
        if not self.stager.staged:
            return
        events = {cb.recorded.id for cb in self.verify.captured.values() if cb.recorded}
        if entry[1] in events:
            self._done = True
            self.fired += 1
            self._fn()


@pytest.fixture(scope="module")
def eagle():
    """fa3 + EAGLE from the default registry: verify in_graph only after
    ``draft_extend_staged``, draft extend undeclared (none)."""
    return PolicyEngine.load(environ={}).compile("fa3", "eagle")


class Fixed:
    def __init__(self, policy: str, backend: str = "synthetic", spec: str = "eagle") -> None:
        from warpolicy.registry.vocabulary import WarReadDonePolicy

        self.policy = WarReadDonePolicy.parse(policy)
        self.backend, self.spec = backend, spec

    def lookup(self, mode, eager=False, planted=True):
        return self.policy


class Step:
    """Verify -> draft extend on a fresh sim runtime; the draft extend reads staged copies
    (``stage``: the names staged; a name not staged is read live), ``extend_policy`` for the
    draft extend's own release."""

    def __init__(
        self,
        verify_policy: Any,
        *,
        stage: tuple[str, ...] = ("table", "lens"),
        extend_policy: Any = None,
        canary: bool = False,
        race: bool = False,
        register: bool = True,
        fail: BaseException | None = None,
        extra: tuple[Any, ...] = (),
    ) -> None:
        self.rt = rt = sim_runtime()
        self.shared = shared = Shared()
        live = {"table": shared.table, "lens": shared.lens}
        reads: list[Any] = [TensorCopy.of(n, live[n]) for n in stage]
        if fail is not None:
            reads.append(Failing(fail))
        self.stager = Stager(reads)
        if register:
            rt.pm.register(self.stager, name="stager")
        for i, plugin in enumerate(extra):
            rt.pm.register(plugin, name=f"extra{i}")
        targets = {r.name: r.target for r in reads if isinstance(r, TensorCopy)}
        read = {n: targets.get(n, live[n]) for n in live}
        still_live = {n: t for n, t in live.items() if n not in targets}
        self.consumer_model = PhaseModel(read["table"], read["lens"], still_live)
        self.canary = (
            Canary(rt.platform, CanaryConfig(rate=1.0, seed=0), observers=rt.observers)
            if canary
            else None
        )
        kw: dict[str, Any] = {"observers": rt.observers, "canary": self.canary, "self_check": "off"}
        self.verify = VerifyRunner(
            PhaseModel(shared.table, shared.lens, live), verify_policy, rt.platform,
            draft_tokens=1, **kw,
        )  # fmt: skip
        self.extend = DraftExtendRunner(
            self.stager.consumer(self.consumer_model, state={"kv": self.consumer_model.kv}),
            extend_policy if extend_policy is not None else Fixed("post_replay"),
            rt.platform,
            **kw,
        )
        self.step = SpecStep([self.verify, self.extend], last_reader=DRAFT_EXTEND)
        self.step.capture()
        self.race = StepRace(rt.platform, self.verify, self.stager) if race else None
        self.loop = OverlapLoop(self.step, probe=self.race)
        shared.write(0)

    def run(self, steps: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        outs = []
        for k in range(steps):

            def write(k: int = k) -> None:
                self.shared.write(k + 1)

            write_next = self.race.writes(write) if self.race is not None else write
            out = self.loop.step(BATCHES[k % len(BATCHES)], write_next)
            outs.append(tuple(o.clone() for o in out))
        self.loop.drain()
        return outs

    def once(self, batch=(1.0, 2.0)) -> Any:
        self.step.run(list(batch))
        taken = self.step.fence.take()
        if taken is not None:
            taken.discard()
        return taken


def reference(steps: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Sequential, unstaged, live reads: writes, then both phases, eagerly."""
    shared = Shared()
    live = {"table": shared.table, "lens": shared.lens}
    models = [PhaseModel(shared.table, shared.lens, live) for _ in range(2)]
    shared.write(0)
    outs = []
    for k in range(steps):
        batch = BATCHES[k % len(BATCHES)]
        bucket = 2 if len(batch) <= 2 else 4
        step = []
        for m in models:
            m.prepare_bucket(bucket)
            m.host_prep(batch, bucket)
            m.graph_prep(bucket)
            step.append(m.forward(bucket).clone())
        outs.append(tuple(step))
        shared.write(k + 1)
    return outs


class Failing:
    """A staged read whose copy raises ``error``."""

    name = "failing"
    nbytes = 8

    def __init__(self, error: BaseException) -> None:
        self.error = error
        self.sources = {"failing": torch.zeros(1)}
        self.calls = 0
        self.armed = True
        self.once = False  # disarm after raising once (a transient failure)

    def copy(self, batch):
        self.calls += 1
        if self.armed:
            self.armed = not self.once
            raise self.error


class Liar:
    """An action plugin answering True for ``draft_extend_staged`` without staging anything."""

    @hookimpl
    def warpolicy_batch_action(self, action, runner, mode, bucket, batch):
        return True


# -- the stager ---------------------------------------------------------------------------------


class TestStager:
    def test_a_tensor_copy_copies_into_its_own_buffer(self):
        src = torch.arange(4)
        read = TensorCopy.of("t", src)
        assert read.target.data_ptr() != src.data_ptr() and read.nbytes == 32
        src += 1
        read.copy(None)
        assert torch.equal(read.target, src)

    @pytest.mark.parametrize(
        "target, match",
        [
            (torch.zeros(3, dtype=torch.int64), "shape"),
            (torch.zeros(4, dtype=torch.int32), "dtype"),
            ("x", "must be a tensor"),
        ],
    )
    def test_a_bad_target_is_one_input_error(self, target, match):
        with pytest.raises(InputError, match=match):
            TensorCopy("t", torch.zeros(4, dtype=torch.int64), target)

    def test_the_shared_buffer_itself_is_no_staged_copy(self):
        src = torch.zeros(4)
        with pytest.raises(InputError, match="never writes"):
            TensorCopy("t", src, src)

    def test_a_stager_needs_reads_named_once(self):
        with pytest.raises(InputError, match="at least one"):
            Stager([])
        a = TensorCopy.of("t", torch.zeros(2))
        with pytest.raises(InputError, match="staged twice: t"):
            Stager([a, TensorCopy.of("t", torch.zeros(2))])
        with pytest.raises(InputError, match="not a StagedRead"):
            Stager([object()])

    def test_stage_then_consume_copies_once_early(self):
        src = torch.arange(3)
        read = TensorCopy.of("t", src)
        stager = Stager([read])
        assert stager.stage(None) is True and stager.staged
        src += 10  # a later write: the staged copy keeps the staged values
        assert stager.consume() is True and not stager.staged
        assert torch.equal(read.target, torch.arange(3))
        assert stager.counts == {"staged": 1}

    def test_consume_without_staging_copies_late(self):
        src = torch.arange(3)
        read = TensorCopy.of("t", src)
        stager = Stager([read])
        src += 10
        assert stager.consume() is False
        assert torch.equal(read.target, src) and stager.counts == {"late": 1}

    @pytest.mark.parametrize("error", [RuntimeError("copy"), KeyboardInterrupt()])
    def test_a_copy_that_raises_leaves_the_step_unstaged(self, error):
        failing = Failing(error)
        stager = Stager([TensorCopy.of("t", torch.zeros(2)), failing])
        failing.armed = False
        assert stager.stage(None)  # a first step staged
        failing.armed = True
        with pytest.raises(type(error)):
            stager.stage(None)
        assert not stager.staged and stager.counts["failed"] == 1

    def test_a_disabled_bucket_is_refused(self):
        stager = Stager([TensorCopy.of("t", torch.zeros(2))])
        stager.disable(4, "canary")
        assert stager.stage(None, 4) is False and not stager.staged
        assert stager.stage(None, 2) is True and stager.counts["refused"] == 1

    def test_the_action_is_answered_only_for_its_action_mode_and_runner(self):
        stager = Stager([TensorCopy.of("t", torch.zeros(2))], runner="verify")
        act = stager.warpolicy_batch_action
        assert act("prefill_staged", "verify", VERIFY, 2, None) is None
        assert act("draft_extend_staged", "verify", DRAFT_EXTEND, 2, None) is None
        assert act("draft_extend_staged", "other", VERIFY, 2, None) is None
        assert act("draft_extend_staged", "verify", VERIFY, 2, None) is True


# -- the staged step -------------------------------------------------------------------------------


class TestStagedStep:
    def test_a_staged_batch_hands_verifys_in_graph_event(self, eagle):
        s = Step(eagle)
        taken = s.once()
        assert taken is not None and taken.policy is IN_GRAPH and taken.source == "target_verify"
        assert s.step.staged and s.step.released_by.mode is VERIFY
        assert s.stager.counts == {"staged": 1} and s.extend.model.was_staged

    def test_staged_outputs_equal_the_sequential_reference(self, eagle):
        s = Step(eagle)
        outs = s.run(8)
        ref = reference(8)
        assert all(
            torch.equal(a[:n], b[:n])
            for o, r, batch in zip(outs, ref, BATCHES * 2)
            for a, b, n in zip(o, r, (len(batch),) * 2)
        )
        assert s.loop.last_barrier == "event"

    def test_a_failed_copy_releases_at_the_draft_extend(self, eagle):
        s = Step(eagle, fail=RuntimeError("copy failed"))
        s.stager.reads[-1].once = True  # fails at the staging point, not at the late copy
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            taken = s.once()
        # verify publishes nothing unstaged; the draft extend copied for itself (late) and is
        # the release: its own post_replay event
        assert taken is not None and taken.policy is POST_REPLAY
        assert taken.source == "draft_extend" and not s.step.staged
        assert s.stager.counts["late"] == 1 and not s.extend.model.was_staged

    def test_an_interrupt_in_a_copy_publishes_nothing_and_propagates(self, eagle):
        s = Step(eagle, fail=KeyboardInterrupt())
        with pytest.raises(KeyboardInterrupt):
            s.step.run([1.0, 2.0])
        assert s.step.fence.take() is None and not s.stager.staged

    def test_a_plugin_answering_true_is_not_staging(self, eagle):
        """Some other plugin says draft_extend_staged succeeded; the consumer's stager did not
        stage (it is not registered): the consumer copies late and is the release."""
        s = Step(eagle, register=False, extra=(Liar(),))
        taken = s.once()
        assert taken is not None and taken.source == "draft_extend" and not s.step.staged

    def test_a_disabled_bucket_releases_at_the_draft_extend(self, eagle):
        s = Step(eagle)
        s.stager.disable(2, "test")
        taken = s.once()
        assert taken is not None and taken.source == "draft_extend"
        assert s.once((1.0, 2.0, 3.0)).source == "target_verify"  # bucket 4 still stages

    def test_unstaged_and_undeclared_draft_extend_is_coarse(self, eagle):
        s = Step(eagle, fail=RuntimeError("x"), extend_policy=eagle)
        s.stager.reads[-1].once = True
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            assert s.once() is None

    def test_a_late_copy_that_fails_too_fails_the_step_closed(self, eagle):
        s = Step(eagle, fail=RuntimeError("x"))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            with pytest.raises(RuntimeError, match="x"):
                s.step.run([1.0, 2.0])
        assert s.step.fence.take() is None and not s.step.staged

    def test_a_consumer_needs_a_verify_before_it(self, eagle):
        rt = sim_runtime()
        shared = Shared()
        stager = Stager([TensorCopy.of("table", shared.table)])
        model = stager.consumer(PhaseModel(shared.table, shared.lens, {}))
        extend = DraftExtendRunner(model, Fixed("post_replay"), rt.platform)
        with pytest.raises(InputError, match="no target verify runs before it"):
            SpecStep([extend])

    @settings(max_examples=25, deadline=None)
    @given(answers=st.lists(st.sampled_from(["ok", "raise", "refuse"]), min_size=1, max_size=6))
    def test_the_handed_event_is_verifys_only_when_its_stager_staged(self, eagle, answers):
        s = Step(eagle, fail=RuntimeError("x"))
        failing = s.stager.reads[-1]
        failing.once = True
        for answer in answers:
            failing.armed = answer == "raise"
            s.stager._disabled = {2: "x"} if answer == "refuse" else {}
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)
                taken = s.once()
            assert taken is not None
            assert (taken.source == "target_verify") is (answer == "ok") is s.step.staged


# -- audit-style races and the staging canary ------------------------------------------------------


class TestRacesAndCanary:
    def test_an_honest_stager_never_corrupts_a_racing_step(self, eagle):
        s = Step(eagle, race=True)
        outs = s.run(8)
        ref = reference(8)
        assert s.race.fired == 8
        for o, r, batch in zip(outs, ref, BATCHES * 2):
            n = len(batch)
            assert all(torch.equal(a[:n], b[:n]) for a, b in zip(o, r))

    def test_a_stager_that_copies_one_buffer_fewer_corrupts_the_draft_extend(self, eagle):
        """The positive control: without ``lens`` staged the draft extend reads it live, after
        verify's release, and sees the next step's values."""
        s = Step(eagle, stage=("table",), race=True)
        outs = s.run(8)
        ref = reference(8)
        bad = [
            k
            for k, (o, r, batch) in enumerate(zip(outs, ref, BATCHES * 2))
            if not torch.equal(o[1][: len(batch)], r[1][: len(batch)])
        ]
        assert bad == list(range(8))

    def test_the_canary_catches_the_lying_stager_then_staging_is_off(self, eagle):
        s = Step(eagle, stage=("table",), race=True, canary=True)
        outs = s.run(8)
        ref = reference(8)
        violations = [v for v in s.canary.violations if v.cell.scope.startswith("staging")]
        assert violations, "the staging canary must catch the lying stager"
        caught = {v.cell.bucket for v in violations}
        assert caught == {2, 4} and set(s.stager.disabled) == caught
        # after each bucket was caught, its steps release at the draft extend: nothing corrupted
        first = {b: min(v.step for v in violations if v.cell.bucket == b) for b in caught}
        for k, (o, r, batch) in enumerate(zip(outs, ref, BATCHES * 2)):
            n = len(batch)
            if k >= 2:  # both buckets were caught in the first two steps
                assert torch.equal(o[1][:n], r[1][:n]), k
        assert first

    def test_the_canary_raises_no_alarm_on_an_honest_stager(self, eagle):
        s = Step(eagle, race=True, canary=True)
        s.run(12)
        assert not [v for v in s.canary.violations if v.cell.scope.startswith("staging")]
        assert s.step.staging_canary is not None
        assert s.canary.stats["checked"] >= 12 and not s.stager.disabled

    def test_a_staged_consumer_is_a_staged_phase(self, eagle):
        s = Step(eagle)
        assert isinstance(s.extend.model, StagedPhase)
        assert set(s.extend.model.live_reads) == {"table", "lens"}


def test_a_consumer_keeps_its_models_canary_support():
    from warpolicy.runtime.runners import CanaryAdapter
    from warpolicy.runtime.runners.staging import StagedCanaryPhase

    shared = Shared()
    stager = Stager([TensorCopy.of("table", shared.table)])
    checked = stager.consumer(PhaseModel(shared.table, shared.lens, {}))
    assert isinstance(checked, StagedCanaryPhase) and isinstance(checked, CanaryAdapter)
    assert checked.canary_spec(DRAFT_EXTEND, 2, None).state["kv"] is checked.model.kv

    class Plain:
        shared_buffers: dict = {}

        def bucket_sizes(self, mode):
            return (2,)

    plain = stager.consumer(Plain())
    assert isinstance(plain, StagedPhase) and not isinstance(plain, StagedCanaryPhase)


def test_the_guides_speculative_block_runs_as_written_on_sim(capsys):
    """docs/integrating.md's "Speculative engines" block runs as written and hands verify's
    in-graph event for a staged step."""
    import pathlib
    import re

    text = (pathlib.Path(__file__).parents[2] / "docs" / "integrating.md").read_text()
    section = text[text.index("## Speculative engines") :]
    block = re.search(r"```python\n(.*?)```", section, re.S)
    assert block is not None and "Stager(" in block.group(1)
    exec(compile(block.group(1), "docs/integrating.md", "exec"), {"__name__": "guide"})
    assert capsys.readouterr().out.split()[:3] == ["target_verify", "in_graph", "True"]
