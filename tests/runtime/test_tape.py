"""The simulated platform's context-manager capture records its torch work and replays it
(issue 27 item 8: it recorded nothing, so a replay was a silent no-op and a sequential-vs-
overlapped comparison on sim compared nothing)."""

from __future__ import annotations

import pytest
import torch

from warpolicy.runtime.platforms.sim import SimPlatform
from warpolicy.runtime.platforms.tape import HOST_READS


def test_a_replay_runs_the_body_again_into_the_captured_output():
    p = SimPlatform()
    x = torch.tensor([1.0, 2.0])
    graph = p.new_graph(keep_graph=False)
    with p.capture(graph):
        y = x * 2
        out = torch.tanh(y) + 1
    x.copy_(torch.tensor([3.0, -4.0]))  # the next step's static input
    p.replay(graph)
    assert torch.equal(out, torch.tanh(x * 2) + 1)
    assert torch.equal(y, x * 2)  # intermediates too, as a CUDA graph's pool holds them


def test_in_place_work_and_setitem_replay_on_current_inputs():
    p = SimPlatform()
    table = torch.zeros(4)
    rows = torch.tensor([1, 3])
    gathered = torch.zeros(2)
    graph = p.new_graph(keep_graph=False)
    with p.capture(graph):
        torch.index_select(table, 0, rows, out=gathered)
        gathered[0] = gathered[1] + 1
    table.copy_(torch.tensor([0.0, 10.0, 20.0, 30.0]))
    p.replay(graph)
    assert gathered.tolist() == [31.0, 30.0]


def test_a_planted_record_fires_at_its_place_between_the_calls():
    p = SimPlatform()
    shared, prep, out = torch.zeros(2), torch.zeros(2), torch.zeros(2)
    event = p.create_event(external=True)
    seen = []
    graph = p.new_graph(keep_graph=False)
    with p.capture(graph):
        prep.copy_(shared)
        p.record(event)  # the read-done node, after the in-graph prep
        torch.mul(prep, 2, out=out)
    p.listeners.append(
        lambda entry: (
            seen.append((prep.tolist(), out.tolist()))
            if entry[0] == "record" and entry[3] == "in_graph"
            else None
        )
    )
    shared.fill_(5.0)
    p.replay(graph)
    assert seen == [([5.0, 5.0], [0.0, 0.0])]  # the prep ran, the forward not yet
    assert out.tolist() == [10.0, 10.0]


@pytest.mark.parametrize("read", ["item", "__bool__", "tolist"])
def test_a_host_read_inside_the_capture_is_refused(read):
    assert read in HOST_READS
    p = SimPlatform()
    x = torch.ones(1)
    with pytest.raises(RuntimeError, match=rf"Tensor\.{read}\(\) reads a value on the host"):
        with p.capture(p.new_graph(keep_graph=False)):
            getattr(x, read)()


def test_an_empty_body_replays_its_planted_nodes_as_before():
    p = SimPlatform()
    event = p.create_event(external=True)
    graph = p.new_graph(keep_graph=False)
    with p.capture(graph):
        p.record(event)
    p.replay(graph)
    assert event.records == 1 and p.log.of("record")[-1][3] == "in_graph"
