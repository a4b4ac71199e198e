"""The synthetic backends (`warpolicy.audit.synthetic`) and their model
(`warpolicy.audit.synthetic_model`): declarations, the model's invariants, and each variant's
verdict when audited through the simulated platform (program-order race simulation)."""

from __future__ import annotations

import pytest
import torch

from warpolicy.audit import Verdict, audit_mode, run_audit
from warpolicy.audit.synthetic import make_synthetic, synthetic_backend, synthetic_names
from warpolicy.audit.synthetic_model import Layout, SyntheticConfig, SyntheticModel
from warpolicy.errors import InputError, UnknownNameError
from warpolicy.registry.decision import Context
from warpolicy.registry.engine import PolicyEngine
from warpolicy.registry.vocabulary import ForwardMode, Placement, WarReadDonePolicy
from warpolicy.runtime.graphwalk import Graph, Node, NodeKind
from warpolicy.testing import sim_impl, sim_platform

DECODE, EXTEND, VERIFY = ForwardMode.DECODE, ForwardMode.EXTEND, ForwardMode.TARGET_VERIFY
PRE, IN = WarReadDonePolicy.PRE_REPLAY, WarReadDonePolicy.IN_GRAPH

UNSAFE_NAMES = [
    "late_swa_read",
    "late_kv_write",
    "pre_replay_reads_graph",
    "plant_before_prep",
    "composite_late_child",
    "reread_after_replay",
    "first_layer_rebuild",
]
#: made SAFE by derived placement: their late reads are in the captured graph
DERIVED_SAFE = {
    "late_swa_read",
    "late_kv_write",
    "plant_before_prep",
    "composite_late_child",
    "first_layer_rebuild",
}


def test_names_safe_first_and_complete():
    names = synthetic_names()
    assert names[:2] == ["in_graph", "pre_replay_snapshot"]
    assert sorted(names[2:]) == sorted(UNSAFE_NAMES)
    assert [synthetic_backend(n).expected for n in names] == (
        [Verdict.SAFE] * 2 + [Verdict.UNSAFE] * len(UNSAFE_NAMES)
    )


def test_unknown_name():
    with pytest.raises(UnknownNameError, match="did you mean 'late_swa_read'"):
        synthetic_backend("late_swa_reed")
    with pytest.raises(UnknownNameError):
        make_synthetic("nope", platform=sim_platform())


def test_composite_declares_the_latest_of_its_children():
    backend = synthetic_backend("composite_late_child")
    engine = PolicyEngine(backend.registry(), environ={})
    decision = engine.decision(Context(backend.name, DECODE))
    assert decision.policy is IN
    assert "latest of its children" in decision.reasons[0].message
    assert set(backend.children) == {"composite_dense_child", "composite_tbo_child"}


@pytest.mark.parametrize(
    "name, modes",
    [
        ("in_graph", {DECODE: IN, VERIFY: IN}),
        ("pre_replay_snapshot", {DECODE: PRE, EXTEND: PRE}),
        ("pre_replay_reads_graph", {DECODE: PRE, EXTEND: PRE}),
        ("reread_after_replay", {DECODE: IN, VERIFY: IN}),
    ],
)
def test_subject_declares_per_mode_and_builds_runners(name, modes):
    subject = make_synthetic(name, platform=sim_platform())
    assert dict(subject.declared) == modes
    assert set(subject.runners) == set(modes)
    assert set(subject.model.shared_buffers) == {"req_to_token", "full_to_swa"}
    assert set(subject.extra_outputs) == {"kv_pool"}
    runner = subject.runners[next(iter(modes))](subject.model)
    assert runner.mode == next(iter(modes))
    assert runner.keep_graphs


def test_verify_runner_buckets_are_draft_multiples():
    subject = make_synthetic("in_graph", platform=sim_platform())
    runner = subject.runners[VERIFY](subject.model)
    assert all(b % subject.model.cfg.draft_tokens == 0 for b in runner.buckets)


@pytest.mark.parametrize("mode", [DECODE, EXTEND, VERIFY])
def test_make_batch_deterministic_and_fits(mode):
    model = SyntheticModel(Layout(), SyntheticConfig(), torch.device("cpu"))
    a, b = model.make_batch(mode, 5), model.make_batch(mode, 5)
    assert torch.equal(a, b)
    sizes = [model.make_batch(mode, t).shape[0] for t in range(30)]
    assert max(sizes) <= max(model.bucket_sizes(mode)) and min(sizes) >= 1
    assert len(set(sizes)) > 1  # trials exercise several buckets
    buckets = sorted(model.bucket_sizes(mode))
    fits = [min(b for b in buckets if b >= s) for s in sizes[: len(buckets)]]
    assert fits == buckets  # any len(buckets) consecutive trials replay every bucket
    if mode == VERIFY:
        assert all(s % model.cfg.draft_tokens == 0 for s in sizes)
    batch = model.make_batch(mode, 3)
    assert int(batch[:, 0].max()) < model.cfg.reqs and int(batch[:, 1].max()) < model.cfg.ctx


def _eager_output(
    layout: Layout, batch: torch.Tensor, bucket: int, cfg: SyntheticConfig = SyntheticConfig()
) -> tuple[torch.Tensor, torch.Tensor]:
    """The output and the KV pool after one eager step."""
    model = SyntheticModel(layout, cfg, torch.device("cpu"))
    model.prepare_bucket(bucket)
    model.host_prep(batch, bucket)
    model.graph_prep(bucket)
    return model.forward(bucket).clone(), model.kv_pool.clone()


def test_every_layout_computes_the_same_function_undisturbed():
    """The variants differ only in *when* they read shared state, never in what they compute."""
    batch = SyntheticModel(Layout(), SyntheticConfig(), torch.device("cpu")).make_batch(DECODE, 1)
    bucket = 8
    reference = _eager_output(Layout(), batch, bucket)
    for layout in (
        Layout(snapshot=True),
        Layout(late_swa=True),
        Layout(prep_in_forward=True),
        Layout(split_prep=True),
        Layout(reread_after_replay=True),
        Layout(late_kv_write=True),
        Layout(first_layer_rebuild=True),
    ):
        assert torch.equal(_eager_output(layout, batch, bucket)[0], reference[0]), layout
        assert torch.equal(_eager_output(layout, batch, bucket)[1], reference[1]), layout


def test_wide_layers_and_window_keep_the_function():
    """The overlap benchmark's configuration (wider layers, in-graph work before the reads)
    computes the same output and KV as the audit's."""
    batch = SyntheticModel(Layout(), SyntheticConfig(), torch.device("cpu")).make_batch(DECODE, 1)
    plain = _eager_output(Layout(), batch, 8)
    wide = _eager_output(Layout(), batch, 8, SyntheticConfig(layer_rows=32, window_rows=4))
    assert torch.allclose(wide[0], plain[0], atol=1e-6) and torch.allclose(
        wide[1], plain[1], atol=1e-6
    )


def test_reread_post_step_reads_the_live_table():
    model = SyntheticModel(Layout(reread_after_replay=True), SyntheticConfig(), torch.device("cpu"))
    batch = model.make_batch(DECODE, 2)
    model.prepare_bucket(8)
    model.host_prep(batch, 8)
    model.graph_prep(8)
    out = model.forward(8)
    first = model.reread(DECODE, batch, out).clone()
    model.req_to_token.add_(1)
    assert not torch.equal(model.reread(DECODE, batch, out), first)


@pytest.mark.parametrize("name", synthetic_names())
def test_each_variant_gets_its_expected_verdict_on_the_fake(name):
    report = run_audit(synthetic=name, trials=4, platform=sim_platform())
    expected = synthetic_backend(name).expected
    assert report.entries, name
    for entry in report.entries:
        assert entry.verdict is expected, (entry.mode, entry.dynamic)
        assert entry.policy is entry.declared
        if expected is Verdict.UNSAFE:
            assert entry.dynamic.corrupted == 4  # the simulated window is always wide open
        else:
            assert entry.dynamic.trials == 4 and entry.dynamic.corrupted == 0
    assert report.exit_code == (1 if expected is Verdict.UNSAFE else 0)


def test_late_kv_write_is_seen_only_in_the_kv_pool():
    report = run_audit(synthetic="late_kv_write", modes="decode", trials=2, platform=sim_platform())
    assert report.entries[0].dynamic.first.output == "kv_pool"


def test_shared_state_restored_after_an_unsafe_audit():
    platform = sim_platform()
    subject = make_synthetic("late_swa_read", platform=platform)
    before = {n: t.clone() for n, t in subject.model.shared_buffers.items()}
    from warpolicy.audit import audit_mode

    entry = audit_mode(subject, DECODE, trials=3)
    assert entry.verdict is Verdict.UNSAFE
    for name, tensor in subject.model.shared_buffers.items():
        assert torch.equal(tensor, before[name]), name


# -- derived placement ------------------------------------------------------------------------


def test_expected_with_derived_placement():
    for name in synthetic_names():
        backend = synthetic_backend(name)
        derived = backend.expected_with(Placement.DERIVED)
        assert derived is (
            Verdict.SAFE
            if name in DERIVED_SAFE or backend.expected is Verdict.SAFE
            else Verdict.UNSAFE
        ), name
        assert backend.expected_with(None) is backend.expected
        assert backend.expected_with(Placement.MARKER) is backend.expected


def test_first_layer_rebuild_reads_the_live_tables_in_the_forward():
    model = SyntheticModel(Layout(first_layer_rebuild=True), SyntheticConfig(), torch.device("cpu"))
    batch = model.make_batch(DECODE, 1)
    model.prepare_bucket(8)
    model.host_prep(batch, 8)
    model.graph_prep(8)
    model.req_to_token.copy_(model.req_to_token.flip(0))  # the scheduler writes after the prep
    model.full_to_swa.zero_()
    corrupted = model.forward(8).clone()
    reference = _eager_output(Layout(), batch, 8)[0]
    assert not torch.equal(corrupted, reference)  # the forward saw the new tables


def _whole_forward_reads(subject):
    """A graph model for the simulated platform: one kernel reading ``req_to_token`` (the
    derived node then fires after the whole body, where the sim puts it)."""
    ptr = subject.model.req_to_token.data_ptr()
    return lambda graph: Graph([Node(0, NodeKind.KERNEL, "prep", words=(ptr,))])


@pytest.mark.parametrize("name", synthetic_names())
def test_derived_placement_on_the_fake(name):
    platform = sim_platform()
    subject = make_synthetic(name, platform=platform, placement="derived")
    assert subject.name == f"{name}@derived"
    sim_impl(platform).graph_model = _whole_forward_reads(subject)
    expected = synthetic_backend(name).expected_with(Placement.DERIVED)
    for mode in subject.runners:
        entry = audit_mode(subject, mode, trials=4)
        assert entry.verdict is expected, (mode, entry.dynamic)


def test_derived_placement_without_a_walk_is_post_replay_and_never_corrupts():
    platform = sim_platform()  # no graph model: derived placement cannot plant
    subject = make_synthetic("late_swa_read", platform=platform, placement="derived")
    with pytest.warns(RuntimeWarning, match="no graph model"):
        entry = audit_mode(subject, DECODE, trials=2)
    assert entry.policy is WarReadDonePolicy.POST_REPLAY
    assert entry.verdict is not Verdict.UNSAFE and entry.dynamic.corrupted == 0


def test_marker_placement_keeps_the_unsafe_shapes_unsafe():
    report = run_audit(
        synthetic="first_layer_rebuild", trials=3, platform=sim_platform(), placement="marker"
    )
    assert {e.verdict for e in report.entries} == {Verdict.UNSAFE}


def test_placement_usage_errors():
    with pytest.raises(InputError, match="--placement must be one of"):
        run_audit(synthetic="in_graph", trials=1, platform=sim_platform(), placement="early")
    with pytest.raises(InputError, match="--synthetic only"):
        run_audit(
            factory="tests.audit_subjects:table_subject",
            trials=1,
            platform=sim_platform(),
            placement="derived",
        )
