"""The marker self-check per buffer class, on the simulated platform with a hand-made graph
per capture (as tests/runtime/test_runner_placement.py): a class released in_graph while the
bucket's latest is later is walked over that class's buffers only."""

from __future__ import annotations

import warnings

import pytest
import torch

from warpolicy.registry.vocabulary import IN_GRAPH, NONE, POST_REPLAY, ForwardMode
from warpolicy.runtime.graphwalk import Graph, Node, NodeKind
from warpolicy.runtime.platforms import Platform
from warpolicy.runtime.release import class_policy_fns
from warpolicy.runtime.runners import DecodeRunner, SelfCheckError
from warpolicy.testing import sim_impl
from warpolicy.testing.sim import FaultySimPlatform


class Hybrid:
    """``table`` (metadata) read by the prep, ``state`` (recurrent) read by the forward."""

    def __init__(self, classes=None) -> None:
        self.table = torch.arange(8, dtype=torch.float32)
        self.state = torch.ones(8)
        self.shared_buffers = {"table": self.table, "state": self.state}
        if classes is not None:
            self.buffer_classes = classes
        self.out = torch.zeros(2)

    def bucket_sizes(self, mode: ForwardMode):
        return (2,)

    def prepare_bucket(self, bucket: int) -> None:
        return None

    def host_prep(self, batch, bucket: int) -> None:
        return None

    def graph_prep(self, bucket: int) -> None:
        return None

    def forward(self, bucket: int):
        return self.out


def graph_of(model: Hybrid, graph, *, table_late: bool = False) -> Graph:
    """prep (reads table) -> marker -> forward (reads state) [-> a late read of table]."""
    table, state = model.table.data_ptr(), model.state.data_ptr()
    event = graph.planted[0].id if graph.planted else 0
    nodes = [
        Node(0, NodeKind.KERNEL, "prep", words=(table,)),
        Node(1, NodeKind.EVENT_RECORD, deps=(0,), event=event),
        Node(2, NodeKind.KERNEL, "linear", deps=(1,), words=(state,)),
    ]
    if table_late:
        nodes.append(Node(3, NodeKind.KERNEL, "late", deps=(2,), words=(table + 4,)))
    return Graph(nodes)


CLASSES = {"table": "metadata", "state": "recurrent_state"}
HYBRID = {"metadata": IN_GRAPH, "recurrent_state": POST_REPLAY}


def runner(model, late=False, self_check="warn", graph_model=True, device="sim"):
    platform = Platform(FaultySimPlatform(device=device))
    if graph_model:
        sim_impl(platform).graph_model = lambda g: graph_of(model, g, table_late=late)
    cell, per = class_policy_fns(HYBRID)
    built = DecodeRunner(model, cell, platform, class_policies=per, self_check=self_check)
    return built


def classes_of(r):
    release = r.release_of(2)
    return {n: c.policy for n, c in release.classes.items()}


def test_a_class_whose_buffers_are_not_read_after_the_marker_is_confirmed():
    r = runner(Hybrid(CLASSES))
    r.capture()
    assert classes_of(r) == HYBRID


def test_a_class_read_after_the_marker_gets_the_unplanted_answer():
    # positive control: the metadata table read again after the marker
    r = runner(Hybrid(CLASSES), late=True)
    with pytest.warns(RuntimeWarning, match="class metadata"):
        r.capture()
    assert classes_of(r) == {"metadata": POST_REPLAY, "recurrent_state": POST_REPLAY}


def test_a_model_that_does_not_say_which_buffer_is_which_is_walked_whole():
    r = runner(Hybrid())  # state counts for metadata too: read after the marker
    with pytest.warns(RuntimeWarning):
        r.capture()
    assert classes_of(r)["metadata"] is POST_REPLAY


def test_error_mode_raises_on_a_refuted_class():
    r = runner(Hybrid(CLASSES), late=True, self_check="error")
    with pytest.raises(SelfCheckError, match="class metadata"):
        r.capture()


def test_without_a_walk_the_class_is_kept_as_the_bucket_check_is():
    r = runner(Hybrid(CLASSES), graph_model=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        r.capture()
    assert classes_of(r) == HYBRID
    assert caught == []  # the simulated platform has no raw graph: nothing is lost


def test_without_a_walk_a_real_platform_says_the_class_check_was_skipped():
    """A platform plugin without a graph walk (the simulated implementation claiming another
    device type) keeps the class as the bucket check does, and says it went unchecked."""
    r = runner(Hybrid(CLASSES), graph_model=False, device="rocm")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        r.capture()
    assert classes_of(r) == HYBRID
    messages = [str(w.message) for w in caught]
    assert any("class self-check cannot run" in m and "class metadata" in m for m in messages)


def test_a_failed_walk_probe_makes_the_class_coarse():
    r = runner(Hybrid(CLASSES))
    sim_impl(r.platform).inject("graph_walk_unavailable")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        r.capture()
    assert classes_of(r)["metadata"] is NONE
