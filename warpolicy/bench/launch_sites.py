"""What naming late readers by file:line costs per captured graph (the budget: 10 ms).

``warpolicy bench launch-sites [--device cuda|sim] [--repeat 10] [--layers 24]`` captures the
same graph (a zoo model's in-graph prep and a forward of ``layers`` layers, bucket 8) with and
without a `LaunchRecorder`, in one process, alternating, and prints the median milliseconds per
capture of each, their difference (the recorder's cost per graph) against the budget, and how
many nodes got a site. On CUDA the node counts come from the driver (`node_counter`); on the CPU
there is no graph, so a counter that adds one node per torch call stands in and the figure is
the hooks' Python cost alone.
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import time
from collections.abc import Callable
from typing import Any

from warpolicy.bench.command import Benchmark, Report, device_option, option
from warpolicy.registry.inputs import positive_int_argument
from warpolicy.runtime.graphwalk.launch_sites import LaunchRecorder, node_counter

BUDGET_MS = 10.0
BUCKET = 8


def _body(model: Any) -> Callable[[], Any]:
    def body() -> Any:
        model.graph_prep(BUCKET)
        return model.forward(BUCKET)

    return body


def _capture_cuda(body: Callable[[], Any], recorder: LaunchRecorder | None) -> float:
    import torch  # noqa: PLC0415 - deferred: importing the benchmarks does not need torch

    graph = torch.cuda.CUDAGraph()
    torch.cuda.synchronize()
    start = time.perf_counter()
    with torch.cuda.graph(graph):
        if recorder is None:
            body()
        else:
            with recorder:
                body()
    elapsed = time.perf_counter() - start
    torch.cuda.synchronize()
    return elapsed * 1000


def _capture_cpu(body: Callable[[], Any], recorder: LaunchRecorder | None) -> float:
    start = time.perf_counter()
    if recorder is None:
        body()
    else:
        with recorder:
            body()
    return (time.perf_counter() - start) * 1000


def measure(device: str, repeat: int, layers: int) -> dict[str, float]:
    import torch  # noqa: PLC0415 - deferred: importing the benchmarks does not need torch

    from warpolicy.audit.zoo.hybrid import WrapperOneChild  # noqa: PLC0415 - deferred: imports torch

    cuda = device == "cuda"
    model = WrapperOneChild(torch.device("cuda" if cuda else "cpu"), False)
    model.layers = layers
    model.weights = (model.weights * (layers // len(model.weights) + 1))[:layers]
    model.prepare_bucket(BUCKET)
    body = _body(model)
    body()  # warm (cuBLAS, the allocator)
    capture = _capture_cuda if cuda else _capture_cpu
    if cuda:
        torch.cuda.synchronize()
        count = node_counter()
    else:
        ticks = itertools.count()
        count = lambda: next(ticks)  # noqa: E731 - one node per torch call
    plain, recorded, sites = [], [], 0
    for _ in range(repeat):
        plain.append(capture(body, None))
        recorder = LaunchRecorder(count)
        recorded.append(capture(body, recorder))
        sites = len(recorder.sites)
    return {
        "plain_ms": statistics.median(plain),
        "recorded_ms": statistics.median(recorded),
        "sites": float(sites),
    }


def measure_report(args: argparse.Namespace) -> Report:
    device = "cuda" if (args.device or "cuda") == "cuda" else "cpu"
    got = measure(device, args.repeat, args.layers)
    result = {
        "device": device,
        "layers": args.layers,
        "repeat": args.repeat,
        "capture_ms": round(got["plain_ms"], 3),
        "recorded_ms": round(got["recorded_ms"], 3),
        "recorder_ms": round(got["recorded_ms"] - got["plain_ms"], 3),
        "budget_ms": BUDGET_MS,
        "nodes_named": int(got["sites"]),
    }
    return Report(result, format_launch_sites)


def format_launch_sites(r: dict) -> str:
    return (
        f"launch sites on {r['device']} ({r['layers']} layers, bucket {BUCKET}, median of "
        f"{r['repeat']}): capture {r['capture_ms']:.2f} ms, with the recorder "
        f"{r['recorded_ms']:.2f} ms (ratio {r['recorded_ms'] / max(r['capture_ms'], 1e-9):.2f}); "
        f"recorder cost {r['recorder_ms']:.2f} ms per graph (budget {r['budget_ms']:g} ms), "
        f"{r['nodes_named']} nodes named"
    )


BENCHMARK = Benchmark(
    "launch-sites",
    "naming late readers by file:line: the recorder's cost per captured graph (budget 10 ms)",
    (
        device_option("cuda (default) or sim: the hooks' Python cost alone, no graph"),
        option("--repeat", default=10, type=positive_int_argument),
        option("--layers", default=24, type=positive_int_argument),
    ),
    measure_report,
)
