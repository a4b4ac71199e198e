"""The warpolicy-metrics plugin in one process: real exposition text scraped after runs on the
simulated platform (fault injection included), identity labels, the resolved policy as one series
per state, the entry-point path and the CPU micro-benchmark. Multi-process mode:
``test_metrics_multiprocess.py``; label vocabularies: ``test_metrics_vocabulary.py``."""

from __future__ import annotations

import collections
import pathlib
import sys
import warnings

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

prometheus_client = pytest.importorskip("prometheus_client")
from prometheus_client import CollectorRegistry, generate_latest  # noqa: E402
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

PLUGIN_ROOT = pathlib.Path(__file__).resolve().parents[2] / "plugins" / "warpolicy-metrics"
if str(PLUGIN_ROOT) not in sys.path:  # the plugin's source tree, as an editable install puts it
    sys.path.insert(0, str(PLUGIN_ROOT))

import metrics_scenario  # noqa: E402

import warpolicy_metrics  # noqa: E402
from warpolicy.registry.vocabulary import IN_GRAPH, NONE, POST_REPLAY, ForwardMode  # noqa: E402
from warpolicy.runtime.hookspecs import hookimpl  # noqa: E402
from warpolicy.runtime.manager import (  # noqa: E402
    Runtime,
    describe_plugins,
    new_plugin_manager,
    reset_plugin_manager,
)
from warpolicy.runtime.observers import Reporter  # noqa: E402
from warpolicy.runtime.policy import fixed_policy  # noqa: E402
from warpolicy.runtime.runners import DecodeRunner, OverlapLoop  # noqa: E402
from warpolicy.testing import RecModel, sim_impl, sim_platform, sim_runtime  # noqa: E402
from warpolicy_metrics import WarpolicyMetrics  # noqa: E402

Samples = dict[tuple[str, frozenset], float]


def scrape(registry: CollectorRegistry) -> Samples:
    """Parse the registry's exposition text: (sample name, labels) -> value."""
    text = generate_latest(registry).decode()
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float | None:
    return samples.get((name, frozenset(labels.items())))


def nonzero(samples: Samples, name: str) -> dict[frozenset, float]:
    return {labels: v for (n, labels), v in samples.items() if n == name and v}


def run_loop(policy: str, steps: int, *, registry=None, plugin=None, rt=None, **loop_kw):
    """Capture a DecodeRunner with ``policy`` and run ``steps`` overlap steps; returns the
    registry, the runtime and the loop."""
    registry = registry if registry is not None else CollectorRegistry()
    rt = rt if rt is not None else sim_runtime()
    rt.pm.register(plugin if plugin is not None else WarpolicyMetrics(registry))
    runner = DecodeRunner(
        RecModel(), fixed_policy(policy), rt.platform, name="decode", observers=rt.observers
    )
    runner.capture()
    loop = OverlapLoop(runner, **loop_kw)
    for _ in range(steps):
        loop.step([1.0, 2.0], lambda: None)
    return registry, rt, loop


@pytest.fixture(autouse=True)
def _forget_module_metrics():
    yield
    warpolicy_metrics.reset()


# -- every series, after a whole scenario ----------------------------------------------------------


def test_the_scenario_shows_every_family_with_every_count():
    registry = CollectorRegistry()
    rt = sim_runtime()
    rt.pm.register(WarpolicyMetrics(registry))
    metrics_scenario.drive(rt)
    got = scrape(registry)
    for family in warpolicy_metrics.FAMILIES:
        assert any(name.startswith(family) for name, _ in got), family
    wrong = {
        key: (v, got.get(key))
        for key, v in metrics_scenario.EXPECTED.items()
        if got.get(key) != pytest.approx(v)
    }
    assert wrong == {}


# -- counters and the resolved policy after a run -------------------------------------------------


def test_in_graph_run_counts_publishes_barriers_and_the_resolved_policy():
    registry, _, loop = run_loop("in_graph", 7)
    samples = scrape(registry)
    assert nonzero(samples, "warpolicy_read_done_publishes_total") == {
        frozenset({("runner", "decode"), ("policy", "in_graph")}): 7
    }
    assert nonzero(samples, "warpolicy_barriers_total") == {
        frozenset({("runner", "decode"), ("kind", "event"), ("reason", "in_graph")}): 7
    }
    resolved = {
        policy: value(
            samples,
            "warpolicy_resolved_policy",
            runner="decode",
            mode="decode",
            graph="captured",
            policy=policy,
        )
        for policy in ("pre_replay", "in_graph", "post_replay", "none")
    }
    assert resolved == {"pre_replay": 0, "in_graph": 1, "post_replay": 0, "none": 0}
    assert loop.last_barrier == "event"


def test_a_coarse_barrier_with_nothing_taken_counts_for_the_runner_that_published_nothing():
    registry, _, _ = run_loop("none", 3)
    samples = scrape(registry)
    assert nonzero(samples, "warpolicy_read_done_publishes_total") == {
        frozenset({("runner", "decode"), ("policy", "none")}): 3
    }
    # the barrier calls itself "scheduler" (nothing was taken); the series names the runner
    assert nonzero(samples, "warpolicy_barriers_total") == {
        frozenset({("runner", "decode"), ("kind", "coarse"), ("reason", "no_event")}): 3
    }
    assert (
        value(
            samples,
            "warpolicy_resolved_policy",
            runner="decode",
            mode="decode",
            graph="captured",
            policy="none",
        )
        == 1
    )


def test_each_runner_gets_its_own_coarse_barriers():
    registry = CollectorRegistry()
    rt = sim_runtime()
    rt.pm.register(WarpolicyMetrics(registry))
    runners = {
        name: DecodeRunner(
            RecModel(), fixed_policy(policy), rt.platform, name=name, observers=rt.observers
        )
        for name, policy in (("prefill", "none"), ("decode", "in_graph"))
    }
    loop = OverlapLoop(platform=rt.platform, observers=rt.observers)
    for runner in runners.values():
        runner.capture()
    for name in ("prefill", "decode", "prefill", "prefill"):
        loop.step([1.0], None, runner=runners[name])
    assert nonzero(scrape(registry), "warpolicy_barriers_total") == {
        frozenset({("runner", "prefill"), ("kind", "coarse"), ("reason", "no_event")}): 3,
        frozenset({("runner", "decode"), ("kind", "event"), ("reason", "in_graph")}): 1,
    }


def test_forced_coarse_is_its_own_reason():
    registry, _, _ = run_loop("in_graph", 4, force_coarse=True)
    assert nonzero(scrape(registry), "warpolicy_barriers_total") == {
        frozenset({("runner", "decode"), ("kind", "coarse"), ("reason", "forced")}): 4
    }


def test_eager_steps_resolve_their_own_state():
    registry, _, loop = run_loop("in_graph", 1)
    loop.step([1.0] * 9, None)  # larger than every bucket: eager, demoted to post_replay
    samples = scrape(registry)
    states = {
        (graph, policy)
        for (name, labels), v in samples.items()
        if name == "warpolicy_resolved_policy" and v == 1
        for graph, policy in [(dict(labels)["graph"], dict(labels)["policy"])]
    }
    assert states == {("captured", "in_graph"), ("eager", "post_replay")}
    assert (
        nonzero(samples, "warpolicy_read_done_publishes_total")[
            frozenset({("runner", "decode"), ("policy", "post_replay")})
        ]
        == 1
    )


def test_the_most_conservative_bucket_is_the_resolved_state_and_only_one_state_is_1():
    registry = CollectorRegistry()
    rt = sim_runtime()
    rt.pm.register(WarpolicyMetrics(registry))
    model = RecModel(buckets=(1, 2))
    runner = DecodeRunner(
        model, fixed_policy("in_graph"), rt.platform, name="decode", observers=rt.observers
    )
    # bucket 2 (captured first) fails to instantiate: it publishes nothing; bucket 1 in the graph
    sim_impl(rt.platform).graph_model = lambda g: metrics_scenario.late_reader_graph(model, g)
    sim_impl(rt.platform).inject("instantiate", when=lambda: not runner.capture_report)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        runner.capture()
    captured = {
        labels: v
        for (name, labels), v in scrape(registry).items()
        if name == "warpolicy_resolved_policy" and ("graph", "captured") in labels
    }
    assert [dict(labels)["policy"] for labels, v in captured.items() if v == 1] == ["none"]
    assert sorted(captured.values()) == [0, 0, 0, 1]


# -- fallbacks and demotions (fault injection) ----------------------------------------------------


def test_a_failing_write_event_record_increments_the_fallback_counter():
    """The overlap loop's record after write_next raises (injected on the simulated platform):
    the next forward waits for the whole schedule stream, and the fallback is counted every
    time, under fixed labels."""
    registry, rt, loop = run_loop("in_graph", 1)
    armed: list[bool] = []
    fault = sim_impl(rt.platform).inject("record", when=lambda: armed.pop() if armed else False)
    with pytest.warns(RuntimeWarning, match="recording the writes failed"):
        for _ in range(3):
            loop.step([1.0], lambda: armed.append(True))
    assert fault.fired == 3
    samples = scrape(registry)
    assert nonzero(samples, "warpolicy_fallbacks_total") == {
        frozenset({("runner", ""), ("component", "overlap_loop"), ("place", "record")}): 3
    }
    assert loop.last_barrier == "event"  # the barrier itself was not affected


def test_failing_waits_count_fallbacks_and_a_coarse_barrier_for_the_runner():
    registry, rt, loop = run_loop("in_graph", 1)
    sim_impl(rt.platform).inject("wait_event", when=lambda: loop.steps == 1)
    with pytest.warns(RuntimeWarning):
        loop.step([1.0], None)
    samples = scrape(registry)
    # the step's two waits failed: the forward's wait for the last writes, and the barrier's
    assert nonzero(samples, "warpolicy_fallbacks_total") == {
        frozenset({("runner", ""), ("component", "overlap_loop"), ("place", "wait")}): 1,
        frozenset({("runner", "decode"), ("component", "barrier"), ("place", "wait_event")}): 1,
    }
    assert (
        nonzero(samples, "warpolicy_barriers_total")[
            frozenset({("runner", "decode"), ("kind", "coarse"), ("reason", "wait_failed")})
        ]
        == 1
    )


def test_every_fallback_series_of_a_runner_starts_at_zero():
    """So ``increase(warpolicy_fallbacks_total[10m]) > 0`` sees the first fallback too."""
    registry, _, _ = run_loop("in_graph", 1)
    zeros = {
        (dict(labels)["runner"], dict(labels)["component"], dict(labels)["place"])
        for (name, labels), v in scrape(registry).items()
        if name == "warpolicy_fallbacks_total" and v == 0
    }
    assert ("", "overlap_loop", "record") in zeros
    assert ("decode", "fence", "after_replay") in zeros
    assert ("decode", "barrier", "wait_event") in zeros
    assert all(runner in ("", "decode") for runner, _, _ in zeros)


class RaisingObserver:
    @hookimpl
    def warpolicy_on_publish(self, runner, step, policy, event):
        raise RuntimeError("observer broke")


def test_an_observer_that_raises_is_a_fallback_at_place_observer():
    """Another observer raising in on_publish is reported as a fallback and changes nothing
    else: metrics count the fallback and the publish, and the step keeps its event."""
    rt = sim_runtime()
    rt.pm.register(RaisingObserver(), name="broken")
    with pytest.warns(RuntimeWarning, match="'broken' raised in warpolicy_on_publish"):
        registry, _, loop = run_loop("in_graph", 2, rt=rt)
    samples = scrape(registry)
    assert nonzero(samples, "warpolicy_fallbacks_total") == {
        frozenset({("runner", "decode"), ("component", "fence"), ("place", "observer")}): 2
    }
    assert nonzero(samples, "warpolicy_read_done_publishes_total") == {
        frozenset({("runner", "decode"), ("policy", "in_graph")}): 2
    }
    assert loop.last_barrier == "event"


def test_demotions_are_counted_per_bucket_with_a_fixed_reason():
    registry = CollectorRegistry()
    rt = sim_runtime()
    rt.pm.register(WarpolicyMetrics(registry))
    model = RecModel(buckets=(1, 2))
    sim_impl(rt.platform).graph_model = lambda g: metrics_scenario.late_reader_graph(model, g)
    runner = DecodeRunner(
        model, fixed_policy("in_graph"), rt.platform, name="draft", observers=rt.observers
    )
    with pytest.warns(RuntimeWarning, match="shared reader"):
        runner.capture()
        runner.capture()  # every capture's demotions count
    assert nonzero(scrape(registry), "warpolicy_demotions_total") == {
        frozenset({("runner", "draft"), ("bucket", "1"), ("reason", "late_reader")}): 2,
        frozenset({("runner", "draft"), ("bucket", "2"), ("reason", "late_reader")}): 2,
    }


# -- canary: violations and the release lead -------------------------------------------------------


def test_violations_are_counted_per_cell_without_the_detail():
    registry = CollectorRegistry()
    rt = sim_runtime()
    rt.pm.register(WarpolicyMetrics(registry))
    canary = Reporter(rt.observers, "canary")
    canary.violation("decode", "fa3", ForwardMode.DECODE, "eagle", 8, 11, "out[3]: 1.0 != 2.0")
    canary.violation("decode", "", ForwardMode.DECODE, "", None, 12, "x")
    assert nonzero(scrape(registry), "warpolicy_violations_total") == {
        frozenset({("runner", "decode"), ("backend", "fa3"), ("mode", "decode"),
                   ("spec", "eagle"), ("bucket", "8")}): 1,
        frozenset({("runner", "decode"), ("backend", ""), ("mode", "decode"), ("spec", ""),
                   ("bucket", "eager")}): 1,
    }  # fmt: skip


def test_the_release_lead_is_a_histogram_per_cell_in_seconds():
    registry = CollectorRegistry()
    rt = sim_runtime()
    rt.pm.register(WarpolicyMetrics(registry))
    canary = Reporter(rt.observers, "canary")
    for lead_us in (3.0, 40.0, 40.0, 2000.0, -5.0):  # a negative lead is 0
        canary.release_lead("decode", ForwardMode.DECODE, 4, 1, lead_us)
    canary.release_lead("decode", ForwardMode.EXTEND, None, 2, 7.0)
    samples = scrape(registry)
    cell = {"runner": "decode", "mode": "decode", "bucket": "4"}
    assert value(samples, "warpolicy_release_lead_seconds_count", **cell) == 5
    assert value(samples, "warpolicy_release_lead_seconds_sum", **cell) == pytest.approx(2083e-6)
    assert value(samples, "warpolicy_release_lead_seconds_bucket", **cell, le="1e-06") == 1
    assert value(samples, "warpolicy_release_lead_seconds_bucket", **cell, le="5e-05") == 4
    assert value(samples, "warpolicy_release_lead_seconds_bucket", **cell, le="0.001") == 4
    eager = {"runner": "decode", "mode": "extend", "bucket": "eager"}
    assert value(samples, "warpolicy_release_lead_seconds_count", **eager) == 1


# -- identity and label values ---------------------------------------------------------------------


def test_identity_labels_are_on_every_series():
    registry = CollectorRegistry()
    rt = sim_runtime()
    identity = {"model_name": "meta-llama/Llama-3.1-8B", "tp_rank": 1, "pp_rank": 0,
                "engine_id": "e0"}  # fmt: skip
    rt.pm.register(WarpolicyMetrics(registry, identity=identity))
    metrics_scenario.drive(rt)
    samples = scrape(registry)
    want = {(k, str(v)) for k, v in identity.items()}
    assert samples
    assert {name for name, labels in samples if not want <= labels} == set()


def test_configure_refuses_a_bad_identity_and_keeps_the_metrics_it_had():
    registry = CollectorRegistry()
    first = warpolicy_metrics.configure(registry, identity={"tp_rank": 0})
    with pytest.raises(ValueError, match="tp_rank='a b'"):
        warpolicy_metrics.configure(registry, identity={"tp_rank": "a b"})
    assert warpolicy_metrics.metrics() is first
    warpolicy_metrics.warpolicy_on_publish(runner="d", step=1, policy=IN_GRAPH, event=None)
    assert value(scrape(registry), "warpolicy_read_done_publishes_total", runner="d",
                 policy="in_graph", tp_rank="0") == 1  # fmt: skip


def test_names_become_identifier_like_label_values():
    registry = CollectorRegistry()
    plugin = WarpolicyMetrics(registry)
    plugin.warpolicy_on_publish(runner='draft "extend"\n#2', step=1, policy=IN_GRAPH, event=None)
    plugin.warpolicy_on_fallback(where="fence 'my runner':after_replay", error=RuntimeError())
    samples = scrape(registry)
    assert nonzero(samples, "warpolicy_read_done_publishes_total") == {
        frozenset({("runner", "draft__extend___2"), ("policy", "in_graph")}): 1
    }
    assert nonzero(samples, "warpolicy_fallbacks_total") == {
        frozenset({("runner", "my_runner"), ("component", "fence"), ("place", "after_replay")}): 1
    }


def test_two_names_that_map_to_one_label_value_are_one_series():
    registry = CollectorRegistry()
    plugin = WarpolicyMetrics(registry)
    for runner in ("a b", "a/b", "a_b", "a b"):  # "a b" and "a_b" are both "a_b"
        plugin.warpolicy_on_publish(runner=runner, step=1, policy=IN_GRAPH, event=None)
    assert nonzero(scrape(registry), "warpolicy_read_done_publishes_total") == {
        frozenset({("runner", "a_b"), ("policy", "in_graph")}): 3,
        frozenset({("runner", "a/b"), ("policy", "in_graph")}): 1,
    }


def test_a_publish_that_is_not_a_policy_is_counted_as_other():
    registry = CollectorRegistry()
    plugin = WarpolicyMetrics(registry)
    for policy in ("in_graph", 7, None, IN_GRAPH):
        plugin.warpolicy_on_publish(runner="d", step=1, policy=policy, event=None)
    assert nonzero(scrape(registry), "warpolicy_read_done_publishes_total") == {
        frozenset({("runner", "d"), ("policy", "other")}): 3,
        frozenset({("runner", "d"), ("policy", "in_graph")}): 1,
    }


def test_metrics_never_make_a_step_coarse():
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
                st.sampled_from(["decode", "verify"]),
                st.sampled_from(
                    [
                        ("event", "in_graph", "in_graph"),
                        ("coarse", "forced", "forced"),
                        ("coarse", "hook failed", "wait_failed"),
                    ]
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
            labels = {"runner": runner, "policy": arg.label}
            expected[("warpolicy_read_done_publishes_total", frozenset(labels.items()))] += 1
        else:
            kind, reason, label = arg
            pm.hook.warpolicy_on_barrier(runner=runner, step=step, kind=kind, reason=reason)
            labels = {"runner": runner, "kind": kind, "reason": label}
            expected[("warpolicy_barriers_total", frozenset(labels.items()))] += 1
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
    info = tmp_path / "warpolicy_metrics_sim-0.3.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: warpolicy-metrics-sim\nVersion: 0.3\n"
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
        "warpolicy_on_demotion",
        "warpolicy_on_fallback",
        "warpolicy_on_publish",
        "warpolicy_on_release_lead",
        "warpolicy_on_violation",
    ]
    engine_registry = CollectorRegistry()
    warpolicy_metrics.configure(registry=engine_registry, identity={"engine_id": "e7"})
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
        value(
            samples,
            "warpolicy_read_done_publishes_total",
            runner="decode",
            policy="in_graph",
            engine_id="e7",
        )
        == 5
    )
    assert not any(
        name.startswith("warpolicy_") for name, _ in scrape(prometheus_client.REGISTRY)
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
    assert not any(name.startswith("warpolicy_") for name, _ in scrape(prometheus_client.REGISTRY))


def test_configure_moves_the_metrics_to_another_registry():
    first, second = CollectorRegistry(), CollectorRegistry()
    warpolicy_metrics.configure(first)
    warpolicy_metrics.warpolicy_on_barrier(runner="d", step=1, kind="event", reason="in_graph")
    warpolicy_metrics.configure(second)
    warpolicy_metrics.warpolicy_on_barrier(runner="d", step=2, kind="event", reason="in_graph")
    assert generate_latest(first) == b""
    assert (
        value(
            scrape(second), "warpolicy_barriers_total", runner="d", kind="event", reason="in_graph"
        )
        == 1
    )


def test_the_removed_sampling_switch_is_named_once(monkeypatch, caplog):
    monkeypatch.setenv(warpolicy_metrics.REMOVED_SAMPLE_ENV, "8")
    with caplog.at_level("WARNING", logger="warpolicy"):
        warpolicy_metrics.configure(CollectorRegistry())
    assert [r.getMessage() for r in caplog.records if "no longer read" in r.getMessage()]


def test_cpu_benchmark_reports_both_observers_side_by_side(capsys):
    from warpolicy_metrics.bench import per_call_cost

    result = per_call_cost(calls=200, rounds=1)
    out = capsys.readouterr().out
    assert "no-op observer" in out and "metrics plugin" in out and "multi-process" in out
    for what in ("publish", "barrier", "step"):
        assert result[f"{what}_noop"] > 0 and result[f"{what}_metrics"] > 0
    assert result["step_metrics"] == result["publish_metrics"] + result["barrier_metrics"]
    assert result["flush_us"] > 0


# -- documentation ---------------------------------------------------------------------------------


def test_every_family_and_label_value_is_documented():
    from warpolicy_metrics import vocabulary

    readme = (PLUGIN_ROOT / "README.md").read_text(encoding="utf-8")
    top = (PLUGIN_ROOT.parents[1] / "README.md").read_text(encoding="utf-8")
    for family in warpolicy_metrics.FAMILIES:
        assert f"`{family}`" in readme and f"`{family}`" in top, family
    values = (
        set(vocabulary.BARRIER_REASONS.values())
        | set(vocabulary.DEMOTIONS)
        | set(vocabulary.COMPONENTS)
        | vocabulary.PLACES
    ) - {vocabulary.OTHER}
    assert {v for v in values if f"`{v}`" not in readme} == set()
