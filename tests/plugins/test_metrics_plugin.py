"""The warpolicy-metrics plugin: real exposition text scraped after runs on the fake platform,
the entry-point path, release sampling (with a stand-in timing on CPU, real CUDA events on a
GPU) and the CPU micro-benchmark."""

from __future__ import annotations

import collections
import pathlib
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

prometheus_client = pytest.importorskip("prometheus_client")
from prometheus_client import CollectorRegistry, generate_latest  # noqa: E402
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

PLUGIN_ROOT = pathlib.Path(__file__).resolve().parents[2] / "plugins" / "warpolicy-metrics"
if str(PLUGIN_ROOT) not in sys.path:  # the plugin's source tree, as an editable install puts it
    sys.path.insert(0, str(PLUGIN_ROOT))

import warpolicy_metrics  # noqa: E402
from warpolicy.bench.models import fixed_policy  # noqa: E402
from warpolicy.registry.vocabulary import IN_GRAPH, NONE, POST_REPLAY  # noqa: E402
from warpolicy.runtime.hookspecs import hookimpl  # noqa: E402
from warpolicy.runtime.manager import (  # noqa: E402
    Runtime,
    describe_plugins,
    new_plugin_manager,
    reset_plugin_manager,
)
from warpolicy.runtime.runners import DecodeRunner, OverlapLoop  # noqa: E402
from warpolicy.testing import RecModel, sim_platform, sim_runtime  # noqa: E402
from warpolicy_metrics import WarpolicyMetrics  # noqa: E402


def scrape(registry: CollectorRegistry) -> dict[tuple[str, frozenset], float]:
    """Parse the registry's exposition text: (sample name, labels) -> value."""
    text = generate_latest(registry).decode()
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def value(samples: dict, name: str, **labels: str) -> float | None:
    return samples.get((name, frozenset(labels.items())))


def run_loop(policy: str, steps: int, *, registry=None, plugin=None, rt=None, **loop_kw):
    """Capture a DecodeRunner with ``policy`` and run ``steps`` overlap steps; returns the
    registry, the platform and the loop."""
    registry = registry if registry is not None else CollectorRegistry()
    rt = rt if rt is not None else sim_runtime()
    platform = rt.platform
    rt.pm.register(plugin if plugin is not None else WarpolicyMetrics(registry))
    runner = DecodeRunner(
        RecModel(), fixed_policy(policy), platform, name="decode", observers=rt.observers
    )
    runner.capture()
    loop = OverlapLoop(runner, **loop_kw)
    for _ in range(steps):
        loop.step([1.0, 2.0], lambda: None)
    return registry, platform, loop


@pytest.fixture(autouse=True)
def _forget_module_metrics():
    yield
    warpolicy_metrics.reset()


# -- counters and gauges after a run ---------------------------------------------------------------


def test_in_graph_run_counts_publishes_barriers_and_the_resolved_policy():
    registry, _, loop = run_loop("in_graph", 7)
    samples = scrape(registry)
    assert (
        value(samples, "warpolicy_read_done_publishes_total", runner="decode", policy="in_graph")
        == 7
    )
    assert (
        value(samples, "warpolicy_read_done_publishes_total", runner="decode", policy="none")
        is None
    )
    assert (
        value(samples, "warpolicy_barriers_total", runner="decode", kind="event", reason="in_graph")
        == 7
    )
    assert (
        value(
            samples, "warpolicy_resolved_policy", runner="decode", mode="decode", graph="captured"
        )
        == 1
    )
    assert loop.last_barrier == "event"


def test_none_policy_counts_coarse_barriers_with_their_reason():
    registry, _, _ = run_loop("none", 3)
    samples = scrape(registry)
    assert (
        value(samples, "warpolicy_read_done_publishes_total", runner="decode", policy="none") == 3
    )
    # nothing was taken, so the barrier reports under the scheduler's own name
    assert (
        value(
            samples,
            "warpolicy_barriers_total",
            runner="scheduler",
            kind="coarse",
            reason="no read-done event",
        )
        == 3
    )
    assert (
        value(
            samples, "warpolicy_resolved_policy", runner="decode", mode="decode", graph="captured"
        )
        == 3
    )


def test_forced_coarse_is_its_own_reason():
    registry, _, _ = run_loop("in_graph", 4, force_coarse=True)
    samples = scrape(registry)
    assert (
        value(samples, "warpolicy_read_done_publishes_total", runner="decode", policy="in_graph")
        == 4
    )
    assert (
        value(samples, "warpolicy_barriers_total", runner="decode", kind="coarse", reason="forced")
        == 4
    )
    assert (
        value(samples, "warpolicy_barriers_total", runner="decode", kind="event", reason="in_graph")
        is None
    )


def test_eager_steps_resolve_their_own_gauge():
    registry, _, loop = run_loop("in_graph", 1)
    loop.step([1.0] * 9, None)  # larger than every bucket: eager, demoted to post_replay
    samples = scrape(registry)
    assert (
        value(samples, "warpolicy_resolved_policy", runner="decode", mode="decode", graph="eager")
        == 2
    )
    assert (
        value(
            samples, "warpolicy_resolved_policy", runner="decode", mode="decode", graph="captured"
        )
        == 1
    )
    assert (
        value(samples, "warpolicy_read_done_publishes_total", runner="decode", policy="post_replay")
        == 1
    )


class RaisingObserver:
    @hookimpl
    def warpolicy_on_publish(self, runner, step, policy, event):
        raise RuntimeError("observer broke")


def test_fallback_is_counted_by_place():
    """Another observer raising in on_publish is reported as a fallback and changes nothing
    else (each observer is its own call): metrics count the fallback and the publish, and
    the step keeps its event."""
    rt = sim_runtime()
    rt.pm.register(RaisingObserver(), name="broken")
    with pytest.warns(RuntimeWarning, match="'broken' raised in warpolicy_on_publish"):
        registry, _, loop = run_loop("in_graph", 2, rt=rt)
    samples = scrape(registry)
    assert (
        value(
            samples, "warpolicy_fallbacks_total", where="fence 'decode':warpolicy_on_publish:broken"
        )
        == 2
    )
    assert (
        value(samples, "warpolicy_read_done_publishes_total", runner="decode", policy="in_graph")
        == 2
    )
    assert (
        value(samples, "warpolicy_barriers_total", runner="decode", kind="event", reason="in_graph")
        == 2
    )
    assert loop.last_barrier == "event"


def test_metrics_never_make_a_step_coarse():
    """With the plugin registered the barrier is still the event (the hooks do not raise)."""
    _, _, loop = run_loop("in_graph", 2)
    assert loop.last_barrier == "event" and loop.last_read_done.policy == IN_GRAPH


def test_a_second_instance_on_one_registry_is_refused_and_changes_nothing():
    registry = CollectorRegistry()
    WarpolicyMetrics(registry)
    before = generate_latest(registry)
    with pytest.raises(ValueError, match="Duplicated"):
        WarpolicyMetrics(registry)
    assert generate_latest(registry) == before


@settings(max_examples=40, deadline=None)
@given(
    st.lists(
        st.one_of(
            st.tuples(
                st.just("publish"),
                st.sampled_from(["decode", "verify"]),
                st.sampled_from([IN_GRAPH, POST_REPLAY, NONE]),
            ),
            st.tuples(
                st.just("barrier"),
                st.sampled_from(["decode", "scheduler"]),
                st.sampled_from(
                    [("event", "in_graph"), ("coarse", "forced"), ("coarse", "no read-done event")]
                ),
            ),
        ),
        max_size=60,
    )
)
def test_counts_equal_the_hook_calls(calls):
    registry = CollectorRegistry()
    pm = new_plugin_manager(load_entry_points=False, environ={})
    pm.register(WarpolicyMetrics(registry))
    expected: collections.Counter = collections.Counter()
    for step, (what, runner, arg) in enumerate(calls, 1):
        if what == "publish":
            pm.hook.warpolicy_on_publish(runner=runner, step=step, policy=arg, event=None)
            expected[
                (
                    "warpolicy_read_done_publishes_total",
                    frozenset({"runner": runner, "policy": arg.label}.items()),
                )
            ] += 1
        else:
            pm.hook.warpolicy_on_barrier(runner=runner, step=step, kind=arg[0], reason=arg[1])
            expected[
                (
                    "warpolicy_barriers_total",
                    frozenset({"runner": runner, "kind": arg[0], "reason": arg[1]}.items()),
                )
            ] += 1
    got = {
        k: v
        for k, v in scrape(registry).items()
        if k[0] in ("warpolicy_read_done_publishes_total", "warpolicy_barriers_total")
    }
    assert got == dict(expected)


# -- the module as the entry-point plugin ----------------------------------------------------------


@pytest.fixture
def metrics_dist(tmp_path, monkeypatch):
    """A dist-info on sys.path declaring the entry point ``metrics = warpolicy_metrics``."""
    info = tmp_path / "warpolicy_metrics_sim-0.2.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: warpolicy-metrics-sim\nVersion: 0.2\n"
    )
    (info / "entry_points.txt").write_text("[warpolicy]\nmetrics = warpolicy_metrics\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    reset_plugin_manager()
    yield tmp_path
    reset_plugin_manager()


def test_entry_point_plugin_records_into_the_engines_registry(metrics_dist):
    pm = new_plugin_manager(environ={})
    assert pm.get_plugin("metrics") is warpolicy_metrics
    row = next(r for r in describe_plugins(pm) if r["name"] == "metrics")
    assert row["source"] == "distribution:warpolicy-metrics-sim"
    assert row["hooks"] == [
        "warpolicy_on_barrier",
        "warpolicy_on_decision",
        "warpolicy_on_fallback",
        "warpolicy_on_publish",
    ]
    engine_registry = CollectorRegistry()
    warpolicy_metrics.configure(registry=engine_registry, sample_every=0)
    rt = Runtime(pm, sim_platform(), pm.observers)
    runner = DecodeRunner(
        RecModel(), fixed_policy("in_graph"), rt.platform, name="decode", observers=rt.observers
    )
    runner.capture()
    loop = OverlapLoop(runner)
    for _ in range(5):
        loop.step([1.0], None)
    samples = scrape(engine_registry)
    assert (
        value(samples, "warpolicy_read_done_publishes_total", runner="decode", policy="in_graph")
        == 5
    )
    assert (
        value(
            scrape(prometheus_client.REGISTRY),
            "warpolicy_read_done_publishes_total",
            runner="decode",
            policy="in_graph",
        )
        is None
    )  # not on the default registry


def test_unconfigured_module_uses_the_default_registry_and_reset_removes_it():
    warpolicy_metrics.warpolicy_on_publish(
        runner="default-reg-test", step=1, policy=IN_GRAPH, event=None
    )
    samples = scrape(prometheus_client.REGISTRY)
    assert (
        value(
            samples,
            "warpolicy_read_done_publishes_total",
            runner="default-reg-test",
            policy="in_graph",
        )
        == 1
    )
    warpolicy_metrics.reset()
    assert (
        value(
            scrape(prometheus_client.REGISTRY),
            "warpolicy_read_done_publishes_total",
            runner="default-reg-test",
            policy="in_graph",
        )
        is None
    )


def test_configure_moves_the_metrics_to_another_registry():
    first, second = CollectorRegistry(), CollectorRegistry()
    warpolicy_metrics.configure(first, sample_every=0)
    warpolicy_metrics.warpolicy_on_barrier(runner="d", step=1, kind="event", reason="in_graph")
    warpolicy_metrics.configure(second, sample_every=0)
    warpolicy_metrics.warpolicy_on_barrier(runner="d", step=2, kind="event", reason="in_graph")
    assert generate_latest(first) == b""
    assert (
        value(
            scrape(second), "warpolicy_barriers_total", runner="d", kind="event", reason="in_graph"
        )
        == 1
    )


@pytest.mark.parametrize("raw, every", [("", 0), ("8", 8), ("0", 0), ("-3", 0), ("often", 0)])
def test_sample_every_from_the_environment(raw, every):
    assert warpolicy_metrics.sample_every_from({warpolicy_metrics.SAMPLE_ENV: raw}) == every


# -- release sampling ------------------------------------------------------------------------------


class StandInTiming:
    """A timing that needs no GPU: every sample is ready on the next poll and leads by 2 ms;
    ``fail`` makes ``begin`` raise."""

    def __init__(self, fail: bool = False) -> None:
        self.fail = fail
        self.begun: list = []

    def supports(self, event) -> bool:
        return True

    def begin(self, read_done_event) -> None:
        if self.fail:
            raise RuntimeError("timing broke")
        self.begun.append(read_done_event)

    def ready(self) -> bool:
        return True

    def lead_seconds(self) -> float:
        return 0.002


def test_release_sampling_every_n_steps_fills_the_histogram():
    timing = StandInTiming()
    registry = CollectorRegistry()
    plugin = WarpolicyMetrics(registry, sample_every=4, timing=lambda: timing)
    _, _, loop = run_loop("in_graph", 12, registry=registry, plugin=plugin)
    samples = scrape(registry)
    assert len(timing.begun) == 3  # steps 4, 8, 12
    # samples finish on the next sampled step: 4 and 8 are observed, 12 is still in flight
    assert value(samples, "warpolicy_release_lead_seconds_count", runner="decode") == 2
    assert value(samples, "warpolicy_release_lead_seconds_sum", runner="decode") == pytest.approx(
        0.004
    )
    assert (
        value(samples, "warpolicy_release_lead_seconds_bucket", runner="decode", le="0.0025") == 2
    )
    assert loop.last_barrier == "event"


def test_release_sampling_is_off_by_default():
    timing = StandInTiming()
    registry = CollectorRegistry()
    run_loop(
        "in_graph", 8, registry=registry, plugin=WarpolicyMetrics(registry, timing=lambda: timing)
    )
    assert timing.begun == []
    assert value(scrape(registry), "warpolicy_release_lead_seconds_count", runner="decode") is None


def test_release_sampling_degrades_to_off_without_gpu_timing(caplog):
    """The real default timing on the fake platform: its events have no elapsed_time."""
    registry = CollectorRegistry()
    plugin = WarpolicyMetrics(registry, sample_every=1)
    with caplog.at_level("WARNING", logger="warpolicy"):
        _, _, loop = run_loop("in_graph", 5, registry=registry, plugin=plugin)
    assert plugin.sample_every == 0
    assert len([r for r in caplog.records if "release sampling is off" in r.getMessage()]) == 1
    samples = scrape(registry)
    assert (
        value(samples, "warpolicy_read_done_publishes_total", runner="decode", policy="in_graph")
        == 5
    )
    assert loop.last_barrier == "event"


def test_a_failing_timing_turns_sampling_off_not_the_step_coarse(caplog):
    registry = CollectorRegistry()
    plugin = WarpolicyMetrics(registry, sample_every=1, timing=lambda: StandInTiming(fail=True))
    with caplog.at_level("WARNING", logger="warpolicy"):
        _, _, loop = run_loop("in_graph", 3, registry=registry, plugin=plugin)
    assert plugin.sample_every == 0 and loop.last_barrier == "event"
    assert any("timing broke" in r.getMessage() for r in caplog.records)


def test_cpu_benchmark_reports_both_observers_side_by_side(capsys):
    from warpolicy_metrics.bench import per_call_cost

    result = per_call_cost(calls=200, rounds=1)
    out = capsys.readouterr().out
    assert "no-op observer" in out and "metrics plugin" in out
    for what in ("publish", "barrier", "step"):
        assert result[f"{what}_noop"] > 0 and result[f"{what}_metrics"] > 0
    assert result["step_metrics"] == result["publish_metrics"] + result["barrier_metrics"]


# -- GPU: real CUDA event timing -------------------------------------------------------------------


@pytest.mark.cuda
def test_release_lead_on_a_gpu_in_graph_before_post_replay():
    """A graph: spin, plant, spin. In-graph releases about one spin before the end; post-replay
    at the end (0 lead)."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    from warpolicy.runtime.fence import ReadDoneFence, SchedulerBarrier
    from warpolicy.runtime.manager import open_runtime
    from warpolicy.runtime.release import BucketRelease

    rt = open_runtime("cuda", load_entry_points=False, environ={})
    platform = rt.platform
    if not platform.external_events_supported():
        pytest.skip("this torch has no external events")
    leads = {}
    for policy in (IN_GRAPH, POST_REPLAY):
        registry = CollectorRegistry()
        rt.pm.register(plugin := WarpolicyMetrics(registry, sample_every=1))
        try:
            fence = ReadDoneFence(platform, name=policy.label, observers=rt.observers)
            event = fence.prepare()
            graph = platform.new_graph()
            with platform.capture(graph):
                torch.cuda._sleep(1_000_000)
                planted = fence.plant(event)  # the event this graph records
                torch.cuda._sleep(1_000_000)  # ~0.5 ms after the node
            release = BucketRelease(
                policy.label, 1, policy, planted if policy is IN_GRAPH else None
            )
            barrier = SchedulerBarrier(platform, observers=rt.observers)
            sched = platform.new_stream()
            for _ in range(6):
                fence.before_replay(release)
                platform.replay(graph)
                fence.after_replay(release)
                barrier.apply(sched, platform.current_stream(), fence.take())
                platform.synchronize()  # the previous sample is ready at the next publish
        finally:
            rt.pm.unregister(plugin)
        samples = scrape(registry)
        count = value(samples, "warpolicy_release_lead_seconds_count", runner=policy.label)
        assert count == 5, samples
        leads[policy] = (
            value(samples, "warpolicy_release_lead_seconds_sum", runner=policy.label) / count
        )
    print(
        f"[metrics cuda] release lead in_graph {leads[IN_GRAPH] * 1e6:.1f} us, "
        f"post_replay {leads[POST_REPLAY] * 1e6:.1f} us"
    )
    assert leads[IN_GRAPH] > 0 and leads[IN_GRAPH] > leads[POST_REPLAY]
