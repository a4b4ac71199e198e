"""Per-batch decisions in the runners (`warpolicy.runtime.batch`) on the simulated platform:
the facts a step reports, the action hook and how its answers combine, every failure later and
never earlier, routers, `SpecStep` handing verify's event after ``draft_extend_staged``, and the
max rule as a property."""

from __future__ import annotations

import warnings
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from warpolicy.registry.engine import PolicyEngine
from warpolicy.registry.vocabulary import ForwardMode, WarReadDonePolicy
from warpolicy.runtime.batch import BatchPlan, effective_policy
from warpolicy.runtime.fence import ReadDoneFence
from warpolicy.runtime.hookspecs import hookimpl
from warpolicy.runtime.observers import NO_OBSERVERS, Reporter
from warpolicy.runtime.owned_capture import ReadDoneCapture, cell_policy
from warpolicy.runtime.release import BucketRelease
from warpolicy.runtime.runners import (
    DecodeRunner,
    DraftExtendRunner,
    PrefillRunner,
    SpecStep,
    VerifyRunner,
)
from warpolicy.testing import RecModel, sim_runtime
from warpolicy.testing.perbatch import (
    SNAPSHOT_ACTION,
    ActionPlugin,
    always,
    perbatch_policy,
)

P = WarReadDonePolicy
M = ForwardMode
BUCKETS = (32, 64, 128)  # THRESHOLD = 64: 32 and 64 need no snapshot, 128 does


class Interrupt(KeyboardInterrupt):
    """A KeyboardInterrupt subclass (a real Ctrl-C still stops the test run)."""


class Broken(RuntimeError):
    pass


@pytest.fixture(scope="module")
def policy():
    return perbatch_policy()


def prefill(policy, *answers, buckets=BUCKETS, observers: Any = None, model=None):
    """A captured prefill runner on a fresh sim runtime, one `ActionPlugin` per answer."""
    rt = sim_runtime()
    plugins = []
    for i, answer in enumerate(answers):
        plugin = ActionPlugin(answer if callable(answer) else always(answer))
        rt.pm.register(plugin, name=f"action{i}")
        plugins.append(plugin)
    if observers is not None:
        rt.pm.register(observers, name="watch")
    runner = PrefillRunner(model or RecModel(buckets), policy, rt.platform, observers=rt.observers)
    runner.capture()
    return runner, plugins


def step(runner, size: int) -> tuple[P | None, Any]:
    """Run a batch of ``size`` tokens; what the scheduler takes (its policy, or None)."""
    runner.run([1.0] * size)
    taken = runner.fence.take()
    if taken is None:
        return None, runner.last_step
    taken.discard()  # no barrier waits on it: its ring event may be recorded again
    return taken.policy, runner.last_step


# -- the capture-time decision and the facts --------------------------------------------------------


def test_buckets_are_captured_for_the_earliest_policy_any_batch_can_get(policy):
    assert policy.lookup(M.EXTEND) is P.NONE  # a batch that reports nothing
    runner, _ = prefill(policy)
    assert {b: c.policy for b, c in runner.captured.items()} == dict.fromkeys(BUCKETS, P.PRE_REPLAY)
    assert all(c.batch is not None for c in runner.captured.values())


@pytest.mark.parametrize("size, bucket", [(1, 32), (32, 32), (40, 64), (64, 64)])
def test_at_or_below_the_threshold_no_action_runs_and_the_release_is_early(policy, size, bucket):
    runner, (plugin,) = prefill(policy, True)
    taken, info = step(runner, size)
    assert taken is P.PRE_REPLAY and info.policy is P.PRE_REPLAY
    assert info.facts == {"num_qo_tokens": bucket}  # the padded graph size
    assert plugin.calls == []  # the batch needs no snapshot: the action is not performed


def test_the_padded_graph_size_is_what_the_forward_sees(policy):
    runner, (plugin,) = prefill(policy, True)
    taken, info = step(runner, 65)  # 65 tokens in the 128 bucket
    assert info.facts == {"num_qo_tokens": 128, SNAPSHOT_ACTION: True}
    assert plugin.calls == [(SNAPSHOT_ACTION, "extend", M.EXTEND, 128)]
    assert taken is P.PRE_REPLAY


def test_an_eager_batch_reports_its_token_count(policy):
    runner, (plugin,) = prefill(policy, False)
    taken, info = step(runner, 200)  # beyond the largest bucket: eager
    assert info.bucket is None and info.facts == {"num_qo_tokens": 200}
    assert plugin.calls == [(SNAPSHOT_ACTION, "extend", M.EXTEND, None)]
    assert taken is None and info.policy is P.NONE and info.decided is P.NONE
    taken, info = step(runner, 50)  # fits the 64 bucket
    assert taken is P.PRE_REPLAY


def test_a_cell_without_facts_does_no_per_batch_work(policy):
    rt = sim_runtime()
    plugin = ActionPlugin(always(True))
    rt.pm.register(plugin, name="action")
    runner = DecodeRunner(RecModel((1, 2)), policy, rt.platform, observers=rt.observers)
    runner.capture()
    assert all(c.batch is None for c in runner.captured.values())
    runner.run([1.0, 2.0])
    assert runner.fence.take().policy is P.IN_GRAPH
    assert runner.last_step.facts is None and plugin.calls == []


# -- every failure is later, never earlier -----------------------------------------------------------


FAILURES = {
    "no implementation": (),
    "False": (False,),
    "None": (None,),
    "truthy int": (1,),
    "truthy str": ("yes",),
    "exception": (Broken("snapshot failed"),),
    "True and False": (True, False),
    "a False among Trues": (True, False, True),
    "True and a raise": (True, Broken("x")),
    "True and a non-bool": (True, 1),
    "None and None": (None, None),
}


@pytest.mark.parametrize("answers", list(FAILURES.values()), ids=list(FAILURES))
def test_every_failed_action_is_later(policy, answers):
    runner, _ = prefill(policy, *answers)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        taken, info = step(runner, 100)
    assert taken is None and info.policy is P.NONE and info.decided is P.NONE
    assert SNAPSHOT_ACTION not in info.facts
    taken, _ = step(runner, 10)  # the next small batch is early again
    assert taken is P.PRE_REPLAY


@pytest.mark.parametrize("answers", [(True,), (True, None), (None, True, None)])
def test_the_action_succeeds_only_with_a_true_and_nothing_else(policy, answers):
    runner, plugins = prefill(policy, *answers)
    taken, info = step(runner, 100)
    assert taken is P.PRE_REPLAY and info.facts[SNAPSHOT_ACTION] is True
    assert all(len(p.calls) == 1 for p in plugins)  # every implementation asked once


def test_no_action_implementation_is_said_once(policy):
    runner, _ = prefill(policy)
    with pytest.warns(RuntimeWarning, match="no warpolicy_batch_action implementation"):
        taken, _ = step(runner, 100)
    assert taken is None
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        step(runner, 100)
        assert step(runner, 10)[0] is P.PRE_REPLAY  # a batch that needs no action: no warning


def test_an_exception_reaches_the_fallback_observers(policy):
    seen = []

    class Watch:
        @hookimpl
        def warpolicy_on_fallback(self, where, error):
            seen.append((where, type(error).__name__))

    runner, _ = prefill(policy, Broken("x"), observers=Watch())
    with pytest.warns(RuntimeWarning, match="per-batch action 'synthetic_snapshot'"):
        step(runner, 100)
    step(runner, 100)
    assert seen == [("extend runner:batch_action", "Broken")] * 2


def test_a_non_bool_answer_is_warned_about_once(policy):
    runner, _ = prefill(policy, 1)
    with pytest.warns(RuntimeWarning, match=r"answered 1, not True/False/None"):
        step(runner, 100)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        step(runner, 100)  # counted, not warned again
    assert runner.reporter.counts["warning:batch_action:synthetic_snapshot:action0"] == 2


@pytest.mark.parametrize("error", [Interrupt(), SystemExit(3)], ids=["KeyboardInterrupt", "exit"])
def test_a_base_exception_makes_the_step_coarse_then_propagates(policy, error):
    runner, _ = prefill(policy, error)
    step(runner, 10)
    # an untaken publish of the step before must not pass as this step's
    runner.run([1.0] * 10)
    with pytest.raises(type(error)):
        runner.run([1.0] * 100)
    assert runner.fence.take() is None
    assert runner.last_step.policy is P.NONE and runner.last_step.decided is P.NONE


def test_a_hook_wrapper_is_one_whole_call_and_its_results_combine(policy):
    class Wrapper:
        @hookimpl(wrapper=True)
        def warpolicy_batch_action(self, action):
            return (yield)

    runner, plugins = prefill(policy, True, observers=Wrapper())
    taken, info = step(runner, 100)
    assert taken is P.PRE_REPLAY and len(plugins[0].calls) == 1
    runner2, _ = prefill(policy, True, False, observers=Wrapper())
    taken, info = step(runner2, 100)
    assert taken is None


def test_a_demoted_bucket_does_no_per_batch_work(policy):
    runner, (plugin,) = prefill(policy, True)
    runner.demote(128, "canary")
    taken, info = step(runner, 100)
    assert taken is None and plugin.calls == [] and info.facts is None


def test_a_rule_that_raises_makes_the_batch_coarse(policy):
    runner, _ = prefill(policy, True)
    per = runner.captured[128].batch

    def broken(facts=None):
        raise Broken("rule")

    object.__setattr__(per.plan, "rule", broken)
    with pytest.warns(RuntimeWarning, match="per-batch lookup raised"):
        taken, _ = step(runner, 100)
    assert taken is None


def test_a_policy_whose_rule_cannot_be_read_keeps_the_later_answer(policy):
    class NoRules:
        def lookup(self, mode, eager=False, planted=True):
            return policy.lookup(mode, eager, planted)

        def rule(self, mode, eager=False, planted=True):
            raise Broken("no rules")

    rt = sim_runtime()
    runner = PrefillRunner(RecModel(BUCKETS), NoRules(), rt.platform, observers=rt.observers)
    with pytest.warns(RuntimeWarning, match="per-batch rule of extend failed"):
        runner.capture()
    assert {c.policy for c in runner.captured.values()} == {P.NONE}


# -- observers ------------------------------------------------------------------------------------------


def test_decision_observers_see_a_later_per_batch_decision_once_per_bucket_and_policy(policy):
    seen = []

    class Watch:
        @hookimpl
        def warpolicy_on_decision(self, decision, where):
            if where.endswith(":batch"):
                seen.append((decision.policy, dict(decision.context.facts)))

    runner, _ = prefill(policy, False, observers=Watch())
    for size in (100, 100, 10, 120):
        step(runner, size)
    assert seen == [(P.NONE, {"num_qo_tokens": 128})]


# -- routers --------------------------------------------------------------------------------------------


class RoutedModel(RecModel):
    def __init__(self, route: object = "text", **kw: Any) -> None:
        super().__init__(BUCKETS, **kw)
        self.route = route
        self.asked = 0

    def batch_facts(self, mode, batch):
        self.asked += 1
        if isinstance(self.route, BaseException):
            raise self.route
        return {"image_prefill_route": self.route, "sparse_prefill_snapshot": True}


@pytest.fixture(scope="module")
def router():
    engine = PolicyEngine.load(environ={})
    return engine.compile("image_prefill_trtllm_mha", flags={"prefill_read_done": True})


@pytest.mark.parametrize(
    "route, expected",
    [("text", P.PRE_REPLAY), ("image", None), ("video", None), (1, None), (Broken("x"), None)],
)
def test_a_router_publishes_by_the_route_the_model_reports(router, route, expected):
    model = RoutedModel(route)
    runner, _ = prefill(router, model=model)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        taken, info = step(runner, 10)
    assert taken is expected and model.asked == 1
    assert "sparse_prefill_snapshot" not in (info.facts or {})  # a model reports no action
    if isinstance(route, Broken):
        assert runner.reporter.counts["fallback:batch_facts"] == 1


def test_a_model_without_batch_facts_is_unreported_and_said_once(router):
    runner, _ = prefill(router)
    with pytest.warns(RuntimeWarning, match="no batch_facts"):
        taken, _ = step(runner, 10)
    assert taken is None


# -- SpecStep -------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def eagle():
    engine = PolicyEngine.load(environ={})
    return engine.compile("fa3", "eagle")


def spec_step(eagle, answer):
    rt = sim_runtime()
    plugin = ActionPlugin(always(answer))
    rt.pm.register(plugin, name="stager")
    kw = {"observers": rt.observers}
    verify = VerifyRunner(RecModel((2, 4)), eagle, rt.platform, draft_tokens=2, **kw)
    extend = DraftExtendRunner(RecModel((2, 4)), eagle, rt.platform, **kw)
    spec = PolicyEngine.load(environ={}).spec("eagle")
    step = SpecStep.for_algorithm([verify, extend], spec, observers=rt.observers)
    step.capture()
    return step, plugin


def test_spec_step_hands_verifys_event_when_draft_extend_was_staged(eagle):
    step, plugin = spec_step(eagle, True)
    assert step.reader.mode is M.DRAFT_EXTEND  # EAGLE declares draft extend its last reader
    step.run([1.0, 2.0, 3.0, 4.0])
    taken = step.fence.take()
    assert taken is not None and taken.policy is P.IN_GRAPH
    assert taken.source == "target_verify" and step.released_by.mode is M.TARGET_VERIFY
    assert plugin.calls == [("draft_extend_staged", "target_verify", M.TARGET_VERIFY, 4)]


@pytest.mark.parametrize("answer", [False, None, 1, Broken("x")])
def test_spec_step_without_staging_releases_after_draft_extend(eagle, answer):
    step, _ = spec_step(eagle, answer)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        step.run([1.0, 2.0, 3.0, 4.0])
    # verify publishes nothing unstaged; draft extend's default is none: the coarse barrier
    assert step.fence.take() is None
    assert step.released_by.mode is M.DRAFT_EXTEND


# -- the max rule, as a property ---------------------------------------------------------------------------

ANSWERS = st.sampled_from([True, False, None, 1, "yes", "raise"])


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    threshold=st.integers(1, 200),
    buckets=st.sets(st.integers(1, 160), min_size=1, max_size=4),
    batches=st.lists(st.tuples(st.integers(1, 220), st.lists(ANSWERS, max_size=3)), max_size=6),
)
def test_the_release_is_never_earlier_than_the_bucket_or_the_registry(threshold, buckets, batches):
    """For any threshold, buckets, batch sizes and action answers: what the scheduler takes is
    never earlier than the bucket's capture-time release, nor than the registry's answer for the
    facts the batch really has (the padded size; the action succeeded only if some answer was
    True and none other than True/None and nothing raised)."""
    compiled = perbatch_policy(threshold)
    rt = sim_runtime()
    current: list[object] = []

    def answer_at(i):
        def answer(action, runner, mode, bucket, batch):
            value = current[i] if i < len(current) else None
            if value == "raise":
                raise Broken("x")
            return value

        return answer

    for i in range(3):
        rt.pm.register(ActionPlugin(answer_at(i)), name=f"a{i}")
    runner = PrefillRunner(RecModel(sorted(buckets)), compiled, rt.platform, observers=rt.observers)
    runner.capture()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        for size, answers in batches:
            current[:] = answers
            runner.run([1.0] * size)
            taken = runner.fence.take()
            published = P.NONE if taken is None else taken.policy
            if taken is not None:
                taken.discard()
            info = runner.last_step
            eager = info.bucket is None
            truth = {"num_qo_tokens": size if eager else info.bucket}
            if any(a is True for a in answers) and all(a is True or a is None for a in answers):
                truth[SNAPSHOT_ACTION] = True
            registry = compiled.lookup(M.EXTEND, eager, False, facts=truth)
            assert published >= runner.release_of(info.bucket).policy
            assert published >= registry
            if not eager and info.bucket <= threshold:
                assert published is P.PRE_REPLAY  # and not needlessly later


# -- effective_policy: the max itself ------------------------------------------------------------------


class Rule:
    facts = ("num_qo_tokens",)
    actions = ()

    def __init__(self, answer: P) -> None:
        self.answer = self.unknown = self.earliest = answer

    def __call__(self, facts=None):
        return self.answer


@pytest.mark.parametrize(
    "bucket_policy, answer, expected",
    [
        (P.POST_REPLAY, P.PRE_REPLAY, P.POST_REPLAY),  # never earlier than the bucket
        (P.PRE_REPLAY, P.IN_GRAPH, P.POST_REPLAY),  # in_graph without the bucket's event
        (P.PRE_REPLAY, P.NONE, P.NONE),
        (P.IN_GRAPH, P.PRE_REPLAY, P.IN_GRAPH),
        (P.IN_GRAPH, P.POST_REPLAY, P.POST_REPLAY),
    ],
)
def test_effective_policy_is_the_max_of_bucket_and_rule(bucket_policy, answer, expected):
    event = object() if bucket_policy is P.IN_GRAPH else None
    release = BucketRelease("x", 8, bucket_policy, event)
    plan = BatchPlan(M.EXTEND, False, True, Rule(answer), True, (), ())
    assert effective_policy(release, plan, {}, Reporter(NO_OBSERVERS, "t")) is expected
    # the eager cell: sound() demotes an in_graph answer
    eager = BatchPlan(M.EXTEND, True, False, Rule(P.IN_GRAPH), True, (), ())
    assert (
        effective_policy(
            BucketRelease("x", None, P.PRE_REPLAY), eager, {}, Reporter(NO_OBSERVERS, "t")
        )
        is P.POST_REPLAY
    )


# -- the engine API (an engine that owns its capture) ----------------------------------------------


def owned_outcome(policy, *, per_batch: bool):
    rt = sim_runtime()
    plugin = ActionPlugin(always(True))
    rt.pm.register(plugin, name="action")
    p = rt.platform
    cell = cell_policy(policy, M.EXTEND, per_batch=per_batch, observers=rt.observers)
    fence = ReadDoneFence(p, name="extend", observers=rt.observers)
    capture = ReadDoneCapture(p, cell, fence, observers=rt.observers)
    bucket = capture.begin(128)
    graph = p.new_graph(keep_graph=True)
    p.capture_callable(graph, bucket.mark)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        outcome = bucket.finish(graph, {})
    return rt, capture, outcome, plugin


def test_the_engine_api_is_per_batch_only_when_asked(policy):
    _, capture, outcome, _ = owned_outcome(policy, per_batch=False)
    assert outcome.policy is P.NONE and outcome.batch is None  # the later, sound answer
    assert capture.eager_batch(capture.eager()) is None
    rt, capture, outcome, plugin = owned_outcome(policy, per_batch=True)
    assert outcome.policy is P.PRE_REPLAY and outcome.batch is not None
    reporter = Reporter(rt.observers, "engine")
    calls = rt.observers.batch_action
    release, facts = outcome.batch.step(100, 128, object(), "extend", None, calls, reporter)
    assert release is outcome.release and facts == {"num_qo_tokens": 128, SNAPSHOT_ACTION: True}
    with pytest.warns(RuntimeWarning, match="no warpolicy_batch_action implementation"):
        release, facts = outcome.batch.step(100, 128, object(), "extend", None, (), reporter)
    assert release.policy is P.NONE  # nobody performed the snapshot: later
    eager = capture.eager()
    assert eager.policy is P.PRE_REPLAY and capture.eager_batch(eager) is not None
