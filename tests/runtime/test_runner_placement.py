"""Derived placement and the marker self-check in the runners, on the simulated platform.

The simulated platform has no real graph, so each test hands it a `warpolicy.runtime.graphwalk.Graph`
per captured graph (``SimPlatform.graph_model``) whose kernels point into the model's shared
tensors; the runner's logic (readers found, none found, errors, late readers, nodes the walk
cannot see, the ``self_check`` option) then runs exactly as on CUDA.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import pytest
import torch

from warpolicy.errors import InputError
from warpolicy.registry.engine import PolicyEngine
from warpolicy.registry.loader import Fragment, load_registry
from warpolicy.registry.vocabulary import ForwardMode, Placement, WarReadDonePolicy
from warpolicy.runtime.graphwalk import Graph, Node, NodeKind
from warpolicy.runtime.hookspecs import hookimpl
from warpolicy.runtime.platforms.sim import SimGraph
from warpolicy.runtime.policy import fixed_policy
from warpolicy.runtime.runners import DecodeRunner, DraftExtendRunner, SelfCheckError
from warpolicy.testing import sim_impl, sim_platform, sim_runtime

P = WarReadDonePolicy
BUCKETS = (1, 2)


class Model:
    """Shared ``table`` read by graph_prep; a private ``weight`` read by the forward."""

    def __init__(self) -> None:
        self.table = torch.arange(8, dtype=torch.float32)
        self.weight = torch.ones(8)
        self.shared_buffers = {"table": self.table}
        self.out: dict[int, torch.Tensor] = {}
        self.calls: list[str] = []

    def bucket_sizes(self, mode: ForwardMode):
        return BUCKETS

    def prepare_bucket(self, bucket: int) -> None:
        self.out.setdefault(bucket, torch.zeros(bucket))

    def host_prep(self, batch, bucket: int) -> None:
        self.calls.append("host_prep")

    def graph_prep(self, bucket: int) -> None:
        self.calls.append("graph_prep")

    def forward(self, bucket: int):
        self.calls.append("forward")
        return self.out[bucket]


def kernel(i: int, deps=(), ptr: int = 0, name: str = "") -> Node:
    return Node(i, NodeKind.KERNEL, name or f"k{i}", deps=deps, words=(ptr,) if ptr else ())


def marker_graph(model: Model, graph: SimGraph, *, late: NodeKind | None = None) -> Graph:
    """prep (reads table) -> marker -> forward (reads weight) [-> a late node]."""
    table, weight = model.table.data_ptr(), model.weight.data_ptr()
    marker_event = graph.planted[0].id if graph.planted else 0
    nodes = [
        kernel(0, ptr=table, name="gather_prep"),
        Node(1, NodeKind.EVENT_RECORD, deps=(0,), event=marker_event),
        kernel(2, deps=(1,), ptr=weight, name="matmul"),
    ]
    if late is NodeKind.KERNEL:
        nodes.append(kernel(3, deps=(2,), ptr=table + 8, name="swa_late_read"))
    elif late is not None:
        nodes.append(Node(3, late, deps=(2,)))
    return Graph(nodes)


def derived_graph(model: Model, *, readers: bool = True, opaque: NodeKind | None = None) -> Graph:
    """prep -> layer 0 -> late read of table -> layer 1 (no marker) [+ an opaque node]."""
    table, weight = model.table.data_ptr(), model.weight.data_ptr()
    nodes = [
        kernel(0, ptr=table if readers else weight, name="gather_prep"),
        kernel(1, deps=(0,), ptr=weight, name="layer0"),
        kernel(2, deps=(1,), ptr=table + 4 if readers else weight, name="late_read"),
        kernel(3, deps=(2,), ptr=weight, name="layer1"),
    ]
    if opaque is not None:
        nodes.append(Node(4, opaque, deps=(3,)))
    return Graph(nodes)


class Demotions:
    def __init__(self) -> None:
        self.seen: list[tuple[str, int, str]] = []
        self.pm: Any = None  # the runtime's manager, once registered

    @hookimpl
    def warpolicy_on_demotion(self, runner: str, bucket: int, reason: str) -> None:
        self.seen.append((runner, bucket, reason))


def setup(
    placement: str,
    graph_model: Callable[[Model, SimGraph], Graph] | None,
    policy: str = "in_graph",
    cls=DecodeRunner,
    **kw,
):
    rt = sim_runtime()
    platform = rt.platform
    model = Model()
    if graph_model is not None:
        calls: list[int] = []

        def provide(graph: SimGraph) -> Graph:
            calls.append(graph.id)
            return graph_model(model, graph)

        sim_impl(platform).graph_model = provide
        platform.model_calls = calls  # type: ignore[attr-defined]
    demotions = Demotions()
    demotions.pm = rt.pm  # for tests that register more observers
    rt.pm.register(demotions, name="demotions")
    runner = cls(
        model, fixed_policy(policy), platform, placement=placement, observers=rt.observers, **kw
    )
    return runner, model, platform, demotions


def capture_quietly(runner) -> list[str]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        runner.capture()
    return [str(w.message) for w in caught]


# -- derived placement ----------------------------------------------------------------------------


class TestDerived:
    def test_readers_found_plants_after_them_and_publishes_in_graph(self):
        runner, model, platform, demotions = setup("derived", lambda m, g: derived_graph(m))
        assert capture_quietly(runner) == []
        for cb in runner.captured.values():
            assert cb.planted and cb.event in cb.graph.derived and cb.policy == P.IN_GRAPH
        report = runner.capture_report[1]
        assert report.placement is Placement.DERIVED and report.planted and report.ok
        assert "late_read #2" in report.detail  # the frontier is the late reader, not the prep
        assert demotions.seen == []

    def test_the_body_has_no_marker_and_the_node_fires_after_the_body(self):
        runner, model, platform, _ = setup("derived", lambda m, g: derived_graph(m))
        runner.capture()
        impl = sim_impl(platform)
        start = len(impl.log)
        model.calls.clear()
        runner.run([1.0])
        fired = [e for e in impl.log[start:] if e[0] == "record"]
        assert fired == [("record", runner.captured[1].event.id, fired[0][2], "in_graph")]
        assert model.calls == ["host_prep", "graph_prep", "forward"]
        assert runner.fence.take().policy == P.IN_GRAPH
        # no capture recorded the event inside its body (no marker)
        assert all(not g.graph.planted for g in runner.captured.values())

    def test_no_readers_found_is_unplanted_with_one_suspicious_warning_per_bucket(self):
        runner, _, _, demotions = setup("derived", lambda m, g: derived_graph(m, readers=False))
        messages = capture_quietly(runner)
        assert len(messages) == len(BUCKETS)
        assert all("suspicious" in m and "no earlier than post_replay" in m for m in messages)
        assert {cb.policy for cb in runner.captured.values()} == {P.POST_REPLAY}
        assert not any(cb.planted for cb in runner.captured.values())
        assert sorted(b for _, b, _ in demotions.seen) == list(BUCKETS)
        runner.run([1.0])
        assert runner.fence.take().policy == P.POST_REPLAY

    def test_opaque_nodes_alone_do_not_count_as_readers_found(self):
        runner, _, _, _ = setup(
            "derived", lambda m, g: derived_graph(m, readers=False, opaque=NodeKind.HOST)
        )
        assert all("suspicious" in m for m in capture_quietly(runner))
        assert not any(cb.planted for cb in runner.captured.values())

    @pytest.mark.parametrize(
        "opaque", [NodeKind.HOST, NodeKind.CHILD_GRAPH, NodeKind.CONDITIONAL, NodeKind.UNKNOWN]
    )
    def test_a_node_it_cannot_see_after_the_readers_moves_the_release_after_it(self, opaque):
        runner, _, _, _ = setup("derived", lambda m, g: derived_graph(m, opaque=opaque))
        assert capture_quietly(runner) == []
        report = runner.capture_report[2]
        assert report.planted and f"{opaque.value} #4" in report.detail
        assert "late_read" not in report.detail.split("after ")[1].split("(")[0]

    def test_a_walk_error_is_coarse_with_the_reason(self):
        runner, _, platform, demotions = setup("derived", lambda m, g: derived_graph(m))
        sim_impl(platform).inject("plant_derived")
        messages = capture_quietly(runner)
        assert len(messages) == 2 and all("injected raise in plant_derived" in m for m in messages)
        assert {cb.policy for cb in runner.captured.values()} == {P.NONE}
        assert len(demotions.seen) == 2

    def test_a_graph_model_that_raises_is_coarse(self):
        def broken(model, graph):
            raise KeyError("no such graph")

        runner, _, _, _ = setup("derived", broken)
        messages = capture_quietly(runner)
        assert all("KeyError" in m for m in messages) and len(messages) == 2
        assert {cb.policy for cb in runner.captured.values()} == {P.NONE}

    def test_without_a_graph_model_derived_is_unplanted(self):
        runner, _, _, _ = setup("derived", None)
        messages = capture_quietly(runner)
        assert len(messages) == 2 and all("no graph model" in m for m in messages)
        assert {cb.policy for cb in runner.captured.values()} == {P.POST_REPLAY}

    def test_without_external_events_derived_is_unplanted_without_a_demotion(self):
        platform = sim_platform(external_events=False)
        model = Model()
        sim_impl(platform).graph_model = lambda g: derived_graph(model)
        runner = DecodeRunner(model, fixed_policy("in_graph"), platform, placement="derived")
        assert capture_quietly(runner) == []  # a platform fact, not a capture finding
        assert {cb.policy for cb in runner.captured.values()} == {P.POST_REPLAY}
        assert "no external events" in runner.capture_report[1].detail

    @pytest.mark.parametrize("placement", ["derived", "marker"])
    def test_an_instantiate_failure_is_coarse_on_both_paths(self, placement):
        runner, _, platform, demotions = setup(
            placement,
            lambda m, g: derived_graph(m) if placement == "derived" else marker_graph(m, g),
        )
        sim_impl(platform).inject("instantiate")
        messages = capture_quietly(runner)
        assert len(messages) == 2 and all("instantiating the graph failed" in m for m in messages)
        assert {cb.policy for cb in runner.captured.values()} == {P.NONE}
        assert len(demotions.seen) == 2

    def test_graphs_are_instantiated_after_the_plant(self):
        runner, _, _, _ = setup("derived", lambda m, g: derived_graph(m))
        runner.capture()
        assert all(cb.graph.instantiated and cb.graph.derived for cb in runner.captured.values())

    def test_draft_extend_gets_a_node_with_derived_placement(self):
        runner, _, _, _ = setup("derived", lambda m, g: derived_graph(m), cls=DraftExtendRunner)
        assert capture_quietly(runner) == []
        assert {cb.policy for cb in runner.captured.values()} == {P.IN_GRAPH}

    def test_draft_extend_with_the_marker_stays_unplanted(self):
        runner, _, _, _ = setup("marker", None, cls=DraftExtendRunner)
        runner.capture()
        assert not any(cb.planted for cb in runner.captured.values())
        assert {cb.policy for cb in runner.captured.values()} == {P.POST_REPLAY}


# -- the marker self-check ------------------------------------------------------------------------


class TestSelfCheck:
    def test_a_safe_marker_is_not_demoted(self):
        runner, _, platform, demotions = setup("marker", lambda m, g: marker_graph(m, g))
        assert capture_quietly(runner) == []
        assert {cb.policy for cb in runner.captured.values()} == {P.IN_GRAPH}
        report = runner.capture_report[1]
        assert report.walked and report.ok and report.planted
        assert platform.model_calls and demotions.seen == []
        assert all(cb.graph.instantiated for cb in runner.captured.values())

    def test_a_late_reader_demotes_the_bucket_naming_kernel_buffer_and_bucket(self):
        runner, _, _, demotions = setup(
            "marker", lambda m, g: marker_graph(m, g, late=NodeKind.KERNEL)
        )
        messages = capture_quietly(runner)
        assert len(messages) == 2
        for bucket in BUCKETS:
            assert any(
                f"bucket {bucket}:" in m
                and "swa_late_read" in m
                and "table" in m
                and "demoted to post_replay" in m
                for m in messages
            )
        assert {cb.policy for cb in runner.captured.values()} == {P.POST_REPLAY}
        assert not any(cb.planted for cb in runner.captured.values())
        assert sorted(b for _, b, _ in demotions.seen) == list(BUCKETS)
        assert runner.capture_report[2].ok is False
        runner.run([1.0])
        assert runner.fence.take().policy == P.POST_REPLAY

    @pytest.mark.parametrize("opaque", [NodeKind.HOST, NodeKind.CHILD_GRAPH, NodeKind.UNKNOWN])
    def test_a_node_it_cannot_see_after_the_marker_demotes(self, opaque):
        runner, _, _, _ = setup("marker", lambda m, g: marker_graph(m, g, late=opaque))
        messages = capture_quietly(runner)
        assert len(messages) == 2 and all("unseen" in m for m in messages)
        assert {cb.policy for cb in runner.captured.values()} == {P.POST_REPLAY}

    def test_an_inert_node_after_the_marker_is_fine(self):
        runner, _, _, _ = setup("marker", lambda m, g: marker_graph(m, g, late=NodeKind.EMPTY))
        assert capture_quietly(runner) == []
        assert {cb.policy for cb in runner.captured.values()} == {P.IN_GRAPH}

    def test_a_missing_marker_node_is_coarse(self):
        def no_marker(model, graph):
            return derived_graph(model)

        runner, _, _, demotions = setup("marker", no_marker)
        messages = capture_quietly(runner)
        assert len(messages) == 2
        assert all("could not run" in m and "not in the" in m for m in messages)
        assert {cb.policy for cb in runner.captured.values()} == {P.NONE}
        assert len(demotions.seen) == 2

    def test_a_check_error_is_coarse(self):
        runner, _, platform, _ = setup("marker", lambda m, g: marker_graph(m, g))
        sim_impl(platform).inject("check_marker")
        messages = capture_quietly(runner)
        assert len(messages) == 2 and all("injected raise" in m for m in messages)
        assert {cb.policy for cb in runner.captured.values()} == {P.NONE}

    @pytest.mark.parametrize("mode", ["raise", "act_then_raise"])
    def test_a_failing_walk_probe_is_coarse_like_a_failing_check(self, mode):
        runner, _, platform, demotions = setup("marker", lambda m, g: marker_graph(m, g))
        sim_impl(platform).inject("graph_walk_unavailable", mode)
        messages = capture_quietly(runner)
        assert len(messages) == 2 and all("graph-walk probe failed" in m for m in messages)
        assert {cb.policy for cb in runner.captured.values()} == {P.NONE}
        assert len(demotions.seen) == 2

    def test_a_probe_returning_junk_is_coarse(self):
        runner, _, platform, _ = setup("marker", lambda m, g: marker_graph(m, g))
        sim_impl(platform).graph_walk_unavailable = lambda: 42
        assert all("not None or a str" in m for m in capture_quietly(runner))
        assert {cb.policy for cb in runner.captured.values()} == {P.NONE}

    def test_off_skips_the_check(self):
        runner, _, platform, demotions = setup(
            "marker", lambda m, g: marker_graph(m, g, late=NodeKind.KERNEL), self_check="off"
        )
        assert capture_quietly(runner) == []
        assert {cb.policy for cb in runner.captured.values()} == {P.IN_GRAPH}
        assert platform.model_calls == [] and demotions.seen == []
        assert runner.capture_report[1].walked is False

    def test_error_raises_on_a_late_reader(self):
        runner, _, _, _ = setup(
            "marker", lambda m, g: marker_graph(m, g, late=NodeKind.KERNEL), self_check="error"
        )
        with pytest.raises(SelfCheckError, match="swa_late_read"):
            runner.capture()

    def test_error_passes_a_safe_marker(self):
        runner, _, _, _ = setup("marker", lambda m, g: marker_graph(m, g), self_check="error")
        runner.capture()
        assert {cb.policy for cb in runner.captured.values()} == {P.IN_GRAPH}

    def test_error_raises_when_the_check_cannot_run(self):
        runner, _, _, _ = setup("marker", None, self_check="error")
        with pytest.raises(SelfCheckError, match="cannot run"):
            runner.capture()

    def test_without_a_graph_model_the_check_is_skipped_silently(self):
        runner, _, _, demotions = setup("marker", None)
        assert capture_quietly(runner) == []
        assert {cb.policy for cb in runner.captured.values()} == {P.IN_GRAPH}
        assert demotions.seen == []

    @pytest.mark.parametrize("policy", ["post_replay", "pre_replay", "none"])
    def test_only_in_graph_buckets_are_checked(self, policy):
        runner, _, platform, _ = setup(
            "marker", lambda m, g: marker_graph(m, g, late=NodeKind.KERNEL), policy=policy
        )
        assert capture_quietly(runner) == []
        assert platform.model_calls == []
        assert {cb.policy for cb in runner.captured.values()} == {P.parse(policy)}

    def test_a_failing_demotion_observer_does_not_change_the_demotion(self):
        runner, _, _, demotions = setup(
            "marker", lambda m, g: marker_graph(m, g, late=NodeKind.KERNEL)
        )

        class Broken:
            @hookimpl
            def warpolicy_on_demotion(self, runner, bucket, reason):
                raise RuntimeError("observer down")

        demotions.pm.register(Broken(), name="broken")
        messages = capture_quietly(runner)
        assert any("observer down" in m for m in messages)
        assert {cb.policy for cb in runner.captured.values()} == {P.POST_REPLAY}


# -- options and where placement comes from -----------------------------------------------------


class CompiledLike:
    def __init__(self, placement: Placement) -> None:
        self._placement = placement
        self.asked: list[ForwardMode] = []

    def lookup(self, mode, eager=False, planted=True):
        return P.IN_GRAPH if planted and not eager else P.POST_REPLAY

    def placement(self, mode):
        self.asked.append(mode)
        return self._placement


def test_placement_comes_from_the_policy_object_per_mode():
    platform = sim_platform()
    policy = CompiledLike(Placement.DERIVED)
    runner = DecodeRunner(Model(), policy, platform)
    assert runner.placement is Placement.DERIVED and policy.asked == [ForwardMode.DECODE]
    assert DecodeRunner(Model(), fixed_policy("in_graph"), platform).placement is Placement.MARKER


def test_an_explicit_placement_wins_over_the_policy_object():
    policy = CompiledLike(Placement.DERIVED)
    runner = DecodeRunner(Model(), policy, sim_platform(), placement="marker")
    assert runner.placement is Placement.MARKER and policy.asked == []


def test_a_failing_placement_lookup_is_the_marker_with_a_warning():
    class Broken(CompiledLike):
        def placement(self, mode):
            raise RuntimeError("boom")

    with pytest.warns(RuntimeWarning, match="placement lookup failed"):
        runner = DecodeRunner(Model(), Broken(Placement.DERIVED), sim_platform())
    assert runner.placement is Placement.MARKER


def test_bad_self_check_value_is_an_input_error():
    with pytest.raises(InputError, match="self_check"):
        DecodeRunner(Model(), fixed_policy("in_graph"), sim_platform(), self_check="maybe")


DERIVED_YAML = """\
version: 1
spec_algorithms:
  none: {}
backends:
  walked: {reads_end: {decode: in_graph}, plant: {decode: derived}}
"""


def test_engine_compiled_policy_drives_derived_placement():
    engine = PolicyEngine(load_registry([Fragment("caps.yaml", DERIVED_YAML)]), environ={})
    compiled = engine.compile("walked", platform="sim")
    assert compiled.placement(ForwardMode.DECODE) is Placement.DERIVED
    platform = sim_platform()
    model = Model()
    sim_impl(platform).graph_model = lambda g: derived_graph(model)
    runner = DecodeRunner(model, compiled, platform)
    assert capture_quietly(runner) == []
    assert {cb.policy for cb in runner.captured.values()} == {P.IN_GRAPH}


def test_explain_marks_a_derived_decision():
    from warpolicy.registry.decision import Context
    from warpolicy.registry.report import format_explanation
    from warpolicy.registry.vocabulary import ForwardMode as M

    engine = PolicyEngine(load_registry([Fragment("caps.yaml", DERIVED_YAML)]), environ={})
    exp = engine.explain(Context("walked", M.DECODE))
    assert exp.placement is Placement.DERIVED
    text = format_explanation(exp)
    assert (
        "placement: derived (the node is planted after the last shared reader found in the "
        "captured graph; see docs/derived-placement.md" in text
    )
    assert "placement" in format_explanation(exp, "markdown") and "derived" in format_explanation(
        exp, "markdown"
    )
    assert '"placement": "derived"' in format_explanation(exp, "json")
    marker = engine.explain(Context("walked", M.EXTEND))
    assert marker.placement is Placement.MARKER
    assert "placement: marker" in format_explanation(marker)
