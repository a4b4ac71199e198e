"""The release decision (`warpolicy.runtime.release`): the policy asked once per fact set, a
bucket's release decided from verified facts only, doubt is coarse; and the reporter that
counts every event while warning once."""

from __future__ import annotations

import warnings

import pytest
from hypothesis import given
from hypothesis import strategies as st

from warpolicy.registry.vocabulary import ForwardMode
from warpolicy.registry.vocabulary import WarReadDonePolicy as P
from warpolicy.runtime.observers import NO_OBSERVERS, Reporter
from warpolicy.runtime.release import (
    BucketFacts,
    BucketRelease,
    ModePolicies,
    decide_bucket,
    resolve_policies,
    sound,
)

DECODE = ForwardMode.DECODE
EVENT = object()


def test_resolve_asks_each_fact_set_once_through_sound():
    asked = []

    def policy(mode, eager, planted):
        asked.append((mode, eager, planted))
        return P.IN_GRAPH

    policies = resolve_policies(policy, DECODE)
    assert asked == [(DECODE, False, True), (DECODE, False, False), (DECODE, True, False)]
    assert (policies.planted, policies.unplanted, policies.eager) == (
        P.IN_GRAPH,
        P.POST_REPLAY,  # the runtime's own safety net: no node, never in_graph
        P.POST_REPLAY,
    )
    assert policies.failure is None


@pytest.mark.parametrize(
    "answer", [RuntimeError("boom"), "junk", 17, None, False, True, 0.0, 1.0, 0, 3]
)
def test_any_failure_or_junk_answer_makes_every_answer_none(answer):
    def policy(mode, eager, planted):
        if isinstance(answer, Exception):
            raise answer
        return answer

    policies = resolve_policies(policy, DECODE)
    assert (policies.planted, policies.unplanted, policies.eager) == (P.NONE,) * 3
    assert "policy lookup failed" in policies.failure


def test_a_bool_or_float_answer_is_coarse_never_the_release_point_it_equals():
    """Issue 26 finding 7: ``False`` / ``0.0`` equal ``PRE_REPLAY`` as numbers; 0.3.0 published
    pre_replay for them (``True``: in_graph). A policy answer is a policy or coarse."""
    for answer in (False, 0.0, True, 1.0):
        policies = resolve_policies(lambda mode, eager, planted, a=answer: a, DECODE)
        assert (policies.planted, policies.unplanted, policies.eager) == (P.NONE,) * 3
        assert "not a WarReadDonePolicy" in policies.failure


def test_nothing_everywhere_reads_nothing_and_publishes_pre_replay():
    policies = resolve_policies(lambda mode, eager, planted: P.NOTHING, DECODE)
    assert policies.reads_nothing and not policies.reads_shared_state
    assert (policies.planted, policies.unplanted, policies.eager) == (P.PRE_REPLAY,) * 3


@pytest.mark.parametrize("other", [P.PRE_REPLAY, P.IN_GRAPH, P.POST_REPLAY, P.NONE])
def test_none_or_any_release_point_in_some_fact_set_is_a_reader(other):
    """``none`` is unknown (a reader), like every release point: only ``nothing`` in every fact
    set says the mode reads no shared state."""
    for eager_answer in (other, P.NOTHING):
        policies = resolve_policies(
            lambda mode, eager, planted, e=eager_answer: e if eager else other, DECODE
        )
        assert policies.reads_shared_state and not policies.reads_nothing
    assert resolve_policies(lambda *a: other, DECODE).reads_shared_state


def test_a_failed_lookup_is_a_reader():
    policies = ModePolicies.coarse(DECODE, "lookup failed")
    assert policies.reads_shared_state
    with pytest.raises(ValueError):
        ModePolicies(DECODE, P.NONE, P.NONE, P.NONE, "failed", reads_nothing=True)


def test_a_keyboard_interrupt_is_not_swallowed():
    def policy(mode, eager, planted):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        resolve_policies(policy, DECODE)


policies_st = st.builds(
    ModePolicies,
    st.just(DECODE),
    st.sampled_from([p for p in P if p is not P.NOTHING]),
    st.sampled_from([P.PRE_REPLAY, P.POST_REPLAY, P.NONE]),
    st.sampled_from([P.PRE_REPLAY, P.POST_REPLAY, P.NONE]),
    st.sampled_from([None, "lookup failed"]),
)
facts_st = st.builds(
    BucketFacts,
    st.sampled_from([None, 1, 4]),
    st.sampled_from([None, EVENT]),
    st.sampled_from([None, "the check raised"]),
    st.sampled_from([None, "a late reader"]),
)


@given(policies_st, facts_st)
def test_a_release_is_never_earlier_than_its_verified_facts_allow(policies, facts):
    release = decide_bucket(policies, facts, "decode")
    if facts.doubt is not None or policies.failure is not None:
        assert release.policy is P.NONE and release.event is None
    elif facts.bucket is None:
        assert release.policy is policies.eager
    elif facts.event is None:
        assert release.policy is policies.unplanted
    else:
        assert release.policy is policies.planted
    assert (release.policy is P.IN_GRAPH) == (release.event is not None)
    if release.policy is P.IN_GRAPH:  # only with a confirmed node, in a graph, without doubt
        assert facts.event is EVENT and facts.bucket is not None and facts.doubt is None
        assert release.read_done.event is EVENT and release.read_done.policy is P.IN_GRAPH


def test_sound_never_goes_earlier():
    for policy in P:
        for eager in (False, True):
            for planted in (False, True):
                assert sound(policy, eager, planted) >= policy
    assert sound(P.IN_GRAPH, False, False) is P.POST_REPLAY
    assert sound(P.PRE_REPLAY, True, False) is P.PRE_REPLAY


def test_a_release_carries_one_cached_read_done():
    release = BucketRelease("decode", 2, P.IN_GRAPH, EVENT)
    assert release.read_done is release.read_done and release.read_done.source == "decode"
    assert BucketRelease("decode", 2, P.POST_REPLAY).read_done is None


# -- the reporter ------------------------------------------------------------------------------


def test_the_reporter_warns_once_per_key_and_counts_every_event():
    reporter = Reporter(NO_OBSERVERS, "thing")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(3):
            reporter.fallback("record", RuntimeError("x"))
            reporter.demotion("decode", 4, "why")
            reporter.warn("odd", "something odd")
    assert [str(w.message) for w in caught] == [
        "warpolicy thing: record failed (RuntimeError('x')); falling back to the coarse barrier",
        "warpolicy thing: why",
        "warpolicy thing: something odd",
    ]
    assert reporter.counts == {"fallback:record": 3, "demotion:4": 3, "warning:odd": 3}
