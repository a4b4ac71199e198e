"""The zoo's fixtures (`warpolicy.audit.zoo.fixture` and the models): an oracle independent of the
audit, the canary and the runtime says which variants read shared state after their declared
release point, and the two variants of a fixture compute the same function undisturbed.

The oracle runs a variant's model eagerly, in program order, with no runner, fence or
platform: host prep, then the graph's prep, then the forward (then the eager work after the
replay), and rewrites every shared table (to other valid values) at the point the variant's
declaration releases the scheduler. A variant whose result changes reads shared state after
its release: it must be the buggy one, and only it."""

from __future__ import annotations

import pytest
import torch

from warpolicy.audit.poison import half_turn
from warpolicy.audit.zoo import FIXTURES, ZooFixture, fixture_names, make_subject, zoo_fixture
from warpolicy.errors import UnknownNameError
from warpolicy.registry.decision import Context
from warpolicy.registry.engine import PolicyEngine
from warpolicy.registry.vocabulary import IN_GRAPH, POST_REPLAY, PRE_REPLAY
from warpolicy.testing import sim_platform

CPU = torch.device("cpu")


def _declared(fixture: ZooFixture, buggy: bool):
    engine = PolicyEngine(fixture.registry(buggy), environ={})
    return engine.decide(Context(fixture.name, fixture.mode))


def _step(fixture: ZooFixture, buggy: bool, trial: int, rewrite_at=None):
    """One eager step of a fresh model; ``rewrite_at`` in (pre_replay, in_graph, post_replay)
    rewrites every shared table there. Returns the output and every written pool."""
    model = fixture.model(CPU, buggy)
    batch = model.make_batch(fixture.mode, trial)
    bucket = min(b for b in model.bucket_sizes(fixture.mode) if b >= batch.shape[0])
    model.prepare_bucket(bucket)

    def rewrite(point):
        if point == rewrite_at:
            for table in model.shared_buffers.values():
                table.copy_(half_turn(table))

    model.host_prep(batch, bucket)
    rewrite(PRE_REPLAY)
    model.graph_prep(bucket)
    rewrite(IN_GRAPH)
    out = model.forward(bucket).clone()
    rewrite(POST_REPLAY)
    if fixture.post_step:
        out = model.post_step(fixture.mode, batch, out)
    return [out] + [t.clone() for t in model.written.values()]


def _same(a, b) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a, b))


@pytest.mark.parametrize("fixture", FIXTURES, ids=lambda f: f.name)
class TestOracle:
    def test_the_variants_compute_the_same_function_undisturbed(self, fixture):
        for trial in range(2):
            assert _same(_step(fixture, True, trial), _step(fixture, False, trial))

    def test_only_the_buggy_variant_reads_after_its_release(self, fixture):
        for buggy in (True, False):
            declared = _declared(fixture, buggy)
            changed = [
                not _same(_step(fixture, buggy, t), _step(fixture, buggy, t, declared))
                for t in range(2)
            ]
            assert all(changed) if buggy else not any(changed), (buggy, declared.label)

    def test_the_buggy_variant_declares_no_later_than_the_fixed_one(self, fixture):
        assert _declared(fixture, True) <= _declared(fixture, False)


def test_eight_fixtures_each_citing_its_report_in_its_model():
    assert len(FIXTURES) >= 8 and len(set(fixture_names())) == len(FIXTURES)
    for fixture in FIXTURES:
        number = fixture.report.split("#")[1].split(",")[0] if "#" in fixture.report else "1f"
        assert number in (fixture.model.__doc__ or ""), fixture.name


def test_unknown_fixture_names_list_the_known_ones():
    with pytest.raises(UnknownNameError, match="req_pool_reuse"):
        zoo_fixture("req_pool_reus")


def test_the_wrapper_fixture_takes_the_latest_child_only_when_fixed():
    wrapper = zoo_fixture("wrapper_one_child")
    assert (_declared(wrapper, True), _declared(wrapper, False)) == (IN_GRAPH, POST_REPLAY)


def test_a_subject_names_its_variant_and_declares_its_mode():
    built = make_subject(zoo_fixture("encoder_ring_no_wait"), True, sim_platform())
    subject = built.subject
    assert subject.name == "encoder_ring_no_wait:buggy"
    assert dict(subject.declared) == {zoo_fixture("encoder_ring_no_wait").mode: PRE_REPLAY}
    assert "input_ring" in built.model.shared_buffers
