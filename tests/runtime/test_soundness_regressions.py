"""Regressions for the thirteen classes of issue 17 ("Sound by construction"): each test fails
on 0.2.0 (commit e1c9dfa) and passes once the runtime is sound.

They use the runners, fence, loop and platform through their public surface; ordering is
judged by the fault matrix's independent oracle (`warpolicy.testing.faults`: vector clocks over
the simulated platform's call log, not the platform's own clocks). Where the fix needs an API
0.2.0 does not have, the test asks only for what the issue requires and says so in a
``NEW API`` comment.
"""

from __future__ import annotations

import math
import threading
import warnings
from types import SimpleNamespace

import pluggy
import pytest

from warpolicy.errors import InputError, PluginError, WarpolicyError
from warpolicy.registry.engine import PolicyEngine
from warpolicy.registry.loader import Fragment, load_registry
from warpolicy.registry.vocabulary import (
    IN_GRAPH,
    NONE,
    POST_REPLAY,
    PRE_REPLAY,
    ForwardMode,
)
from warpolicy.runtime import distributed as wd
from warpolicy.runtime.fence import SchedulerBarrier
from warpolicy.runtime.hookspecs import hookimpl
from warpolicy.runtime.manager import new_plugin_manager
from warpolicy.runtime.platforms.sim import SimPlatform
from warpolicy.runtime.runners import (
    DecodeRunner,
    DraftExtendRunner,
    OverlapLoop,
    Phase,
    SpecStep,
    VerifyRunner,
)
from warpolicy.testing.faults.compat import component_kwargs, open_device
from warpolicy.testing.faults.harness import Harness
from warpolicy.testing.faults.injection import Fault, InjectedError
from warpolicy.testing.faults.model import READ_PLANS, HarnessModel, policy_table
from warpolicy.testing.faults.oracle import Oracle

DECODE, VERIFY, DRAFT = ForwardMode.DECODE, ForwardMode.TARGET_VERIFY, ForwardMode.DRAFT_EXTEND
BUCKETS = {DECODE: (2, 4), VERIFY: (4, 8), DRAFT: (4, 8)}


def runner_on(h, policy, reads="prep", cls=DecodeRunner, **kw):
    """A runner of ``cls`` on the harness's platform; the model reads where ``reads`` says."""
    model = HarnessModel(h, READ_PLANS[reads], BUCKETS, name=cls.mode.label)
    if cls is VerifyRunner:
        kw.setdefault("draft_tokens", 2)
    table = policy if callable(policy) else policy_table(h, dict.fromkeys(BUCKETS, policy))
    return cls(model, table, h.platform, **h.kw, **kw)


def steps(h, loop, runner, sizes):
    """One `OverlapLoop` step per size; the scheduler writes shared state in each."""
    for size in sizes:
        h.begin_step()
        loop.step([0] * size, h.write, runner=runner)


def quietly():
    catcher = warnings.catch_warnings(record=True)
    caught = catcher.__enter__()
    warnings.simplefilter("always")
    return catcher, caught


def early(h):
    verdict = h.oracle.verdict
    return verdict.early_writes, verdict.first_early


# -- 1. a raising walk probe skipped the self-check ---------------------------------------------------


def test_class_01_a_raising_walk_probe_demotes_like_a_failing_check():
    h = Harness(Fault("graph_walk_unavailable", "raise", nth=1))
    runner = runner_on(h, IN_GRAPH, reads="late")  # a shared reader after the marker
    loop = OverlapLoop(runner)
    with h.recording():
        runner.capture()
        steps(h, loop, runner, (2, 4, 2))
        published = {runner.last_step.policy}
        steps(h, loop, runner, (4,))
        published.add(runner.last_step.policy)
    assert h.injector.fired == 1
    assert early(h) == (0, None)
    assert IN_GRAPH not in published  # no check, no in_graph
    assert h.warned or h.observers.seen  # and the engine hears of it


# -- 2. a policy lookup that failed once skipped the self-check -----------------------------------


def test_class_02_a_policy_lookup_failing_once_never_skips_the_self_check():
    h = Harness(Fault("policy", "raise", nth=1))
    runner = runner_on(h, IN_GRAPH, reads="late")
    loop = OverlapLoop(runner)
    with h.recording():
        runner.capture()
        steps(h, loop, runner, (2, 4, 3))
    assert h.injector.fired == 1
    assert early(h) == (0, None)
    assert all(cb.policy is not IN_GRAPH for cb in runner.captured.values())


# -- 3. KeyboardInterrupt in the warm-up join skipped join and synchronize ----------------------------


def _spec_step(h, policy):
    verify = runner_on(h, policy, cls=VerifyRunner, reads="late")
    draft = runner_on(h, policy, cls=DraftExtendRunner, reads="late")
    return SpecStep((Phase(verify), Phase(draft)), last_reader=DRAFT, **h.kw)


@pytest.mark.parametrize("kind", ["decode", "spec_step"])
@pytest.mark.parametrize("error", ["interrupt", "base"])
def test_class_03_an_interrupted_warm_up_join_still_orders_the_warm_up_reads(kind, error):
    h = Harness(Fault("wait_stream", error, nth=2))  # 1: side waits main; 2: the join
    runner = (
        runner_on(h, POST_REPLAY, reads="late") if kind == "decode" else _spec_step(h, POST_REPLAY)
    )
    loop = OverlapLoop(platform=h.platform, **h.kw)
    raised = KeyboardInterrupt if error == "interrupt" else BaseException
    with h.recording():
        with pytest.raises(raised):  # the caller sees the interrupt
            runner.capture()
        steps(h, loop, runner, (4, 8) if kind == "spec_step" else (2, 4))
    assert h.injector.fired == 1
    assert early(h) == (0, None)


# -- 4. a failed re-capture kept a bucket's old graph and event ----------------------------------------


def test_class_04_after_a_failed_capture_the_runner_is_coarse_until_one_succeeds():
    seed_record_fails = Fault("record", "raise", nth=1, phase="recapture")
    largest_bucket_fails = Fault("capture_callable", "raise", nth=1, phase="recapture")
    h = Harness(largest_bucket_fails, seed_record_fails)
    runner = runner_on(h, IN_GRAPH)
    loop = OverlapLoop(runner)
    with h.recording():
        runner.capture()
        steps(h, loop, runner, (2, 4))
        loop.drain()
        h.phase("recapture")
        with pytest.raises(InjectedError):
            runner.capture()
        h.phase("run")
        barriers = []
        for size in (2, 4, 2):
            steps(h, loop, runner, (size,))
            barriers.append(loop.last_barrier)
    assert early(h) == (0, None)
    assert barriers == ["coarse"] * 3  # nothing published until a capture succeeds


# -- 5. an instantiate failure left a marker bucket in_graph ------------------------------------------


def test_class_05_an_instantiate_failure_leaves_the_marker_bucket_unplanted():
    h = Harness(Fault("instantiate", "raise", nth=1))  # the first bucket captured: 4
    runner = runner_on(h, IN_GRAPH)  # the self-check keeps (and instantiates) the graphs
    loop = OverlapLoop(runner)
    with h.recording():
        runner.capture()
        steps(h, loop, runner, (3,))
    assert h.injector.fired == 1
    assert runner.last_step.bucket == 4
    assert runner.last_step.policy is not IN_GRAPH
    assert loop.last_read_done is None or loop.last_read_done.policy is not IN_GRAPH
    assert early(h) == (0, None)


# -- 6. a lagging scheduler: the ring, and launches of one graph serialized --------------------------


@pytest.mark.parametrize("policy", [POST_REPLAY, PRE_REPLAY, IN_GRAPH], ids=lambda p: p.label)
def test_class_06_a_scheduler_ring_size_launches_behind_never_releases_early(policy):
    """Each step's event is taken at launch and waited on ``ring_size`` launches later, with
    three unordered forward streams and two buckets (two graphs). The runtime may refuse (a
    `WarpolicyError`) or go coarse, never release early."""
    ring = 4
    h = Harness(check_stale=False)
    runner = runner_on(h, policy, reads="host" if policy is PRE_REPLAY else "late", ring_size=ring)
    barrier = SchedulerBarrier(h.platform, **h.kw)
    forward = [h.platform.new_stream() for _ in range(3)]
    schedule = h.platform.new_stream()
    taken, refusals = [], []
    with h.recording():
        runner.capture()
        for index, size in enumerate((2, 4, 2, 2, 4, 4, 2, 4, 2, 2, 4, 2)):
            step = h.begin_step()
            with h.platform.stream(forward[index % 3]):
                try:
                    runner.run([0] * size)
                    read_done = runner.fence.take()
                except WarpolicyError as exc:  # a refusal is allowed
                    refusals.append(exc)
                    read_done = None
            taken.append((step, forward[index % 3], read_done))
            if len(taken) > ring:
                done, stream, read_done = taken.pop(0)
                barrier.apply(schedule, stream, read_done)
                with h.platform.stream(schedule):
                    h.write(through=done)
    assert early(h) == (0, None)


def _two_launches(platform, same_graph):
    """Two launches on two streams, the scheduler waiting on the event of the first after the
    second re-recorded it; returns (read mark of the first launch, write mark). The same
    points go into the call log for the oracle."""
    event = platform.create_event(True)
    platform.record(event)  # seed
    reads, launches = [], []

    def mark(kind, step):
        point = platform.mark(kind)
        if point.executed:
            platform.log.emit((kind, point.stream, 0, step, kind))
        return point

    def body():
        reads.append(mark("read", len(launches)))
        platform.record(event)

    def launch(graph, stream):
        launches.append(graph)
        with platform.use_stream(stream):
            platform.log.emit(("launch", graph.id, stream.id))
            platform.replay(graph)
            platform.log.emit(("landed", graph.id, stream.id))

    graphs = [platform.new_graph(False) for _ in range(2)]
    for graph in graphs:
        platform.capture_callable(graph, body)
    first, second, schedule = (platform.new_stream() for _ in range(3))
    launch(graphs[0], first)
    read = reads[-1]
    launch(graphs[0] if same_graph else graphs[1], second)
    platform.wait_event(schedule, event)
    with platform.use_stream(schedule):
        write = mark("write", 1)  # released for the first launch only
    return read, write


@pytest.mark.parametrize("same_graph", [True, False])
def test_class_06_the_simulated_platform_serializes_launches_of_one_graph_as_cuda_does(same_graph):
    """A wait taken after a later launch of the *same* graph only over-waits (CUDA serializes
    launches of one graph exec across streams; H200: 0/20 corrupted); another graph recording
    the same event on another stream races. The simulated platform's own happens-before must
    agree with the oracle on both (issue 17 item 2)."""
    sim = SimPlatform()
    oracle = Oracle()
    oracle.attach(sim.log.listeners)
    read, write = _two_launches(sim, same_graph)
    assert (oracle.verdict.early_writes == 0) is same_graph  # the oracle models CUDA
    assert sim.happens_before(read, write) is same_graph


# -- 7. two threads stepping one runner -------------------------------------------------------------


def test_class_07_a_second_thread_using_a_runner_gets_a_clear_error_never_a_race():
    """NEW API (issue 17 item 3): one owner thread per runner, fence and loop; concurrent use
    raises a clear error. The test asks for an exception naming the thread(s), whatever its
    type, raised to the second thread while the owner is inside a step."""
    h = Harness(check_stale=False)
    runner = runner_on(h, POST_REPLAY, reads="late")
    owner_loop = OverlapLoop(runner)
    second_loop = OverlapLoop(runner, forward_stream=h.platform.new_stream())
    outcome: dict = {}

    def second_thread():
        h.lane = 1
        h.begin_step()
        try:
            second_loop.step([0] * 4, h.write)
            outcome["error"] = None
        except Exception as exc:  # noqa: BLE001 - the error is what the test is about
            outcome["error"] = exc

    model = runner.model
    host_prep = model.host_prep
    interleaved = []

    def host_prep_letting_the_second_thread_in(batch, bucket):
        host_prep(batch, bucket)
        if not interleaved and threading.current_thread() is threading.main_thread():
            interleaved.append(True)
            other = threading.Thread(target=second_thread)
            other.start()
            other.join(timeout=10)

    model.host_prep = host_prep_letting_the_second_thread_in
    with h.recording():
        runner.capture()
        steps(h, owner_loop, runner, (2, 2))
    error = outcome.get("error")
    assert error is not None, "a second thread stepped the runner inside the owner's step"
    assert "thread" in str(error).lower(), error
    assert early(h) == (0, None)


# -- 8. the cross-rank fingerprint omitted the placement -----------------------------------------------

DERIVED_YAML = """\
version: 1
spec_algorithms:
  none: {}
backends:
  walked: {reads_end: {decode: in_graph}, plant: {decode: derived}}
"""
MARKER_YAML = DERIVED_YAML.replace("derived", "marker")


class _TwoRanks:
    """torch.distributed as one rank of a two-rank gloo group sees it (no processes)."""

    group = SimpleNamespace(WORLD=None)

    def is_initialized(self):
        return True

    def get_world_size(self, group=None):
        return 2

    def get_rank(self, group=None):
        return 0

    def get_backend(self, group=None):
        return "gloo"


def _rank_runner(yaml):
    h = Harness()
    compiled = PolicyEngine(load_registry([Fragment("caps.yaml", yaml)]), environ={}).compile(
        "walked", platform="sim"
    )
    model = HarnessModel(h, READ_PLANS["prep"], BUCKETS)
    return DecodeRunner(model, compiled, h.platform, process_group=object(), **h.kw)


def test_class_08_ranks_differing_only_in_placement_end_coarse(monkeypatch):
    monkeypatch.setattr(wd, "_distributed", lambda: _TwoRanks())
    sent = {}

    def record(data, group=None, device=None, fixed=False):  # rank 1: records what it sends
        sent[fixed] = data  # (a differing digest takes it to the second round, the payload)
        return [data, bytes(len(data)) if fixed else data]

    monkeypatch.setattr(wd, "all_gather_bytes", record)
    peer = _rank_runner(MARKER_YAML)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        peer.capture()

    def with_peer(data, group=None, device=None, fixed=False):  # rank 0 hears rank 1
        return [data, sent[fixed]] if fixed in sent else [data, data]

    monkeypatch.setattr(wd, "all_gather_bytes", with_peer)
    runner = _rank_runner(DERIVED_YAML)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        runner.capture()
    assert runner.consistency is not None and not runner.consistency.ok
    assert {runner.policy_for(b) for b in runner.buckets} == {NONE}


# -- 9. observers and the platform claim ignored parameters with defaults ------------------------------


def _pluggy_passes_defaults() -> bool:
    """Whether this pluggy passes a caller's value to an implementation parameter that has a
    default (1.7: yes; 1.5: no, the default is used)."""
    spec, impl = pluggy.HookspecMarker("probe"), pluggy.HookimplMarker("probe")

    class Spec:
        @spec
        def hook(self, a, b):
            """Probe."""

    got = []

    class Plugin:
        @impl
        def hook(self, a, b="default"):
            got.append(b)

    pm = pluggy.PluginManager("probe")
    pm.add_hookspecs(Spec)
    pm.register(Plugin())
    pm.hook.hook(a=1, b="given")
    return got == ["given"]


def test_class_09_observers_get_what_pluggy_passes_parameters_with_defaults_included():
    pm = new_plugin_manager(load_entry_points=False, environ={})
    seen = []

    class Observer:
        @hookimpl
        def warpolicy_on_publish(self, runner, step, policy=None, event="default"):
            seen.append((policy, event))

    pm.register(Observer(), name="with-defaults")
    platform = open_device(pm, "sim")
    model = HarnessModel(Harness(), READ_PLANS["late"], BUCKETS)
    policy = lambda mode, eager, planted: POST_REPLAY  # noqa: E731
    runner = DecodeRunner(model, policy, platform, **component_kwargs(pm))
    runner.capture()
    runner.run([0, 0])
    assert seen, "the observer was not called"
    policy, event = seen[-1]
    if _pluggy_passes_defaults():
        assert policy is POST_REPLAY and event is not None and event != "default"
    else:
        assert (policy, event) == (None, "default")


def test_class_09_the_platform_claim_gets_the_device_as_pluggy_passes_it():
    pm = new_plugin_manager(load_entry_points=False, environ={})

    class Claims:
        @hookimpl
        def warpolicy_platform(self, device="unset"):
            return SimPlatform(device="mine") if str(device).startswith("mine") else None

    pm.register(Claims(), name="claims-mine")
    if _pluggy_passes_defaults():
        assert open_device(pm, "mine:0").impl.device == "mine"
    else:
        with pytest.raises(WarpolicyError):
            open_device(pm, "mine:0")


# -- 10. a claim's external_events_supported read as True whatever it was --------------------------------


@pytest.mark.parametrize("value", ["false", "method"], ids=["the string false", "a method"])
def test_class_10_a_claim_with_a_non_bool_external_events_flag_is_refused(value):
    pm = new_plugin_manager(load_entry_points=False, environ={})

    class Odd:
        @hookimpl
        def warpolicy_platform(self, device):
            if not str(device).startswith("odd"):
                return None
            impl = SimPlatform(device="odd")
            impl.external_events_supported = "false" if value == "false" else (lambda: False)
            return impl

    pm.register(Odd(), name="odd")
    with pytest.raises(PluginError, match="external_events_supported"):
        open_device(pm, "odd")


# -- 11. demotions and fallbacks after the first were silent to observers ------------------------------


def test_class_11_every_failed_policy_lookup_reaches_the_observers():
    """Two runners whose policy lookups fail: each failure is reported to the observers (the
    warning may be rate-limited; the notifications and counts are not)."""
    h = Harness(Fault("policy", "raise", phase="capture"))
    runners = [runner_on(h, IN_GRAPH, name=name) for name in ("decode-a", "decode-b")]
    with h.recording():
        h.phase("capture")
        for runner in runners:
            runner.capture()
        h.phase("run")
    assert h.injector.fired >= 2
    notified = h.observers.seen.get("warpolicy_on_fallback", 0) + h.observers.seen.get(
        "warpolicy_on_demotion", 0
    )
    assert notified >= len(runners), (h.injector.fired, h.observers.seen)
    assert len(h.warned) >= 1


def test_class_11_every_failed_record_of_the_writes_reaches_the_observers():
    h = Harness(Fault("record", "raise", phase="write"))
    runner = runner_on(h, POST_REPLAY, reads="late")
    loop = OverlapLoop(runner)
    with h.recording():
        runner.capture()
        for size in (2, 4, 2):
            h.phase("run")
            h.begin_step()
            loop.step([0] * size, lambda: (h.phase("write"), h.write()))
    assert h.injector.fired == 3
    assert h.observers.seen.get("warpolicy_on_fallback", 0) >= 3, h.observers.seen


# -- 12. a phase after the declared last reader published and was discarded -----------------------------


def test_class_12_a_phase_after_the_last_reader_that_publishes_is_refused_or_released_at():
    h = Harness()
    phases = [
        Phase(runner_on(h, NONE, cls=VerifyRunner, reads="late")),
        Phase(runner_on(h, PRE_REPLAY, cls=DraftExtendRunner, reads="host")),
        Phase(runner_on(h, IN_GRAPH, cls=DecodeRunner, reads="prep")),
    ]
    loop = OverlapLoop(platform=h.platform, **h.kw)
    with h.recording():
        try:
            step = SpecStep(phases, last_reader=DRAFT, **h.kw)
            step.capture()
        except InputError:
            return  # refused at construction (or capture): sound
        for size in (4, 8, 4):
            h.begin_step()
            loop.step([0] * size, h.write, runner=step)
    assert early(h) == (0, None)


# -- 13. hostile or junk inputs to the runtime --------------------------------------------------------


class TestClass13JunkInputs:
    def test_a_peer_announcing_a_huge_fingerprint_is_refused_before_any_allocation(
        self, monkeypatch
    ):
        import torch
        import torch.distributed as dist

        announced = 256 * 2**20
        zeros = torch.zeros

        def all_gather(out, tensor, group=None):
            if tensor.numel() == 1:  # the length round: the peer announces 256 MiB
                out[0].copy_(tensor)
                out[1].fill_(announced)
            else:
                pytest.fail("the payload round ran after a 256 MiB announcement")

        def guarded_zeros(*size, **kw):
            count = math.prod(size[0] if size and isinstance(size[0], (tuple, list)) else size)
            if count >= announced:
                raise AssertionError(f"allocated {count} bytes for a peer's fingerprint")
            return zeros(*size, **kw)

        monkeypatch.setattr(dist, "get_world_size", lambda group=None: 2)
        monkeypatch.setattr(dist, "all_gather", all_gather)
        monkeypatch.setattr(torch, "zeros", guarded_zeros)
        with pytest.raises(Exception) as refused:  # a refusal, then the check ends coarse
            wd.all_gather_bytes(b'[["platform","sim"]]', None, "cpu")
        assert not isinstance(refused.value, AssertionError), refused.value

    @pytest.mark.parametrize("sizes", [["x"], [math.inf], [math.nan], None])
    def test_junk_bucket_sizes_are_an_input_error(self, sizes):
        h = Harness()
        model = HarnessModel(h, READ_PLANS["prep"], {DECODE: sizes})
        model.bucket_sizes = lambda mode: sizes
        with pytest.raises(InputError):
            DecodeRunner(model, lambda mode, eager, planted: IN_GRAPH, h.platform)

    def test_an_unknown_placement_is_an_input_error(self):
        h = Harness()
        model = HarnessModel(h, READ_PLANS["prep"], BUCKETS)
        with pytest.raises(InputError):
            DecodeRunner(
                model, lambda mode, eager, planted: IN_GRAPH, h.platform, placement="bogus"
            )

    @pytest.mark.parametrize("where", ["runner", "loop"])
    def test_an_absurd_ring_size_is_refused_not_allocated(self, where):
        h = Harness()
        created = []
        create = h.impl.create_event

        def counting(external):
            created.append(external)
            if len(created) > 10_000:
                raise MemoryError("a ring of millions of events was being created")
            return create(external)

        h.impl.create_event = counting
        model = HarnessModel(h, READ_PLANS["prep"], BUCKETS)

        def build() -> None:
            if where == "loop":
                OverlapLoop(platform=h.platform, ring_size=10**7)
            else:
                runner = DecodeRunner(
                    model, lambda mode, eager, planted: IN_GRAPH, h.platform, ring_size=10**7
                )
                runner.capture()

        with pytest.raises(InputError):
            build()

    @pytest.mark.parametrize("planted", [-1, 2, "yes", None])
    def test_compiled_lookups_with_unchecked_facts_never_answer_in_graph_for_eager(self, planted):
        engine = PolicyEngine(load_registry([Fragment("caps.yaml", MARKER_YAML)]), environ={})
        compiled = engine.compile("walked", platform="sim")
        for answer in (
            lambda: compiled.lookup(DECODE, True, planted),
            lambda: compiled.per_step(True, planted)(DECODE),
        ):
            try:
                policy = answer()
            except InputError:
                continue  # refusing unchecked facts is sound too
            assert policy is not IN_GRAPH and policy is not PRE_REPLAY
