"""The metrics plugin in prometheus_client's multi-process mode (how SGLang runs it).

Worker processes started with ``PROMETHEUS_MULTIPROC_DIR`` set (as an engine's launcher sets it,
before prometheus_client is imported) each run `metrics_scenario.drive` with the plugin in its
own identity, then exit, or flush and get killed (no at-exit flush); this process scrapes their
files through ``MultiProcessCollector`` and finds every series with every count. In-process
tests cover the flusher: exact deltas, its thread, fork, nothing registered on the registry."""

from __future__ import annotations

import os
import pathlib
import signal
import subprocess
import sys
import time
import warnings

import pytest

pytest.importorskip("prometheus_client")
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.parser import text_string_to_metric_families

HERE = pathlib.Path(__file__).resolve().parent

import warpolicy_metrics  # noqa: E402
from warpolicy.registry.vocabulary import IN_GRAPH  # noqa: E402
from warpolicy_metrics import WarpolicyMetrics  # noqa: E402

import metrics_scenario  # noqa: E402

WORKER_TIMEOUT = 300  # seconds: a hung worker fails the test instead of hanging the suite


def samples_of(text: str) -> dict[tuple[str, frozenset], float]:
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def start_worker(rank: int, mode: str, directory: pathlib.Path) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if k.lower() != "prometheus_multiproc_dir"}
    env["PROMETHEUS_MULTIPROC_DIR"] = str(directory)
    # the scenario's directory is the script's own; warpolicy and the plugin are installed (or
    # on the PYTHONPATH this process was given)
    env["PYTHONWARNINGS"] = "ignore"  # torch's NumPy warning on the CPU wheel
    return subprocess.Popen(
        [sys.executable, str(HERE / "metrics_scenario.py"), str(rank), mode],
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def with_identity(key: tuple[str, frozenset], rank: int) -> tuple[str, frozenset]:
    name, labels = key
    return name, labels | {("engine_id", "e0"), ("tp_rank", str(rank))}


@pytest.fixture
def multiproc_dir(tmp_path):
    directory = tmp_path / "prometheus"
    directory.mkdir()
    return directory


def test_every_series_survives_the_multiprocess_collector(multiproc_dir):
    """Rank 0 exits (its last counts reach the files at exit); rank 1 flushes and is killed
    with SIGKILL (what a flush wrote is all there is)."""
    workers = {rank: start_worker(rank, mode, multiproc_dir) for rank, mode in enumerate(
        ("exit", "kill"))}  # fmt: skip
    try:
        killed = workers[1]
        assert killed.stdout is not None
        line = killed.stdout.readline()
        assert line.strip() == "flushed", killed.communicate(timeout=WORKER_TIMEOUT)
        killed.send_signal(signal.SIGKILL)
        for rank, proc in workers.items():
            out, err = proc.communicate(timeout=WORKER_TIMEOUT)
            expected_rc = -signal.SIGKILL if rank == 1 else 0
            assert proc.returncode == expected_rc, f"worker {rank}: rc {proc.returncode}\n{err}"
    finally:
        for proc in workers.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()

    registry = CollectorRegistry()
    MultiProcessCollector(registry, path=str(multiproc_dir))
    got = samples_of(generate_latest(registry).decode())

    families = {name for name, _ in got}
    for family in warpolicy_metrics.FAMILIES:
        assert any(name == family or name.startswith(family + "_") for name in families), family
    wrong = {
        (rank, key): (value, got.get(with_identity(key, rank)))
        for rank in workers
        for key, value in metrics_scenario.EXPECTED.items()
        if got.get(with_identity(key, rank)) != pytest.approx(value)
    }
    assert wrong == {}
    # the write-event record that raised is counted for every rank, under fixed labels
    record = ("warpolicy_fallbacks_total", frozenset({("component", "overlap_loop"),
              ("place", "record"), ("runner", "decode")}))  # fmt: skip
    assert [got[with_identity(record, rank)] for rank in workers] == [metrics_scenario.FAULTY] * 2


# -- in-process: the flusher ----------------------------------------------------------------------


def counter_values(counter) -> dict[frozenset, float]:
    return {
        frozenset(s.labels.items()): s.value
        for family in counter.collect()
        for s in family.samples
        if s.name.endswith("_total")
    }


def publish(metrics: WarpolicyMetrics, times: int, runner: str = "decode") -> None:
    for step in range(times):
        metrics.warpolicy_on_publish(runner=runner, step=step, policy=IN_GRAPH, event=None)


DECODE = frozenset({("runner", "decode"), ("policy", "in_graph")})


def test_multiprocess_mode_registers_nothing_on_the_registry():
    registry = CollectorRegistry()
    metrics = WarpolicyMetrics(registry, multiprocess=True, flush_interval=3600)
    try:
        publish(metrics, 3)
        metrics.warpolicy_on_fallback(where="overlap loop:record", error=RuntimeError("x"))
        assert generate_latest(registry) == b""  # the engine's MultiProcessCollector reads files
    finally:
        metrics.unregister()


def test_a_flush_adds_exactly_what_was_counted_since_the_last_one():
    metrics = WarpolicyMetrics(CollectorRegistry(), multiprocess=True, flush_interval=3600)
    try:
        publish(metrics, 3)
        metrics.warpolicy_on_barrier(runner="decode", step=1, kind="event", reason="in_graph")
        assert counter_values(metrics.publishes_counter) == {}  # nothing before the flush
        metrics.flush()
        metrics.flush()  # nothing new: adds nothing
        assert counter_values(metrics.publishes_counter) == {DECODE: 3}
        publish(metrics, 2)
        metrics.flush()
        assert counter_values(metrics.publishes_counter) == {DECODE: 5}
        barriers = counter_values(metrics.barriers_counter)
        assert barriers == {
            frozenset({("runner", "decode"), ("kind", "event"), ("reason", "in_graph")}): 1
        }
    finally:
        metrics.unregister()


def test_the_flusher_thread_flushes_and_stops_with_the_metrics():
    metrics = WarpolicyMetrics(CollectorRegistry(), multiprocess=True, flush_interval=0.01)
    flusher = metrics.flusher
    assert flusher is not None and flusher.alive
    publish(metrics, 4)
    deadline = time.monotonic() + 60  # a bound, not a timing claim
    while counter_values(metrics.publishes_counter) != {DECODE: 4}:
        assert time.monotonic() < deadline, "the flusher never flushed"
        time.sleep(0.01)
    metrics.unregister()
    assert not flusher.alive and metrics.flusher is None


def test_unregister_flushes_what_is_left():
    metrics = WarpolicyMetrics(CollectorRegistry(), multiprocess=True, flush_interval=3600)
    publish(metrics, 2)
    metrics.unregister()
    assert counter_values(metrics.publishes_counter) == {DECODE: 2}


def test_a_failing_flush_is_logged_once_and_retried(caplog, monkeypatch):
    metrics = WarpolicyMetrics(CollectorRegistry(), multiprocess=True, flush_interval=3600)
    try:
        publish(metrics, 2)
        calls = []

        def broken(*labels):
            calls.append(labels)
            raise OSError("disk full")

        real = metrics.publishes_counter.labels
        monkeypatch.setattr(metrics.publishes_counter, "labels", broken)
        with caplog.at_level("WARNING", logger="warpolicy"):
            metrics.flush()
            metrics.flush()
        assert len(calls) == 2  # retried
        assert len([r for r in caplog.records if "disk full" in r.getMessage()]) == 1
        monkeypatch.setattr(metrics.publishes_counter, "labels", real)
        metrics.flush()
        assert counter_values(metrics.publishes_counter) == {DECODE: 2}  # nothing lost
    finally:
        metrics.unregister()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_forked_child_counts_only_its_own_steps():
    """The parent counted 3 steps it has not flushed yet; the child counts 2 and flushes: the
    child adds 2 (the parent flushes its own 3), and the child has a flusher of its own."""
    metrics = WarpolicyMetrics(CollectorRegistry(), multiprocess=True, flush_interval=3600)
    try:
        publish(metrics, 3)
        read, write = os.pipe()
        with warnings.catch_warnings():  # Python 3.12+ warns about fork with threads running
            warnings.simplefilter("ignore", DeprecationWarning)
            pid = os.fork()
        if pid == 0:  # the child: report and leave without running the parent's exit handlers
            code = 1
            try:
                publish(metrics, 2)
                metrics.flush()
                value = counter_values(metrics.publishes_counter).get(DECODE, 0)
                alive = metrics.flusher is not None and metrics.flusher.alive
                os.write(write, f"{value:g} {alive}".encode())
                code = 0
            finally:
                os._exit(code)
        os.close(write)
        with os.fdopen(read) as pipe:
            reply = pipe.read()
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        assert reply == "2 True"
        metrics.flush()
        assert counter_values(metrics.publishes_counter) == {DECODE: 3}  # the parent's own
    finally:
        metrics.unregister()
