"""What the race widener costs per step: nothing when off, its spin when on.

``python -m warpolicy.bench.widen [--device sim|cuda] [--steps 300] [--repeat 5] [--us 50]``
builds decode runners on the same zoo model in one process: the baseline is a runner whose
model is given to it already resolved off (``widen_race_us=0``: the step path is exactly the
0.3 one), then a runner resolving the widener from an unset environment (what every runner does
by default), and (CUDA only) one with the widener on. It runs their steps interleaved,
``repeat`` rounds of ``steps`` each, and prints the median microseconds per step and each one's
ratio to the baseline. Off, the runner keeps the model itself (``runner.model is model``), so
the ratio is the noise of two identical runners.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from typing import Any, Optional, Sequence

from warpolicy.audit.api import platform_for
from warpolicy.audit.zoo.fixture import Declares, make_subject, zoo_fixture
from warpolicy.registry.vocabulary import POST_REPLAY, ForwardMode


def _runner(platform: Any, widen_race_us: Optional[float]) -> tuple[Any, Any]:
    """A captured decode runner on a fresh zoo model and its batch (a post_replay fixed
    declaration: every step publishes); ``widen_race_us`` None: from the environment."""
    import attrs  # noqa: PLC0415 - deferred: only the benchmark needs it here

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


def measure(device: str, steps: int, repeat: int, us: float) -> list[tuple[str, float]]:
    """Median microseconds per step of each runner (the baseline first)."""
    platform = platform_for(device)
    runners = {
        "off by argument (baseline)": _runner(platform, 0.0),
        "off, environment unset": _runner(platform, None),
    }
    if platform.name == "cuda":
        runners[f"on ({us:g} us)"] = _runner(platform, us)
    times: dict[str, list[float]] = {name: [] for name in runners}
    for runner, batch in runners.values():
        _time(platform, runner, batch, 10)  # warm
    for _ in range(repeat):
        for name, (runner, batch) in runners.items():
            times[name].append(_time(platform, runner, batch, steps))
    return [(name, statistics.median(t)) for name, t in times.items()]


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m warpolicy.bench.widen", description=__doc__)
    p.add_argument("--device", default="sim")
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--us", type=float, default=50.0)
    args = p.parse_args(argv)
    rows = measure(args.device, args.steps, args.repeat, args.us)
    base = rows[0][1]
    print(f"race widener cost per step on {args.device} ({args.steps} steps x {args.repeat}):")
    for name, value in rows:
        print(f"  {name:<26} {value:9.1f} us/step   ratio {value / base:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
