"""The overlap loop on the fake platform, and the overlap benchmark's fake-device path."""

from __future__ import annotations

import json
import warnings

import pytest
import torch

from warpolicy.bench.command import render
from warpolicy.errors import CudaUnavailableError, InputError
from warpolicy.runtime.policy import fixed_policy
from warpolicy.runtime.runners import DecodeRunner, OverlapLoop
from warpolicy.testing import RecModel, sim_impl, sim_platform


@pytest.fixture
def platform():
    return sim_platform()


def setup(platform, policy="in_graph", **kw):
    model = RecModel()
    runner = DecodeRunner(model, fixed_policy(policy), platform)
    runner.capture()
    log = sim_impl(platform).log
    loop = OverlapLoop(runner, **kw)
    return runner, loop, log


def step_entries(log, start):
    return [
        e
        for e in log[start:]
        if e[0] in ("replay", "wait_event", "wait_stream", "record") or e[0] == "write"
    ]


def test_step_barrier_after_launch_then_writes_on_schedule_stream(platform):
    runner, loop, log = setup(platform)
    fwd = platform.current_stream()
    seen = []

    def write_next():
        seen.append(platform.current_stream())
        log.append(("write",))

    start = len(log)
    loop.step([1.0], write_next)
    seq = step_entries(log, start)
    kinds = [e[0] for e in seq]
    assert kinds.index("replay") < kinds.index("wait_event") < kinds.index("write")
    wait = seq[kinds.index("wait_event")]
    assert wait == ("wait_event", loop.schedule_stream.id, runner.fence.event.id)
    assert seen == [loop.schedule_stream] and loop.schedule_stream is not fwd
    # after the writes: an event recorded on the schedule stream
    assert seq[-1][0] == "record" and seq[-1][2] == loop.schedule_stream.id
    assert loop.last_barrier == "event"


def test_forward_waits_for_previous_writes_before_next_launch(platform):
    runner, loop, log = setup(platform)
    loop.step([1.0], lambda: None)
    writes_ev = [e for e in log if e[0] == "record"][-1][1]
    start = len(log)
    loop.step([1.0], lambda: None)
    seq = step_entries(log, start)
    fwd = platform.current_stream()
    assert seq[0] == ("wait_event", fwd.id, writes_ev)
    assert [e[0] for e in seq].index("replay") > 0


def test_no_event_means_coarse(platform):
    runner, loop, log = setup(platform, "none")
    start = len(log)
    loop.step([1.0], None)
    fwd = platform.current_stream()
    assert ("wait_stream", loop.schedule_stream.id, fwd.id) in log[start:]
    assert loop.last_barrier == "coarse" and loop.last_read_done is None


def test_force_coarse_ignores_the_event(platform):
    runner, loop, log = setup(platform, force_coarse=True)
    start = len(log)
    loop.step([1.0], None)
    assert [
        e for e in log[start:] if e[0] == "wait_event" and e[1] == loop.schedule_stream.id
    ] == []
    assert loop.last_barrier == "coarse"


def test_unsafe_skip_barrier_waits_on_nothing(platform):
    runner, loop, log = setup(platform, unsafe_skip_barrier=True)
    start = len(log)
    loop.step([1.0], None)
    sched = loop.schedule_stream.id
    assert [e for e in log[start:] if e[0] in ("wait_event", "wait_stream") and e[1] == sched] == []
    assert loop.last_barrier == "skipped"


def test_barrier_failure_falls_back_to_coarse(platform, monkeypatch):
    runner, loop, log = setup(platform)
    monkeypatch.setattr(loop.barrier, "apply", lambda *a: 1 / 0)
    start = len(log)
    with pytest.warns(RuntimeWarning, match="barrier failed"):
        loop.step([1.0], None)
    assert ("wait_stream", loop.schedule_stream.id, platform.current_stream().id) in log[start:]
    assert loop.last_barrier == "coarse"


def test_write_events_come_from_a_ring(platform):
    runner, loop, log = setup(platform, ring_size=3)
    ids = []
    for _ in range(6):
        loop.step([1.0], None)
        ids.append([e for e in log if e[0] == "record"][-1][1])
    assert len(set(ids[:3])) == 3 and ids[3:] == ids[:3]


def test_probe_marks_each_point_on_its_stream(platform):
    marks = []

    class Probe:
        def mark(self, point, stream):
            marks.append((point, stream))

    runner, loop, log = setup(platform, probe=Probe())
    loop.step([1.0], None)
    fwd, sched = platform.current_stream(), loop.schedule_stream
    assert marks == [("launch", fwd), ("launched", fwd), ("released", sched), ("written", sched)]


def test_step_takes_a_runner_per_call(platform):
    runner, _, _ = setup(platform)
    loop = OverlapLoop(None, platform)
    out = loop.step([1.0, 2.0], None, runner=runner)
    assert out.tolist() == [2.0, 4.0]
    with pytest.raises(TypeError):
        loop.step([1.0], None)
    with pytest.raises(TypeError):
        OverlapLoop()


def test_explicit_forward_stream_is_made_current(platform):
    runner, _, log = setup(platform)
    fwd = platform.new_stream()
    loop = OverlapLoop(runner, forward_stream=fwd)
    start = len(log)
    loop.step([1.0], None)
    assert loop.last_read_done is not None
    # PRE/POST records would be on fwd; the planted node fires on the launch stream
    fired = [e for e in log[start:] if e[0] == "record" and e[3] == "in_graph"]
    assert fired and fired[0][2] == fwd.id


# -- overlap benchmark (fake path) ---------------------------------------------------------------


def test_overlap_bench_needs_cuda_without_fake():
    from warpolicy.bench.overlap import run_overlap_bench

    if torch.cuda.is_available():
        pytest.skip("CUDA present")
    with pytest.raises(CudaUnavailableError):
        run_overlap_bench(steps=5)


def test_overlap_bench_fake_reports_every_variant(tmp_path):
    from warpolicy.bench.overlap import format_overlap, run_overlap_bench

    trace = tmp_path / "t.json"
    result = run_overlap_bench(device="fake", trace=str(trace))
    names = [r["name"] for r in result["rows"]]
    assert names == [
        "coarse",
        "post_replay",
        "in_graph",
        "derived",
        "restored",
        "restored_moved",
        "pre_replay",
        "no_barrier",
    ]
    by = {r["name"]: r for r in result["rows"]}
    assert by["in_graph"]["resolved"] == "in_graph"
    assert not by["pre_replay"]["sound"] and not by["no_barrier"]["barrier"]
    assert result["targets"]["sound_policies_zero_corrupted"]
    assert all(r["checked"] == result["config"]["steps"] for r in result["rows"])
    text = format_overlap(result)
    assert "in_graph" in text and "unsafe bound" in text
    assert json.loads(render(result, "json", format_overlap))["rows"][0]["name"] == "coarse"
    events = json.loads(trace.read_text())["traceEvents"]
    assert {e["args"]["name"] for e in events if e.get("name") == "process_name"} == set(names)
    with pytest.raises(InputError):
        render(result, "xml", format_overlap)


def test_overlap_bench_fake_first_layer_rebuild_has_derived_targets():
    from warpolicy.bench.overlap import format_overlap, run_overlap_bench

    result = run_overlap_bench(device="fake", model_name="first_layer_rebuild")
    by = {r["name"]: r for r in result["rows"]}
    assert not by["in_graph"]["sound"] and by["derived"]["sound"]
    assert set(result["targets"]) >= {
        "derived_closes_90pct",
        "derived_zero_corrupted",
        "post_replay_closes_under_10pct",
        "sound_policies_zero_corrupted",
    }
    # the simulated platform has no graph model here: derived cannot plant and says why
    derived = result["capture"]["derived"]
    assert derived["buckets"] and not any(b["planted"] for b in derived["buckets"].values())
    assert by["derived"]["resolved"] == "post_replay"
    text = format_overlap(result)
    assert "model first_layer_rebuild" in text and "derived plant of the" in text
    with pytest.raises(InputError, match="model must be one of"):
        run_overlap_bench(device="fake", model_name="nope")


def test_overlap_bench_rejects_nonpositive_sizes():
    from warpolicy.bench.overlap import run_overlap_bench

    with pytest.raises(InputError):
        run_overlap_bench(device="fake", steps=0)


def testgap_closed_is_relative_to_coarse_and_bound():
    from warpolicy.bench.overlap import gap_closed

    rows = [
        {"name": "coarse", "step_us": 100.0},
        {"name": "in_graph", "step_us": 91.0},
        {"name": "no_barrier", "step_us": 90.0},
    ]
    gap_closed(rows)
    assert [r["gap_closed"] for r in rows] == [0.0, pytest.approx(0.9), 1.0]
    rows = [{"name": "coarse", "step_us": 100.0}, {"name": "no_barrier", "step_us": 99.9}]
    gap_closed(rows)
    assert rows[0]["gap_closed"] is None  # no gap to close: not a ratio of noise


def test_failing_write_next_still_orders_the_next_forward_after_its_writes(platform):
    runner, loop, log = setup(platform)

    def broken():
        log.append(("write",))
        raise ValueError("scheduler bug")

    with pytest.raises(ValueError):
        loop.step([1.0], broken)
    after = [e for e in log if e[0] in ("write", "record")]
    assert after[-2] == ("write",) and after[-1][2] == loop.schedule_stream.id
    written = after[-1][1]
    start = len(log)
    loop.step([1.0], None)
    assert step_entries(log, start)[0] == ("wait_event", platform.current_stream().id, written)


# -- ordered after failures ----------------------------------------------------------------------


def test_a_failed_write_record_makes_the_next_forward_wait_for_the_whole_schedule_stream(platform):
    runner, loop, log = setup(platform)
    impl = sim_impl(platform)
    writes = []

    def write_next():
        writes.append(impl.mark("write"))

    loop.step([1.0], write_next)  # a good step: the next forward waits on its event
    impl.inject("record", "raise", when=lambda: impl.current_stream() is loop.schedule_stream)
    with pytest.warns(RuntimeWarning, match="recording the writes failed"):
        loop.step([1.0], write_next)
    impl.clear_faults()
    reads = []
    runner.model.graph_prep = lambda bucket: reads.append(impl.mark("read"))
    start = len(log)
    loop.step([1.0], None)
    fwd = platform.current_stream()
    assert step_entries(log, start)[0] == ("wait_stream", fwd.id, loop.schedule_stream.id)
    assert impl.happens_before(writes[-1], reads[-1])  # read-after-write still ordered


@pytest.mark.parametrize("fault", ["wait_event", "wait_event+wait_stream"])
def test_a_failed_wait_for_the_writes_falls_back_and_keeps_the_order(platform, fault):
    runner, loop, log = setup(platform)
    impl = sim_impl(platform)
    writes, reads = [], []
    loop.step([1.0], lambda: writes.append(impl.mark("write")))
    runner.model.graph_prep = lambda bucket: reads.append(impl.mark("read"))
    fwd = platform.current_stream()
    impl.inject("wait_event", "raise", when=lambda: impl.current_stream() is fwd)
    if fault == "wait_event+wait_stream":
        impl.inject("wait_stream", "raise", when=lambda: impl.current_stream() is fwd)
    # two warnings, both the product's: the barrier's own fallback, then the loop's
    with (
        pytest.warns(RuntimeWarning, match="falling back to the coarse barrier"),
        pytest.warns(RuntimeWarning, match="waiting for the last writes failed"),
    ):
        loop.step([1.0], None)
    assert impl.happens_before(writes[-1], reads[-1])


def test_when_every_barrier_fails_nothing_is_written(platform):
    runner, loop, log = setup(platform)
    impl = sim_impl(platform)
    for op in ("wait_event", "wait_stream", "synchronize"):
        impl.inject(op, "raise", when=lambda: impl.current_stream() is not loop.schedule_stream)
    written = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(Exception, match="injected"):
            loop.step([1.0], lambda: written.append(1))
    assert written == []


class FailingStepModel(RecModel):
    """Marks each read of the shared table; the forward of batch value ``fail_at`` raises."""

    def __init__(self, impl, fail_at):
        super().__init__((1,))
        self.impl, self.fail_at, self.reads, self.current = impl, fail_at, [], None

    def host_prep(self, batch, bucket):
        super().host_prep(batch, bucket)
        self.current = batch[0]

    def graph_prep(self, bucket):
        super().graph_prep(bucket)
        mark = self.impl.mark("read")
        if mark.executed:
            self.reads.append(mark)

    def forward(self, bucket):
        if self.current == self.fail_at:
            raise KeyboardInterrupt("the launch failed half way")
        return super().forward(bucket)


@pytest.mark.parametrize("policy", ["in_graph", "post_replay", "none"])
def test_a_failed_launch_keeps_the_next_steps_ordered_on_any_stream(policy):
    """Found by the fault matrix: a launch that raises after enqueuing its reads, with each
    step on its own forward stream. Every write must come after the reads of every step before
    it (the failed one included), and every read after the writes of the steps before it."""
    platform = sim_platform()
    impl = sim_impl(platform)
    model = FailingStepModel(impl, fail_at=2.0)
    runner = DecodeRunner(model, fixed_policy(policy), platform)
    runner.capture()
    loop = OverlapLoop(runner)
    forward = [platform.new_stream() for _ in range(3)]
    reads, writes = [], []  # (step, mark)
    for k in range(6):
        start = len(model.reads)
        with platform.stream(forward[k % 3]):
            try:
                loop.step([float(k)], lambda k=k: writes.append((k, impl.mark("write"))))
            except KeyboardInterrupt:
                assert k == 2
        reads += [(k, mark) for mark in model.reads[start:]]
    assert {k for k, _ in reads} == set(range(6)) and {k for k, _ in writes} == {0, 1, 3, 4, 5}
    early = [
        (r, w)
        for r, read in reads
        for w, write in writes
        if r <= w and not impl.happens_before(read, write)
    ]
    stale = [
        (w, r)
        for w, write in writes
        for r, read in reads
        if w < r and not impl.happens_before(write, read)
    ]
    assert early == [] and stale == []


@pytest.mark.parametrize("policy", ["in_graph", "post_replay", "none"])
def test_a_second_interrupt_in_the_fallback_keeps_the_next_steps_ordered(policy):
    """Issue 26 finding 2: the launch raises, then a KeyboardInterrupt hits the fallback
    ``wait_stream`` of `OverlapLoop._launch_failed` (0.3.0 caught only ``Exception`` there,
    skipped the synchronize, and the next step on another stream released before the failed
    launch's reads). The host now waits for everything before the second interrupt propagates."""
    platform = sim_platform()
    impl = sim_impl(platform)
    model = FailingStepModel(impl, fail_at=2.0)
    runner = DecodeRunner(model, fixed_policy(policy), platform)
    runner.capture()
    loop = OverlapLoop(runner)
    forward = [platform.new_stream() for _ in range(3)]
    real_wait = platform.wait_stream
    fired = []

    def second_fault(stream, other):
        # the fallback after the failed launch: the schedule stream waits for the forward
        if model.current == 2.0 and stream is loop.schedule_stream and not fired:
            fired.append((stream.id, other.id))
            raise KeyboardInterrupt("a second interrupt in the fallback")
        real_wait(stream, other)

    platform.wait_stream = second_fault
    reads, writes = [], []  # (step, mark)
    for k in range(6):
        start = len(model.reads)
        with platform.stream(forward[k % 3]):
            try:
                loop.step([float(k)], lambda k=k: writes.append((k, impl.mark("write"))))
            except KeyboardInterrupt as exc:
                assert k == 2 and "second" in str(exc)
        reads += [(k, mark) for mark in model.reads[start:]]
    assert fired  # the control: the second fault really hit the fallback
    early = [
        (r, w)
        for r, read in reads
        for w, write in writes
        if r <= w and not impl.happens_before(read, write)
    ]
    assert {k for k, _ in writes} == {0, 1, 3, 4, 5} and early == []


def test_a_barrier_interrupted_after_the_launch_keeps_the_next_forward_after_the_writes(
    platform, monkeypatch
):
    """A KeyboardInterrupt in the barrier (or an observer of it) ends the step before its
    writes are recorded: the next forward, on another stream, waits for the whole schedule
    stream (it holds the writes of the step before)."""
    runner, loop, log = setup(platform)
    impl = sim_impl(platform)
    forward = [platform.new_stream() for _ in range(2)]
    writes = []
    with platform.stream(forward[0]):
        loop.step([1.0], lambda: writes.append(impl.mark("write")))

    def interrupted(*args):
        raise KeyboardInterrupt

    monkeypatch.setattr(loop.barrier, "apply", interrupted)
    with platform.stream(forward[1]), pytest.raises(KeyboardInterrupt):
        loop.step([1.0], None)
    monkeypatch.undo()
    start = len(log)
    with platform.stream(forward[0]):
        loop.step([1.0], None)
        read = impl.mark("after the next step's launch")
    assert impl.happens_before(writes[0], read)
    assert ("wait_stream", forward[0].id, loop.schedule_stream.id) in log[start:]
