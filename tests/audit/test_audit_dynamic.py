"""The dynamic race audit (`warpolicy.audit.dynamic`) on CPU tensors: whole audits through the
simulated platform (the race in program order), and the GPU code path run in program order by
presenting the simulated platform under another name."""

from __future__ import annotations

import inspect

import attrs
import pytest
import torch

import warpolicy.audit.dynamic as dynamic
import warpolicy.audit.static as static
from warpolicy.audit import (
    MIN_TRIALS,
    AuditSubject,
    StalledModel,
    Verdict,
    run_audit,
    stalled_model,
)
from warpolicy.audit.dynamic import audit_mode
from warpolicy.audit.poison import default_poison, plus_one
from warpolicy.audit.synthetic import make_synthetic
from warpolicy.registry.vocabulary import IN_GRAPH, NONE, POST_REPLAY, PRE_REPLAY, ForwardMode
from warpolicy.runtime.runners import DecodeRunner
from warpolicy.runtime.runners.protocols import CanaryAdapter
from warpolicy.testing import sim_platform

from audit_subjects import (
    CountingModel,
    DroppingRunner,
    KVModel,
    RenamedPlatform,
    TrialBatch,
    fixed,
    table_subject,
    trial_rows,
)

SAFE, UNSAFE, INCONCLUSIVE = Verdict.SAFE, Verdict.UNSAFE, Verdict.INCONCLUSIVE
DECODE = ForwardMode.DECODE


@pytest.fixture
def gpu_path(monkeypatch):
    """A platform the audit treats as a real device, with a (no-op) stall: the GPU code path
    (head stall, take, barrier, poison on the schedule stream) in program order on CPU."""
    monkeypatch.setattr(dynamic, "make_stall", lambda platform, us: lambda: None)
    return RenamedPlatform(sim_platform(), "gpu")


class TestWholeAudits:
    def test_safe_subject_is_safe_and_shared_state_restored(self):
        subject = table_subject(IN_GRAPH)
        before = subject.model.table.clone()
        entry = audit_mode(subject, DECODE, trials=4)
        assert entry.dynamic.verdict is SAFE and entry.dynamic.trials == 4
        assert entry.policy is IN_GRAPH and entry.declared is IN_GRAPH
        assert torch.equal(subject.model.table, before)

    def test_first_differing_trial_is_recorded(self):
        entry = audit_mode(table_subject(IN_GRAPH, late_from=3), DECODE, trials=6)
        assert entry.verdict is UNSAFE
        assert entry.dynamic.first.trial == 3
        assert entry.dynamic.corrupted == 3  # trials 3, 4, 5
        assert entry.dynamic.first.output == "out" and entry.dynamic.first.index == (0,)

    @pytest.mark.parametrize(
        "policy, verdict", [(IN_GRAPH, SAFE), (POST_REPLAY, SAFE), (PRE_REPLAY, UNSAFE)]
    )
    def test_release_point_matters(self, policy, verdict):
        # the table is read in the in-graph prep: sound for in_graph, unsound for pre_replay
        assert audit_mode(table_subject(policy), DECODE, trials=2).verdict is verdict

    def test_none_policy_is_inconclusive_nothing_to_audit(self):
        entry = audit_mode(table_subject(NONE), DECODE, trials=3)
        assert entry.verdict is INCONCLUSIVE
        assert "nothing to audit" in entry.dynamic.reason and entry.dynamic.trials == 0
        assert "nothing to audit" in entry.static.reason

    def test_demoted_declaration_is_inconclusive(self):
        entry = audit_mode(table_subject(POST_REPLAY, declared=IN_GRAPH), DECODE, trials=2)
        assert entry.verdict is INCONCLUSIVE
        assert "declared in_graph but the runner published post_replay" in entry.dynamic.reason

    def test_no_external_events_demotes_in_graph_and_says_so(self):
        report = run_audit(
            synthetic="late_swa_read", trials=2, platform=sim_platform(external_events=False)
        )
        for entry in report.entries:
            assert entry.policy is POST_REPLAY and entry.verdict is INCONCLUSIVE
            assert "demoted" in entry.dynamic.reason

    def test_eager_step_is_noted(self):
        subject = table_subject(IN_GRAPH)
        big = attrs.evolve(
            subject, make_batch=lambda mode, trial: TrialBatch(trial, torch.arange(6) % 10)
        )  # larger than every bucket: eager
        entry = audit_mode(big, DECODE, trials=2)
        assert entry.verdict is INCONCLUSIVE
        assert "ran eagerly" in entry.dynamic.reason

    def test_missing_runner_is_inconclusive(self):
        entry = audit_mode(table_subject(IN_GRAPH), ForwardMode.EXTEND, trials=2)
        assert entry.verdict is INCONCLUSIVE
        assert "no runner for mode extend" in entry.dynamic.reason

    def test_failing_subject_is_a_failed_entry_not_a_crash(self):
        entry = audit_mode(table_subject(IN_GRAPH, fail=True), DECODE, trials=2)
        assert entry.verdict is INCONCLUSIVE and entry.dynamic.failed
        assert "audit failed: RuntimeError: boom in forward" in entry.dynamic.reason

    def test_static_audit_on_the_simulated_platform_is_unavailable(self):
        entry = audit_mode(table_subject(IN_GRAPH), DECODE, trials=2)
        assert entry.static.verdict is INCONCLUSIVE
        assert entry.static.reason.startswith("static audit unavailable: platform 'sim'")

    def test_failure_mid_trial_restores_shared_state(self):
        subject = table_subject(IN_GRAPH)
        before = subject.model.table.clone()
        calls = []

        def post_step(mode, batch, out):
            calls.append(1)
            if len(calls) == 4:  # the second trial's poisoned step, after the poison landed
                raise RuntimeError("late failure")
            return out.clone()

        entry = audit_mode(attrs.evolve(subject, post_step=post_step), DECODE, trials=3)
        assert entry.verdict is INCONCLUSIVE and "late failure" in entry.dynamic.reason
        assert torch.equal(subject.model.table, before)

    def test_stalled_model_stalls_before_each_segment_and_delegates(self):
        calls = []
        model = table_subject().model
        stalled = StalledModel(model, lambda: calls.append("stall"))
        stalled.prepare_bucket(2)
        stalled.graph_prep(2)
        stalled.forward(2)
        assert calls == ["stall", "stall"]
        assert stalled.shared_buffers is model.shared_buffers
        assert stalled.bucket_sizes(DECODE) == (2, 4)

    def test_a_stalled_canary_model_stays_a_canary_adapter_statically(self):
        """Python 3.12's protocol isinstance reads class attributes only: a wrapper that
        delegates through __getattr__ would never be sampled by the canary there."""
        model = make_synthetic("in_graph", platform=sim_platform()).model
        stalled = stalled_model(model, lambda: None)
        assert isinstance(stalled, CanaryAdapter)
        assert inspect.getattr_static(stalled, "canary_spec") is not None
        plain = stalled_model(table_subject().model, lambda: None)
        assert type(plain) is StalledModel and not hasattr(type(plain), "canary_spec")


class TestNeverSafeForWhatWasNotChecked:
    def test_poison_is_taken_from_the_state_make_batch_wrote(self):
        """make_batch may write shared state; the poison must differ from *that* state."""
        subject = table_subject(IN_GRAPH, late_from=0)
        table = subject.model.table
        before = table.clone()
        trial_state = default_poison(before)  # what a poison of the pre-audit state would be

        def make_batch(mode, trial):
            table.copy_(trial_state)
            return TrialBatch(trial, trial_rows(trial))

        entry = audit_mode(attrs.evolve(subject, make_batch=make_batch), DECODE, trials=3)
        assert entry.verdict is UNSAFE and entry.dynamic.corrupted == 3
        assert torch.equal(table, before)  # left as found

    def test_poisoned_step_starts_from_the_reference_steps_state(self):
        platform = sim_platform()
        model = CountingModel()
        subject = AuditSubject(
            name="count",
            model=model,
            platform=platform,
            make_batch=lambda mode, trial: TrialBatch(trial, trial_rows(trial)),
            runners={"decode": lambda m: DecodeRunner(m, fixed(POST_REPLAY), platform)},
            declared={"decode": POST_REPLAY},
        )
        entry = audit_mode(subject, DECODE, trials=3)
        assert entry.verdict is SAFE, entry.dynamic  # no false alarm from the counter
        assert model.count.item() == 4  # as capture left it (2 warm-ups, 2 captures)

    def test_no_shared_buffers_is_inconclusive(self):
        subject = table_subject(IN_GRAPH)
        subject.model.shared_buffers = {}
        entry = audit_mode(subject, DECODE, trials=2)
        assert entry.verdict is INCONCLUSIVE and "nothing to poison" in entry.dynamic.reason

    def test_a_poison_that_changes_nothing_is_inconclusive(self):
        subject = attrs.evolve(table_subject(IN_GRAPH), poison={"table": lambda t: t.clone()})
        entry = audit_mode(subject, DECODE, trials=2)
        assert entry.verdict is INCONCLUSIVE
        assert "poison of 'table' leaves 10 of 10 elements unchanged" in entry.dynamic.reason

    def test_a_poison_that_misses_one_element_is_inconclusive(self):
        def all_but_the_last(t):
            p = default_poison(t)
            p[-1] = t[-1]
            return p

        subject = attrs.evolve(table_subject(IN_GRAPH), poison={"table": all_but_the_last})
        entry = audit_mode(subject, DECODE, trials=2)
        assert entry.verdict is INCONCLUSIVE
        assert "poison of 'table' leaves 1 of 10 elements unchanged" in entry.dynamic.reason

    def test_a_platform_without_stalls_is_inconclusive(self):
        platform = RenamedPlatform(sim_platform(), "rocm")
        entry = audit_mode(table_subject(IN_GRAPH, platform=platform), DECODE, trials=2)
        assert entry.verdict is INCONCLUSIVE
        assert "no GPU stall on platform 'rocm'" in entry.dynamic.reason

    def test_every_trial_must_exercise_the_declaration_not_just_the_last(self):
        subject = table_subject(IN_GRAPH)

        def make_batch(mode, trial):  # trials 0 and 1 fit no bucket (eager), then both buckets
            return TrialBatch(trial, torch.arange(6) % 10 if trial < 2 else trial_rows(trial))

        entry = audit_mode(attrs.evolve(subject, make_batch=make_batch), DECODE, trials=4)
        assert entry.verdict is INCONCLUSIVE
        assert "2 of 4 trials ran eagerly" in entry.dynamic.reason
        assert "published post_replay" in entry.dynamic.reason
        assert "in 2 of 4 trials" in entry.dynamic.reason


class TestExtraOutputs:
    """A late read whose only effect is *where* the step writes (a KV pool) is caught when
    the subject names the pool."""

    def _subject(self, late: bool, extra: bool) -> AuditSubject:
        model = KVModel(late)
        return table_subject(IN_GRAPH, model=model, extra_outputs={"kv": model.kv} if extra else {})

    def test_late_kv_write_is_unsafe_when_the_pool_is_compared(self):
        entry = audit_mode(self._subject(late=True, extra=True), DECODE, trials=4)
        assert entry.verdict is UNSAFE and entry.dynamic.first.output == "kv"

    def test_returned_outputs_alone_cannot_see_it(self):
        # the blind spot extra_outputs closes (and a positive control for the test above)
        assert audit_mode(self._subject(late=True, extra=False), DECODE, trials=4).verdict is SAFE

    def test_no_false_alarm_and_the_pool_is_put_back(self):
        model = KVModel(late=False)
        after_capture = []

        class Recording(DecodeRunner):
            def capture(self):
                super().capture()
                after_capture.append(model.kv.clone())

        subject = table_subject(
            IN_GRAPH, model=model, runner_cls=Recording, extra_outputs={"kv": model.kv}
        )
        entry = audit_mode(subject, DECODE, trials=4)
        assert entry.verdict is SAFE, entry.dynamic
        assert torch.equal(model.kv, after_capture[0])  # the trials' writes were undone
        assert int(model.table[trial_rows(1)[0]]) == 11  # trial 1 writes slot 11 ...
        assert model.kv[11] == 0  # ... which capture never wrote: the audit put it back


class TestCoverage:
    def test_trials_must_replay_every_captured_bucket(self):
        subject = attrs.evolve(
            table_subject(IN_GRAPH),
            make_batch=lambda mode, trial: TrialBatch(trial, torch.tensor([1, 2])),
        )  # bucket 2 only
        entry = audit_mode(subject, DECODE, trials=5)
        assert entry.verdict is INCONCLUSIVE
        assert "no trial replayed captured bucket(s) 4" in entry.dynamic.reason

    def test_static_audit_walks_every_captured_bucket(self, monkeypatch):
        walked = []
        real = static.audit_static
        monkeypatch.setattr(
            static,
            "audit_static",
            lambda runner, bucket, *a, **k: (walked.append(bucket), real(runner, bucket, *a, **k))[
                1
            ],
        )
        subject = attrs.evolve(
            table_subject(IN_GRAPH),
            make_batch=lambda mode, trial: TrialBatch(trial, torch.tensor([1, 2])),
        )  # replays bucket 2
        audit_mode(subject, DECODE, trials=2)
        assert walked == [2, 4]

    def test_minimum_trials_on_a_real_device(self, gpu_path):
        few = audit_mode(table_subject(IN_GRAPH, platform=gpu_path), DECODE, trials=4)
        assert few.verdict is INCONCLUSIVE
        assert (
            f"only 4 trial(s) checked; a SAFE verdict on a real device needs at least "
            f"{MIN_TRIALS}" in few.dynamic.reason
        )
        enough = audit_mode(table_subject(IN_GRAPH, platform=gpu_path), DECODE, trials=MIN_TRIALS)
        assert enough.verdict is SAFE, enough.dynamic


class TestSamePublication:
    """The poisoned step must publish what the reference step did: a poisoned step that
    published nothing is waited on coarsely, races with nothing, and proves nothing."""

    def test_gpu_path(self, gpu_path):
        # one poison: every trial is a reference step (published) then a poisoned step (not)
        subject = table_subject(
            IN_GRAPH, platform=gpu_path, runner_cls=DroppingRunner, poison={"table": plus_one}
        )
        entry = audit_mode(subject, DECODE, trials=MIN_TRIALS)
        assert entry.verdict is INCONCLUSIVE and entry.dynamic.trials == 0
        assert (
            "trial 0: the poisoned step published nothing (bucket 2), the reference step "
            "in_graph (bucket 2)" in entry.dynamic.reason
        )

    def test_only_the_poisoned_steps_that_match_count(self, gpu_path):
        # three poisons: the 2nd poisoned step of each trial publishes, the 1st and 3rd do not
        subject = table_subject(IN_GRAPH, platform=gpu_path, runner_cls=DroppingRunner)
        entry = audit_mode(subject, DECODE, trials=MIN_TRIALS)
        assert entry.verdict is INCONCLUSIVE and entry.dynamic.trials == MIN_TRIALS
        assert (
            f"{2 * MIN_TRIALS} poisoned step(s) did not publish what the reference step did"
            in entry.dynamic.reason
        )

    def test_simulated_path(self):
        entry = audit_mode(table_subject(IN_GRAPH, runner_cls=DroppingRunner), DECODE, trials=4)
        assert entry.verdict is INCONCLUSIVE and not entry.dynamic.failed
        assert "the poisoned step published nothing" in entry.dynamic.reason
