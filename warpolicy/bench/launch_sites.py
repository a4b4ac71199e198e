"""What naming late readers by file:line costs per captured graph (the budget: 10 ms).

``python -m warpolicy.bench.launch_sites [--device cuda|cpu] [--repeat 10] [--layers 24]``
captures the same graph (a zoo model's in-graph prep and a forward of ``layers`` layers, bucket
8) with and without a `LaunchRecorder`, in one process, alternating, and prints the median
milliseconds per capture of each, their difference (the recorder's cost per graph) against the
budget, and how many nodes got a site. On CUDA the node counts come from the driver
(`node_counter`); on the CPU there is no graph, so a counter that adds one node per torch call
stands in and the figure is the hooks' Python cost alone.
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import sys
import time
from typing import Any, Callable, Optional, Sequence

from warpolicy.audit.zoo.hybrid import WrapperOneChild
from warpolicy.runtime.graphwalk.launch_sites import LaunchRecorder, node_counter

BUDGET_MS = 10.0
BUCKET = 8


def _body(model: Any) -> Callable[[], Any]:
    def body() -> Any:
        model.graph_prep(BUCKET)
        return model.forward(BUCKET)

    return body


def _capture_cuda(body: Callable[[], Any], recorder: Optional[LaunchRecorder]) -> float:
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


def _capture_cpu(body: Callable[[], Any], recorder: Optional[LaunchRecorder]) -> float:
    start = time.perf_counter()
    if recorder is None:
        body()
    else:
        with recorder:
            body()
    return (time.perf_counter() - start) * 1000


def measure(device: str, repeat: int, layers: int) -> dict[str, float]:
    import torch  # noqa: PLC0415 - deferred: importing the benchmarks does not need torch

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


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m warpolicy.bench.launch_sites", description=__doc__)
    p.add_argument("--device", choices=("cuda", "cpu"), default="cpu")
    p.add_argument("--repeat", type=int, default=10)
    p.add_argument("--layers", type=int, default=24)
    args = p.parse_args(argv)
    got = measure(args.device, args.repeat, args.layers)
    cost = got["recorded_ms"] - got["plain_ms"]
    print(
        f"launch sites on {args.device} ({args.layers} layers, bucket {BUCKET}, median of "
        f"{args.repeat}): capture {got['plain_ms']:.2f} ms, with the recorder "
        f"{got['recorded_ms']:.2f} ms (ratio {got['recorded_ms'] / got['plain_ms']:.2f}); "
        f"recorder cost {cost:.2f} ms per graph (budget {BUDGET_MS:g} ms), "
        f"{int(got['sites'])} nodes named"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
