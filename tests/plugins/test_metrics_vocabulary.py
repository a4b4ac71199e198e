"""The metrics plugin's label vocabularies: every place, reason and demotion the runtime reports
maps to a fixed identifier, never to ``other``.

Two ways, because either alone can miss something: the runtime's source is scanned for every
literal fallback place and barrier reason it reports, and the runtime is driven through every
fault the simulated platform can inject (each operation, each fault mode, at capture and per
step, for every policy and both placements) plus the capture findings a graph model can
produce, recording every text the observers receive. A new place or reason in the runtime fails
here until `warpolicy_metrics.vocabulary` maps it."""

from __future__ import annotations

import ast
import itertools
import pathlib
import sys
import warnings

import pytest

pytest.importorskip("prometheus_client")

PLUGIN_ROOT = pathlib.Path(__file__).resolve().parents[2] / "plugins" / "warpolicy-metrics"
if str(PLUGIN_ROOT) not in sys.path:
    sys.path.insert(0, str(PLUGIN_ROOT))

import warpolicy  # noqa: E402
from warpolicy.runtime.graphwalk import Graph, Node, NodeKind  # noqa: E402
from warpolicy.runtime.hookspecs import hookimpl  # noqa: E402
from warpolicy.runtime.policy import fixed_policy  # noqa: E402
from warpolicy.runtime.runners import DecodeRunner, OverlapLoop  # noqa: E402
from warpolicy.testing import FAULT_MODES, OPERATIONS, RecModel, sim_impl, sim_runtime  # noqa: E402
from warpolicy_metrics import vocabulary  # noqa: E402
from warpolicy_metrics.vocabulary import (  # noqa: E402
    OTHER,
    barrier_reason,
    demotion_reason,
    fallback_labels,
    ident,
    identity_labels,
)

RUNTIME = pathlib.Path(warpolicy.__file__).parent / "runtime"


class Recorder:
    """Every text the runtime hands the observers."""

    def __init__(self) -> None:
        self.fallbacks: set[str] = set()
        self.barriers: set[tuple[str, str]] = set()
        self.demotions: set[str] = set()

    @hookimpl
    def warpolicy_on_fallback(self, where: str) -> None:
        self.fallbacks.add(where)

    @hookimpl
    def warpolicy_on_barrier(self, kind: str, reason: str) -> None:
        self.barriers.add((kind, reason))

    @hookimpl
    def warpolicy_on_demotion(self, reason: str) -> None:
        self.demotions.add(reason)


# -- graph models: what the walk of a captured bucket finds ---------------------------------------


def marker_graph(model: RecModel, graph, *, late: bool = False) -> Graph:
    table = model.table.data_ptr()
    event = graph.planted[0].id if graph.planted else 0
    nodes = [
        Node(0, NodeKind.KERNEL, "prep", words=(table,)),
        Node(1, NodeKind.EVENT_RECORD, deps=(0,), event=event),
        Node(2, NodeKind.KERNEL, "forward", deps=(1,)),
    ]
    if late:
        nodes.append(Node(3, NodeKind.KERNEL, "late_read", deps=(2,), words=(table,)))
    return Graph(nodes)


def derived_graph(model: RecModel, graph, *, readers: bool = True) -> Graph:
    table = model.table.data_ptr() if readers else 0
    return Graph(
        [
            Node(0, NodeKind.KERNEL, "prep", words=(table,) if table else ()),
            Node(1, NodeKind.KERNEL, "forward", deps=(0,)),
        ]
    )


GRAPHS = {
    "marker": lambda m, g: marker_graph(m, g),
    "marker_late": lambda m, g: marker_graph(m, g, late=True),
    "derived": lambda m, g: derived_graph(m, g),
    "derived_no_readers": lambda m, g: derived_graph(m, g, readers=False),
    "none": None,
}


def run_case(rec: Recorder, policy: str, placement: str, graph: str, fault=None, when="capture"):
    """Capture a decode runner and run three overlap steps, with ``fault`` (op, mode) injected
    at capture or per step; whatever raises is part of the case."""
    rt = sim_runtime()
    rt.pm.register(rec)
    impl = sim_impl(rt.platform)
    model = RecModel(buckets=(1, 2))
    make = GRAPHS[graph]
    if make is not None:
        impl.graph_model = lambda g: make(model, g)
    runner = DecodeRunner(
        model,
        POLICIES.get(policy) or fixed_policy(policy),
        rt.platform,
        placement=placement,
        observers=rt.observers,
    )
    try:
        if fault is not None and when == "capture":
            impl.inject(*fault)
        try:
            runner.capture()
        except Exception:  # noqa: BLE001 - a fault may make the capture raise; it stays coarse
            pass
        impl.clear_faults()
        loop = OverlapLoop(runner)
        if fault is not None and when == "step":
            impl.inject(*fault)
        for batch in ([1.0], [1.0, 2.0], [1.0] * 3):  # the last one is eager
            try:
                loop.step(batch, lambda: None)
            except Exception:  # noqa: BLE001 - what a failing step reported still counts
                pass
    finally:
        rt.pm.unregister(rec)


def _raising_policy(mode, eager=False, planted=True):
    raise RuntimeError("policy lookup broke")


POLICIES = {"raising": _raising_policy}


@pytest.fixture(scope="module")
def reported() -> Recorder:
    rec = Recorder()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        for policy, graph in (
            ("pre_replay", "marker"),
            ("post_replay", "marker"),
            ("none", "marker"),
            ("in_graph", "marker"),
            ("in_graph", "marker_late"),
            ("in_graph", "none"),
            ("raising", "marker"),
        ):
            run_case(rec, policy, "marker", graph)
        for graph in ("derived", "derived_no_readers", "none"):
            run_case(rec, "in_graph", "derived", graph)
        for op, mode, (policy, placement, graph), when in itertools.product(
            OPERATIONS,
            FAULT_MODES,
            (
                ("in_graph", "marker", "marker"),
                ("in_graph", "derived", "derived"),
                ("post_replay", "marker", "marker"),
                ("pre_replay", "marker", "marker"),
            ),
            ("capture", "step"),
        ):
            run_case(rec, policy, placement, graph, (op, mode), when)
    return rec


class TestWhatTheRuntimeReports:
    def test_every_fallback_maps_to_a_component_and_place(self, reported):
        assert reported.fallbacks  # the faults fired
        unmapped = {w for w in reported.fallbacks if OTHER in fallback_labels(w)[1:]}
        assert unmapped == set()

    def test_the_sweep_reaches_every_component(self, reported):
        components = {fallback_labels(w)[1] for w in reported.fallbacks}
        assert {"fence", "barrier", "runner", "overlap_loop"} <= components

    def test_every_barrier_reason_maps(self, reported):
        kinds = {kind for kind, _ in reported.barriers}
        assert kinds == {"event", "coarse"}
        assert {(k, r) for k, r in reported.barriers if barrier_reason(k, r) == OTHER} == set()

    def test_every_demotion_maps(self, reported):
        labels = {demotion_reason(r) for r in reported.demotions}
        assert OTHER not in labels, [r for r in reported.demotions if demotion_reason(r) == OTHER]
        # every capture finding and failure the vocabulary names is provoked by some case
        assert set(vocabulary.DEMOTIONS) - {OTHER} <= labels


def _runtime_calls(method: str) -> list[tuple[pathlib.Path, ast.Call]]:
    calls = []
    for path in sorted(RUNTIME.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == method
            ):
                calls.append((path, node))
    return calls


class TestTheRuntimeSource:
    def test_every_literal_fallback_place_is_in_the_vocabulary(self):
        places = {
            node.args[0].value
            for _, node in _runtime_calls("fallback")
            if node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        }
        assert len(places) >= 10  # the scan found the runtime's reports
        assert places - vocabulary.PLACES == set()

    def test_every_literal_barrier_reason_is_in_the_vocabulary(self):
        reasons = {
            node.args[3].value
            for _, node in _runtime_calls("barrier")
            if len(node.args) == 4 and isinstance(node.args[3], ast.Constant)
        }
        assert reasons == set(vocabulary.BARRIER_REASONS)


class TestMapping:
    @pytest.mark.parametrize(
        "where, labels",
        [
            ("fence 'decode':after_replay", ("decode", "fence", "after_replay")),
            ("barrier 'scheduler':wait_event", ("scheduler", "barrier", "wait_event")),
            ("decode runner:policy", ("decode", "runner", "policy")),
            ("overlap loop:record", ("", "overlap_loop", "record")),
            ("runner:decode:consistency", ("decode", "consistency", "consistency")),
            ("policy:consistency", ("", "consistency", "consistency")),
            ("fence 'a:b':ring", ("a:b", "fence", "ring")),
            ("fence 'decode':warpolicy_on_publish:broken", ("decode", "fence", "observer")),
            ("overlap loop:warpolicy_on_barrier:x:y", ("", "overlap_loop", "observer")),
            ("canary 'decode':check", ("decode", "canary", "check")),
            ("overlap loop:release_lead", ("", "overlap_loop", "release_lead")),
            ("fence 'decode':teleport", ("decode", "fence", "other")),
            ("fence 'decode':record", ("decode", "fence", "other")),  # a loop place, not a fence's
            ("something else entirely", ("", "other", "other")),
            ("bench:x", ("", "other", "other")),
        ],
    )
    def test_fallback_where(self, where, labels):
        assert fallback_labels(where) == labels

    @pytest.mark.parametrize(
        "kind, reason, label",
        [
            ("event", "in_graph", "in_graph"),
            ("event", "bogus", "other"),
            ("coarse", "no read-done event", "no_event"),
            ("coarse", "forced", "forced"),
            ("coarse", "hook failed", "wait_failed"),
            ("coarse", "in_graph", "other"),
        ],
    )
    def test_barrier_reason(self, kind, reason, label):
        assert barrier_reason(kind, reason) == label

    @pytest.mark.parametrize(
        "name, label",
        [
            ("decode", "decode"),
            ("meta-llama/Llama-3.1-8B", "meta-llama/Llama-3.1-8B"),
            ("draft extend #1", "draft_extend__1"),
            ('x"}\n', "x___"),
            ("", "unnamed"),
            ("r" * 100, "r" * 64),
        ],
    )
    def test_names_become_identifier_like(self, name, label):
        assert ident(name) == label

    def test_identity_values_are_checked_not_rewritten(self):
        assert identity_labels({"model_name": "llama-8b", "tp_rank": 3}, frozenset()) == {
            "model_name": "llama-8b",
            "tp_rank": "3",
        }

    @pytest.mark.parametrize(
        "identity, message",
        [
            ({"model name": "x"}, "'model name' is not a label name"),
            ({"__name__": "x"}, "'__name__' is not a label name"),
            ({"runner": "x"}, "identity label 'runner' is already a label"),
            ({"model_name": "two words"}, "model_name='two words' must be 1-128 characters"),
            ({"model_name": ""}, "must be 1-128 characters"),
            ({"tp_rank": True}, "must be a string or an integer"),
            ({"tp_rank": 1.5}, "must be a string or an integer"),
        ],
    )
    def test_a_bad_identity_is_refused_with_one_line(self, identity, message):
        with pytest.raises(ValueError, match="identity label") as info:
            identity_labels(identity, frozenset({"runner"}))
        assert message in str(info.value) and "\n" not in str(info.value)


@pytest.mark.parametrize(
    "reason, label",
    [
        ("bucket 4: shared reader(s) after the read-done node: k (#3) reads table; bucket 4 "
         "demoted to post_replay", "late_reader"),
        ("bucket 2: the marker was not recorded (mark() not called in the capture body); "
         "bucket 2 publishes nothing (the coarse barrier)", "plant_failed"),
        ("bucket 1: derived placement left the bucket unplanted (bucket 1: suspicious: no shared "
         "reader found in the graph (x)); it publishes no earlier than post_replay", "no_reader"),
        ("something new", "other"),
    ],
)  # fmt: skip
def test_demotion_texts(reason, label):
    assert demotion_reason(reason) == label
