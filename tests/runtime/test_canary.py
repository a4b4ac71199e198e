"""The WAR canary on the simulated platform: sampling, the snapshot/restore contract, a seeded
race caught and demoted for the rest of the process, the hooks, NVTX and the log line, failing
closed on its own failures, and the engine-facing session.

Races are seeded by `warpolicy.testing.SimRace` (the scheduler's next writes land at the step's
release point); "corrupted" is judged against an independent reference: the same steps run
with no race and no canary.
"""

from __future__ import annotations

import logging
import sys
import types

import pytest
import torch
from canary_support import SLOTS, NamedFixed, TableModel

from warpolicy.registry.vocabulary import IN_GRAPH, NONE, POST_REPLAY, PRE_REPLAY, ForwardMode
from warpolicy.runtime import nvtx as wnvtx
from warpolicy.runtime.canary import (
    Canary,
    CanaryConfig,
    CanaryError,
    CanarySpec,
    Rows,
    Tolerance,
    Whole,
)
from warpolicy.runtime.hookspecs import hookimpl
from warpolicy.runtime.release import BucketRelease
from warpolicy.runtime.runners import (
    CanaryAdapter,
    CanaryHost,
    DecodeRunner,
    OverlapLoop,
    Phase,
    SpecStep,
    VerifyRunner,
)
from warpolicy.testing import RecModel, SimRace, sim_impl, sim_runtime

DECODE = ForwardMode.DECODE
BATCHES = ([1.0, 2.0], [3.0, 4.0, 5.0], [6.0], [7.0, 8.0, 9.0, 10.0], [1.5, 2.5])


class Violations:
    """Observer: every violation and fallback the runtime reports."""

    def __init__(self) -> None:
        self.seen: list[dict] = []
        self.fallbacks: list[str] = []

    @hookimpl
    def warpolicy_on_violation(self, runner, backend, mode, spec, bucket, step, detail):
        self.seen.append(
            dict(
                runner=runner,
                backend=backend,
                mode=mode,
                spec=spec,
                bucket=bucket,
                step=step,
                detail=detail,
            )
        )

    @hookimpl
    def warpolicy_on_fallback(self, where, error):
        self.fallbacks.append(where)


class Engine:
    """One runner, its canary and an overlap loop on a fresh simulated runtime."""

    def __init__(
        self,
        model: TableModel,
        policy: str = "in_graph",
        *,
        rate: float = 1.0,
        race: bool = True,
        canary: bool = True,
        **config,
    ) -> None:
        self.rt = sim_runtime()
        self.observer = Violations()
        self.rt.pm.register(self.observer)
        self.platform = self.rt.platform
        self.model = model
        self.canary = (
            Canary(
                self.platform,
                CanaryConfig(rate=rate, seed=3, **config),
                observers=self.rt.observers,
            )
            if canary
            else None
        )
        self.runner = DecodeRunner(
            model,
            NamedFixed(policy),
            self.platform,
            observers=self.rt.observers,
            canary=self.canary,
            self_check="off",
        )
        self.runner.capture()
        self.race = SimRace(self.platform, self.runner) if race else None
        self.loop = OverlapLoop(self.runner, probe=self.race)
        model.write_rows(0)

    def step(self, k: int, batch: list[float]) -> torch.Tensor:
        def write() -> None:
            self.model.write_rows(k + 1)

        write_next = self.race.writes(write, len(batch)) if self.race is not None else write
        return self.loop.step(batch, write_next).clone()

    def run(self, steps: int) -> list[torch.Tensor]:
        outs = [self.step(k, BATCHES[k % len(BATCHES)]) for k in range(steps)]
        self.loop.drain()
        return outs


def reference(steps: int, **model_kw) -> tuple[list[torch.Tensor], torch.Tensor]:
    """The same steps with no race and no canary: outputs and the final KV state."""
    engine = Engine(TableModel(**model_kw), race=False, canary=False)
    return engine.run(steps), engine.model.kv.clone()


def corrupted(outs, ref) -> list[int]:
    return [k for k, (a, b) in enumerate(zip(outs, ref)) if not torch.equal(a, b)]


# -- the protocols ------------------------------------------------------------------------------


def test_runners_and_models_satisfy_the_canary_protocols():
    engine = Engine(TableModel(), race=False)
    assert isinstance(engine.model, CanaryAdapter)
    assert not isinstance(RecModel(), CanaryAdapter)
    assert isinstance(engine.runner, CanaryHost)
    step = SpecStep([engine.runner])
    assert isinstance(step, CanaryHost) and step.canary is engine.canary


def test_a_model_without_canary_support_says_so_once_and_is_never_sampled():
    rt = sim_runtime()
    canary = Canary(rt.platform, CanaryConfig(rate=1.0))
    with pytest.warns(RuntimeWarning, match="never samples this runner"):
        runner = DecodeRunner(RecModel(), NamedFixed("in_graph"), rt.platform, canary=canary)
    assert runner.canary_session is None
    runner.capture()
    loop = OverlapLoop(runner)
    for _ in range(5):
        loop.step([1.0], None)
    assert canary.stats["sampled"] == 0


def test_off_by_default_and_at_rate_zero_nothing_is_touched():
    assert CanaryConfig().rate == 0
    engine = Engine(TableModel(), rate=0.0, race=False)
    assert engine.runner.canary_session is None
    engine.run(6)
    assert engine.model.spec_calls == 0 and not engine.canary.stats


# -- sampling -------------------------------------------------------------------------------------


def test_rate_one_checks_every_step_that_publishes():
    engine = Engine(TableModel(), race=False)
    engine.run(10)
    assert engine.canary.stats["sampled"] == engine.canary.stats["checked"] == 10
    assert engine.canary.stats["violations"] == 0


def test_the_rate_samples_about_that_share_of_steps():
    engine = Engine(TableModel(), rate=0.1, race=False)
    engine.run(600)
    sampled = engine.canary.stats["sampled"]
    assert 30 <= sampled <= 95, sampled  # 60 expected; binomial sd ~7.3


def test_the_budget_caps_checks_per_process(caplog):
    engine = Engine(TableModel(), race=False, budget=3)
    with caplog.at_level(logging.INFO, logger="warpolicy"):
        engine.run(10)
    assert engine.canary.stats["sampled"] == engine.canary.stats["checked"] == 3
    assert sum("budget" in r.message for r in caplog.records) == 1


def test_steps_that_publish_nothing_are_never_sampled():
    engine = Engine(TableModel(), "none", race=False)
    engine.run(5)
    assert engine.canary.stats["sampled"] == 0 and engine.model.spec_calls == 0


def test_eager_steps_are_sampled_and_checked():
    model = TableModel(buckets=(2,))
    engine = Engine(model, "post_replay", race=False)
    outs = engine.run(5)  # batches of 3 and 4 run eagerly
    assert engine.canary.stats["checked"] == 5 and engine.canary.stats["violations"] == 0
    ref, _ = reference(5, buckets=(2,))
    assert corrupted(outs, ref) == []


def test_a_sample_over_the_byte_budget_is_skipped_and_said_once():
    engine = Engine(TableModel(), race=False, max_bytes=64)
    with pytest.warns(RuntimeWarning, match="over the canary's max_bytes"):
        engine.run(4)
    assert engine.canary.stats["sampled"] == 0
    assert engine.canary.stats["skipped"] >= 2  # per step, said once per bucket


def test_an_adapter_without_a_spec_for_a_step_is_skipped():
    engine = Engine(TableModel(spec="none"), race=False)
    with pytest.warns(RuntimeWarning, match="gives no canary spec"):
        engine.run(3)
    assert engine.canary.stats["sampled"] == 0


# -- the snapshot / restore contract ------------------------------------------------------------


@pytest.mark.parametrize("spec", ["default", "rows"])
@pytest.mark.parametrize("policy", ["in_graph", "pre_replay", "post_replay"])
def test_checks_leave_serving_exactly_as_without_the_canary(policy, spec):
    """Outputs, the shared table (the scheduler's next writes) and the KV state the step
    accumulates in place are the same with a check on every step as with no canary."""
    engine = Engine(TableModel(spec=spec), policy, race=False)
    outs = engine.run(12)
    ref, kv = reference(12)
    assert engine.canary.stats["checked"] == 12 and engine.canary.stats["violations"] == 0
    assert corrupted(outs, ref) == []
    assert torch.equal(engine.model.kv, kv)  # read-modify-write state: not applied twice
    assert torch.equal(engine.model.table, torch.arange(16) * 3 + 7 * 12)


def test_the_check_runs_on_the_schedule_stream_after_the_writes_before_their_event():
    engine = Engine(TableModel(), race=False)
    log = sim_impl(engine.platform).log
    start = len(log)
    engine.step(0, [1.0, 2.0])
    entries = log[start:]
    sched = engine.loop.schedule_stream.id
    syncs = [i for i, e in enumerate(entries) if e[0] == "synchronize"]
    replays = [i for i, e in enumerate(entries) if e[0] == "replay"]
    assert len(replays) == 2 and len(syncs) == 2  # the step, then the check's replay
    records = [i for i, e in enumerate(entries) if e[0] == "record" and e[2] == sched]
    assert syncs[0] < replays[1] < syncs[1] < records[-1]  # the writes' event comes after


def test_a_check_not_called_runs_at_the_runners_next_step():
    engine = Engine(TableModel(), race=False)
    runner = engine.runner
    engine.model.write_rows(0)
    runner.run([1.0, 2.0])  # an engine without the loop: no check after its writes
    assert runner.canary_session.pending
    engine.model.write_rows(1)
    runner.run([3.0, 4.0])  # checks the first step before anything of this one
    assert engine.canary.stats["checked"] == 1 and engine.canary.stats["violations"] == 0


def test_state_the_spec_does_not_list_is_a_false_alarm_that_fails_closed():
    """A counter the step bumps in place and the spec omits: the replay applies it twice and
    the spec's comparison cannot tell; listing it makes the check faithful."""
    ref, _ = reference(6, counter=True)
    listed = Engine(TableModel(counter=True, list_counter=True), race=False)
    assert corrupted(listed.run(6), ref) == []
    assert listed.canary.stats["violations"] == 0
    unlisted = Engine(TableModel(counter=True), race=False)
    unlisted.run(1)
    assert unlisted.canary.stats["violations"] == 1  # the replay read a counter bumped twice
    assert unlisted.runner.policy_for(2) is NONE  # a false alarm still fails closed


# -- a seeded race --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "policy, late",
    [
        ("in_graph", True),  # a late reader after the marker
        ("pre_replay", False),  # a pre_replay declaration while the graph reads shared state
    ],
)
def test_a_seeded_race_is_caught_then_the_cell_runs_coarse_with_nothing_corrupted(
    policy, late, caplog
):
    steps = 10
    engine = Engine(TableModel(late=late), policy)
    with caplog.at_level(logging.ERROR, logger="warpolicy"):
        outs = engine.run(steps)
    ref, _ = reference(steps, late=late)
    bad = corrupted(outs, ref)
    # the race fired at the first step of each bucket (2, then 4), was caught there, and never
    # corrupted a step after that
    assert bad == [v["step"] for v in engine.observer.seen] == [0, 1], bad
    first = engine.observer.seen[0]
    assert first["bucket"] == 2 and first["step"] == 0 and first["backend"] == "synthetic"
    assert first["mode"] is DECODE and first["spec"] == "none" and first["runner"] == "decode"
    assert first["detail"].startswith("out[0] = ")
    assert engine.runner.policy_for(2) is NONE
    lines = [r.message for r in caplog.records if "early release caught" in r.message]
    assert lines and all(
        s in lines[0]
        for s in ("backend synthetic", "mode decode", "bucket 2", "step 0", "out[0] = ")
    )


def test_every_race_the_reference_sees_is_caught_across_buckets():
    """Each bucket races once (both are sampled every step), is caught, then runs coarse."""
    engine = Engine(TableModel(late=True))
    outs = engine.run(10)
    ref, _ = reference(10, late=True)
    caught = {v["step"] for v in engine.observer.seen}
    assert set(corrupted(outs, ref)) == caught == {0, 1}  # bucket 2, then bucket 4
    assert {v["bucket"] for v in engine.observer.seen} == {2, 4}
    assert engine.runner.policy_for(2) is engine.runner.policy_for(4) is NONE


def test_a_late_kv_write_is_caught_through_the_state_not_the_output():
    """The race shows only where the step wrote (the KV state), not in its returned output."""
    engine = Engine(TableModel(late=True, compare_output=False))
    engine.run(3)
    assert engine.observer.seen and engine.observer.seen[0]["detail"].startswith("state['kv']")


def test_no_race_no_violation_over_many_sampled_steps():
    engine = Engine(TableModel(), race=True)
    engine.run(200)
    assert engine.canary.stats["checked"] == 200 and engine.canary.stats["violations"] == 0


def test_a_nondeterministic_forward_needs_its_tolerance():
    quiet = Engine(TableModel(noise=1e-4, tolerance=Tolerance(atol=1e-3)), race=False)
    quiet.run(20)
    assert quiet.canary.stats["violations"] == 0
    strict = Engine(TableModel(noise=1e-4), race=False)
    strict.run(2)
    assert strict.canary.stats["violations"] >= 1  # bitwise: a false alarm, failing closed


# -- demotion: the documented path, for the rest of the process ----------------------------------


def test_demotion_replaces_the_release_and_survives_a_recapture():
    engine = Engine(TableModel(late=True))
    before = engine.runner.release_of(2)
    assert before.policy is IN_GRAPH
    engine.run(1)
    after = engine.runner.release_of(2)
    assert after is not before and before.policy is IN_GRAPH  # never changed in place
    assert after.policy is NONE and after.event is None and "canary" in after.reason
    assert engine.runner.demoted.keys() == {2}
    engine.loop.drain()
    engine.runner.capture()
    assert engine.runner.policy_for(2) is NONE and engine.runner.policy_for(4) is IN_GRAPH


def test_a_demoted_cell_is_demoted_in_every_runner_of_the_canary():
    engine = Engine(TableModel(late=True))
    engine.run(1)
    kw = dict(observers=engine.rt.observers, canary=engine.canary, self_check="off")
    same = DecodeRunner(TableModel(), NamedFixed("in_graph"), engine.platform, **kw)
    other = DecodeRunner(
        TableModel(), NamedFixed("in_graph", backend="other"), engine.platform, name="o", **kw
    )
    for runner in (same, other):
        runner.capture()
        runner.run([1.0, 2.0])
    assert same.policy_for(2) is NONE and same.policy_for(4) is IN_GRAPH
    assert other.policy_for(2) is IN_GRAPH


def test_the_violation_hook_fires_after_the_demotion():
    seen = []

    class Checker:
        @hookimpl
        def warpolicy_on_violation(self, runner, bucket):
            seen.append(engine.runner.policy_for(bucket))

    engine = Engine(TableModel(late=True))
    engine.rt.pm.register(Checker())
    engine.run(1)
    assert seen == [NONE]


def test_a_violation_is_an_nvtx_mark(monkeypatch):
    calls = []
    module = types.ModuleType("torch.cuda.nvtx")
    module.range_push = lambda msg: calls.append(("push", msg))
    module.range_pop = lambda: calls.append(("pop", ""))
    module.mark = lambda msg: calls.append(("mark", msg))
    monkeypatch.setitem(sys.modules, "torch.cuda.nvtx", module)
    engine = Engine(TableModel(late=True))
    engine.rt.pm.register(wnvtx.NvtxPlugin())
    engine.run(1)
    marks = [m for kind, m in calls if kind == "mark" and "VIOLATION" in m]
    assert marks == [marks[0]] and marks[0].startswith(
        "warpolicy VIOLATION decode decode bucket 2 step 0: out[0] = "
    )


# -- the canary's own failures fail closed ---------------------------------------------------------


def test_an_adapter_that_raises_makes_its_cell_coarse_and_is_reported():
    engine = Engine(TableModel(spec="raise"), race=False)
    with pytest.warns(RuntimeWarning, match="canary failed in begin"):
        engine.run(3)
    assert engine.runner.policy_for(2) is NONE and engine.runner.policy_for(4) is NONE
    assert "canary 'decode':begin" in engine.observer.fallbacks
    assert engine.canary.stats["failures"] == 2 and not engine.observer.seen


def test_a_keyboard_interrupt_in_the_canary_fails_closed_then_propagates():
    engine = Engine(TableModel(spec="interrupt"), race=False)
    with pytest.warns(RuntimeWarning, match="canary failed"), pytest.raises(KeyboardInterrupt):
        engine.step(0, [1.0, 2.0])
    assert engine.runner.policy_for(2) is NONE  # coarse before the interrupt propagated
    engine.loop.drain()
    out = engine.step(1, [1.0, 2.0])  # serving goes on, coarse, correct
    assert out.tolist() == [2.0 + 0.0, 4.0 + 3.0]  # the rows as step 0 left them


@pytest.mark.parametrize("mode", ["raise", "act_then_raise"])
def test_a_replay_failing_inside_the_check_puts_the_live_state_back(mode):
    engine = Engine(TableModel(), race=False)
    impl = sim_impl(engine.platform)
    checking = {"on": False}
    impl.inject("replay", mode, when=lambda: checking["on"])
    session = engine.runner.canary_session
    real_check = session.check

    def check():
        checking["on"] = True
        try:
            return real_check()
        finally:
            checking["on"] = False

    session.check = check  # the loop resolved runner.check_canary, which calls session.check
    with pytest.warns(RuntimeWarning, match="canary failed in check"):
        outs = engine.run(4)
    ref, kv = reference(4)
    assert corrupted(outs, ref) == []
    assert torch.equal(engine.model.kv, kv) and torch.equal(
        engine.model.table, torch.arange(16) * 3 + 28
    )
    assert engine.runner.policy_for(2) is NONE and not engine.observer.seen


def test_a_full_barrier_that_fails_touches_nothing():
    engine = Engine(TableModel(), race=False)
    impl = sim_impl(engine.platform)
    session = engine.runner.canary_session
    real_check = session.check

    fired = []

    def check():
        fault = impl.inject("synchronize", "raise")
        try:
            return real_check()
        finally:
            impl.clear_faults()
            fired.append(fault.fired)

    session.check = check
    with pytest.warns(RuntimeWarning, match="canary failed in check"):
        outs = engine.run(3)
    assert fired == [1, 1, 0]  # buckets 2 and 4 failed closed; the third step is coarse
    ref, kv = reference(3)
    assert corrupted(outs, ref) == [] and torch.equal(engine.model.kv, kv)


def test_live_state_that_cannot_be_put_back_raises_canary_error():
    class Stubborn(Whole):
        loads = 0

        def load(self, saved):
            Stubborn.loads += 1
            if Stubborn.loads > 1:  # the pre-step load works, putting the live one back fails
                raise RuntimeError("device lost")
            super().load(saved)

    model = TableModel()
    engine = Engine(model, race=False)
    model.canary_spec = lambda mode, bucket, batch: CanarySpec(
        inputs={"table": Stubborn(model.table)}
    )
    with pytest.warns(RuntimeWarning, match="canary failed in check"), pytest.raises(CanaryError):
        engine.step(0, [1.0, 2.0])
    assert engine.runner.policy_for(2) is NONE


# -- an engine that owns its steps: the session API -----------------------------------------------


def test_an_engine_drives_a_session_by_hand_and_swaps_its_own_release():
    rt = sim_runtime()
    p = rt.platform
    model = TableModel(late=True)
    observer = Violations()
    rt.pm.register(observer)
    canary = Canary(p, CanaryConfig(rate=1.0), observers=rt.observers)
    demoted = []
    session = canary.session(
        "engine", DECODE, backend="mine", spec="none", on_demote=lambda b, r: demoted.append(b)
    )
    # the engine's own "graph": its runner, used only for capture and a graph to replay
    runner = DecodeRunner(model, NamedFixed("in_graph"), p, self_check="off")
    runner.capture()
    graph, release = runner.captured[2].graph, runner.captured[2].release
    race = SimRace(p, runner)
    sched = p.new_stream()
    model.write_rows(0)

    def rerun():
        p.replay(graph)
        return model.out[2]

    for k in range(3):
        assert session.step() is True
        step_release = session.release_for(2, release)
        model.host_prep([1.0, 2.0], 2)
        sample = session.begin(
            2,
            k,
            step_release,
            lambda: model.canary_spec(DECODE, 2, None),
            model.shared_buffers,
            rerun,
        )
        assert (sample is None) == (k > 0)  # demoted after step 0: nothing to check
        write_next = race.writes(lambda k=k: model.write_rows(k + 1), 2)
        race.mark("launch", p.current_stream())
        runner.fence.before_replay(step_release)
        p.replay(graph)
        runner.fence.after_replay(step_release)
        race.mark("launched", None)
        if sample is not None:
            session.observe(sample, model.out[2])
        runner.fence.take()  # the engine's barrier would wait on it (the sim needs none)
        with p.stream(sched):
            write_next()
            violation = session.check()
        assert (violation is not None) == (k == 0)
    assert demoted == [2] and observer.seen[0]["backend"] == "mine"
    coarse = session.release_for(2, release)
    assert coarse.policy is NONE and release.policy is IN_GRAPH
    assert isinstance(coarse, BucketRelease)


def test_spec_step_phases_are_checked_by_the_loop():
    rt = sim_runtime()
    canary = Canary(rt.platform, CanaryConfig(rate=1.0), observers=rt.observers)
    model = TableModel(buckets=(2, 4))
    kw = dict(observers=rt.observers, canary=canary, self_check="off")
    verify = VerifyRunner(model, NamedFixed("in_graph"), rt.platform, draft_tokens=2, **kw)
    draft = DecodeRunner(TableModel(), NamedFixed("post_replay"), rt.platform, name="d", **kw)
    step = SpecStep([Phase(verify), Phase(draft)])
    step.capture()
    loop = OverlapLoop(step)
    for k in range(4):
        loop.step([1.0, 2.0], lambda k=k: model.write_rows(k + 1))
    assert canary.stats["checked"] == 8 and canary.stats["violations"] == 0


def test_rows_and_whole_snapshots_save_and_load():
    t = torch.arange(10.0)
    rows = Rows(t, torch.tensor([1, 3]))
    saved = rows.save()
    t.zero_()
    rows.load(saved)
    assert t.tolist() == [0, 1, 0, 3, 0, 0, 0, 0, 0, 0]
    assert rows.nbytes == 2 * 4 and Whole(t).nbytes == 40
    assert TableModel().kv.numel() == SLOTS
    for bad in (
        lambda: Rows(t, torch.tensor([[1]])),
        lambda: Rows(t, torch.tensor([1.0])),
        lambda: Rows(t, torch.tensor([1]), dim=2),
        lambda: Whole([1, 2]),
    ):
        with pytest.raises(Exception, match="canary"):
            bad()


def test_policies_other_than_in_graph_are_checked_too():
    for policy in (PRE_REPLAY, POST_REPLAY):
        engine = Engine(TableModel(), policy.label, race=False)
        engine.run(3)
        assert engine.canary.stats["checked"] == 3


def test_a_recapture_drops_a_sample_of_the_old_graph_unchecked():
    engine = Engine(TableModel(), race=False)
    engine.runner.run([1.0, 2.0])  # no loop: the sample waits for its check
    assert engine.runner.canary_session.pending
    engine.runner.capture()
    assert not engine.runner.canary_session.pending
    assert engine.canary.stats["discarded"] == 1 and engine.canary.stats["checked"] == 0


@pytest.mark.parametrize("error", [RuntimeError, KeyboardInterrupt])
def test_an_observer_that_raises_on_a_violation_changes_nothing_that_matters(error):
    class Raising:
        raised = False

        @hookimpl
        def warpolicy_on_violation(self, runner):
            if not Raising.raised:  # once: a second KeyboardInterrupt would stop pytest
                Raising.raised = True
                raise error("observer broke")

    engine = Engine(TableModel(late=True))
    engine.rt.pm.register(Raising())
    if error is KeyboardInterrupt:  # propagates, after the demotion and the put-back
        with pytest.raises(KeyboardInterrupt):
            engine.step(0, BATCHES[0])
        engine.loop.drain()
        outs = [engine.step(k, BATCHES[k]) for k in range(1, 5)]
    else:
        with pytest.warns(RuntimeWarning, match="observer plugin"):
            outs = engine.run(5)[1:]
    assert engine.runner.policy_for(2) is NONE
    assert engine.canary.stats["violations"] >= 1
    ref, _ = reference(5, late=True)
    bad = [k for k, (a, b) in enumerate(zip(outs, ref[1:]), start=1) if not torch.equal(a, b)]
    assert bad == [1]  # bucket 4's first step races (and is caught); bucket 2 stays coarse
