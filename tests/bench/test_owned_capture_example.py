"""``examples/owned_capture.py`` (the guide's engine with its own capture) on the simulated
platform: the marker as the registry places it, derived placement over a graph model, and the
happens-before order the scheduler's writes get."""

from __future__ import annotations

import importlib.util
import pathlib
import sys

import pytest

from warpolicy.runtime.graphwalk import Graph, Node, NodeKind
from warpolicy.runtime.platforms.sim import SimGraph
from warpolicy.testing import sim_impl, sim_runtime

EXAMPLE = pathlib.Path(__file__).resolve().parents[2] / "examples" / "owned_capture.py"


@pytest.fixture(scope="module")
def example():
    spec = importlib.util.spec_from_file_location("owned_capture_example", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    yield module
    sys.modules.pop(spec.name, None)


def test_the_example_runs_as_written(example, capsys):
    assert example.main(["--device", "sim", "--steps", "12"]) == 0
    out = capsys.readouterr().out
    assert "batch 8: publishes in_graph: marker after the metadata prep" in out
    assert "steps differing from the sequential run: 0 of 12" in out


def test_derived_placement_over_a_graph_model(example):
    rt = sim_runtime()
    runner, state = example.build(rt, placement="derived")
    table = state.req_to_token.data_ptr()

    def model(graph: SimGraph) -> Graph:  # prep reads the table, then the layers
        return Graph(
            [
                Node(0, NodeKind.KERNEL, "index_select", words=(table,)),
                Node(1, NodeKind.KERNEL, "layers", deps=(0,)),
            ]
        )

    sim_impl(rt.platform).graph_model = model
    runner.capture()
    assert {o.policy.label for o in runner.outcomes.values()} == {"in_graph"}
    assert all("index_select #0" in o.report.detail for o in runner.outcomes.values())
    schedule = example.Schedule(6, (1, 8), state.req_to_token.device)
    reference = example.run(runner, state, schedule, overlap=False)
    overlapped = example.run(runner, state, schedule, overlap=True)
    assert all(a.equal(b) for a, b in zip(overlapped, reference))


def test_the_scheduler_s_writes_come_after_the_prep_s_reads(example):
    """The sim's clocks: with the barrier, every table write of the next step is ordered after
    the step's in-graph read; without it (the control), it is not."""
    for barrier_on in (True, False):
        rt = sim_runtime()
        impl = sim_impl(rt.platform)
        runner, state = example.build(rt)
        reads, writes = [], []
        prep = runner.backend.init_forward_metadata

        def marked_prep(bs, rows, prep=prep, impl=impl, reads=reads):
            reads.append(impl.mark("read"))
            prep(bs, rows)

        runner.backend.init_forward_metadata = marked_prep
        runner.capture()
        schedule = example.Schedule(4, (2,), state.req_to_token.device)
        write = schedule.write

        def marked_write(st, k, write=write, impl=impl, writes=writes):
            write(st, k)
            writes.append(impl.mark("write"))

        schedule.write = marked_write
        reads.clear()
        example.run(runner, state, schedule, overlap=True, barrier_on=barrier_on)
        executed = [r for r in reads if r.executed]
        ordered = [impl.happens_before(r, w) for r, w in zip(executed, writes[1:])]
        assert ordered and all(ordered) is barrier_on, (barrier_on, ordered)
