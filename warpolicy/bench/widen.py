"""What the race widener costs per step: nothing when off, its spin when on.

``warpolicy bench widen [--device sim|cuda] [--steps 300] [--repeat 5] [--us 50]`` builds decode
runners on the same zoo model in one process: the baseline is a runner whose model is given to
it already resolved off (``widen_race_us=0``: the step path is exactly the 0.3 one), then a
runner resolving the widener from an unset environment (what every runner does by default), and
(CUDA only) one with the widener on. It runs their steps interleaved, ``repeat`` rounds of
``steps`` each, and prints the median microseconds per step and each one's ratio to the
baseline. Off, the runner keeps the model itself (``runner.model is model``), so the ratio is
the noise of two identical runners.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

from warpolicy.audit.api import platform_for
from warpolicy.bench.command import Benchmark, Report, device_option, option
from warpolicy.registry.inputs import positive_int_argument
from warpolicy.registry.vocabulary import POST_REPLAY, ForwardMode


def _runner(platform: Any, widen_race_us: float | None) -> tuple[Any, Any]:
    """A captured decode runner on a fresh zoo model and its batch (a post_replay fixed
    declaration: every step publishes); ``widen_race_us`` None: from the environment."""
    import attrs  # noqa: PLC0415 - deferred: only the benchmark needs it here

    from warpolicy.audit.zoo.fixture import (  # noqa: PLC0415 - deferred: imports torch
        Declares,
        make_subject,
        zoo_fixture,
    )

    fixture = attrs.evolve(
        zoo_fixture("wrapper_one_child"),
        declares=Declares(ForwardMode.DECODE, POST_REPLAY, POST_REPLAY),
    )
    built = make_subject(fixture, False, platform)
    runner = fixture.runner(
        built.model, built.policy, platform, "bench", self_check="off", widen_race_us=widen_race_us
    )
    runner.capture()
    return runner, built.model.make_batch(ForwardMode.DECODE, 1)


def _time(platform: Any, runner: Any, batch: Any, steps: int) -> float:
    platform.synchronize()
    start = time.perf_counter()
    for _ in range(steps):
        runner.run(batch)
        read_done = runner.fence.take()
        if read_done is not None:
            read_done.discard()
    platform.synchronize()
    return (time.perf_counter() - start) / steps * 1e6


def measure(device: str, steps: int, repeat: int, us: float) -> list[tuple[str, float, float]]:
    """Per runner (the baseline first): the median microseconds per step and the ratio of its
    best round to the baseline's best round (each round runs every runner, in a rotated order;
    the best round is the one a loaded machine disturbed least)."""
    platform = platform_for(device)
    runners = {
        "off by argument (baseline)": _runner(platform, 0.0),
        "off, environment unset": _runner(platform, None),
    }
    if platform.name == "cuda":
        runners[f"on ({us:g} us)"] = _runner(platform, us)
    names = list(runners)
    times: dict[str, list[float]] = {name: [] for name in names}
    for runner, batch in runners.values():
        _time(platform, runner, batch, 20)  # warm
    for k in range(repeat):
        for name in names[k % len(names) :] + names[: k % len(names)]:
            runner, batch = runners[name]
            times[name].append(_time(platform, runner, batch, steps))
    base = min(times[names[0]])
    return [(n, statistics.median(times[n]), min(times[n]) / base) for n in names]


def measure_report(args: argparse.Namespace) -> Report:
    rows = measure(args.device or "cuda", args.steps, args.repeat, args.us)
    result = {
        "device": args.device or "cuda",
        "steps": args.steps,
        "repeat": args.repeat,
        "rows": [
            {"runner": name, "us_per_step": round(value, 2), "ratio": round(ratio, 4)}
            for name, value, ratio in rows
        ],
    }
    return Report(result, format_widen)


def format_widen(result: dict) -> str:
    lines = [
        f"race widener cost per step on {result['device']} ({result['steps']} steps x "
        f"{result['repeat']} rounds; ratio: best round against the baseline's best):"
    ]
    for row in result["rows"]:
        lines.append(
            f"  {row['runner']:<28} {row['us_per_step']:9.1f} us/step   ratio {row['ratio']:.3f}"
        )
    return "\n".join(lines)


BENCHMARK = Benchmark(
    "widen",
    "race widener: cost per step off (argument, environment) and on, ratios to off",
    (
        device_option(),
        option("--steps", default=300, type=positive_int_argument),
        option("--repeat", default=7, type=positive_int_argument),
        option("--us", default=50.0, type=float, help="the widener's spin when on (CUDA)"),
    ),
    measure_report,
)
