"""GPU timing helpers of the overlap benchmark: probes, calibration, scheduler bookkeeping.

* `CudaProbe` / `HostProbe`: a timestamp per step point (GPU timing events, or host time on
  the simulated platform);
* `calibrate_rows`: the matmul size that takes about a target time on this GPU;
* `spin_work`, `copy_work`, `matmul_work` (`scheduler_work` picks one): the scheduler's GPU
  bookkeeping of about a target time (latency-bound spin, copy-engine upload, throughput-bound
  matmul).

Everything that touches CUDA imports torch inside the function, so importing this module (and
the CLI's ``bench`` listing) does not.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

#: The points a `StepProbe` marks in each step (see `warpolicy.runtime.runners.OverlapLoop`).
POINTS = ("launch", "launched", "released", "written")


class CudaProbe:
    """Records a timing event on the given stream at each mark (GPU time)."""

    def __init__(self) -> None:
        import torch  # noqa: PLC0415 - deferred: importing the benchmarks does not need torch

        self._torch = torch
        self.base = torch.cuda.Event(enable_timing=True)
        self.base.record()
        self.events: dict[str, list[Any]] = {p: [] for p in POINTS}

    def mark(self, point: str, stream: Any) -> None:
        ev = self._torch.cuda.Event(enable_timing=True)
        ev.record(stream)
        self.events[point].append(ev)

    def times_us(self) -> dict[str, list[float]]:
        """Microseconds since the probe was made (call after a synchronize)."""
        return {
            p: [self.base.elapsed_time(e) * 1000.0 for e in evs] for p, evs in self.events.items()
        }


class HostProbe:
    """Host timestamps at each mark: the fake platform's stand-in (meaningless as GPU time)."""

    def __init__(self) -> None:
        self.base = time.perf_counter()
        self.stamps: dict[str, list[float]] = {p: [] for p in POINTS}

    def mark(self, point: str, stream: Any) -> None:
        self.stamps[point].append((time.perf_counter() - self.base) * 1e6)

    def times_us(self) -> dict[str, list[float]]:
        return {p: list(v) for p, v in self.stamps.items()}


def _time_us(fn: Callable[[], Any], reps: int = 20) -> float:
    import torch  # noqa: PLC0415 - deferred: importing the benchmarks does not need torch

    for _ in range(3):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1000.0 / reps


def calibrate_rows(target_us: float, hidden: int, device: Any, *, tanh: bool = False) -> int:
    """Rows of a ``rows x hidden @ hidden x hidden`` bf16 matmul taking about ``target_us``."""
    import torch  # noqa: PLC0415 - deferred: importing the benchmarks does not need torch

    if target_us <= 0:
        return 0
    w = torch.randn(hidden, hidden, device=device, dtype=torch.bfloat16)
    rows = 1024
    for _ in range(3):  # matmul time is close to linear in rows at these sizes
        a = torch.randn(rows, hidden, device=device, dtype=torch.bfloat16)
        fn = (lambda a=a: torch.tanh(a @ w)) if tanh else (lambda a=a: a @ w)
        took = _time_us(fn)
        rows = int(min(max(round(rows * target_us / max(took, 1e-3) / 64) * 64, 64), 1 << 17))
    return rows


#: The scheduler's GPU bookkeeping: ``copy`` (copy engines), ``latency`` (one spinning SM),
#: ``matmul`` (every SM).
SCHED_KINDS = ("copy", "latency", "matmul")


def scheduler_work(
    kind: str, target_us: float, device: Any, *, rows: int = 0, hidden: int = 0
) -> Callable[[], None]:
    """The scheduler's GPU bookkeeping of ``kind`` (`SCHED_KINDS`): about ``target_us`` of a
    pinned upload (``copy``) or a spin (``latency``), or a ``rows x hidden`` matmul."""
    if kind == "matmul":
        return matmul_work(rows, hidden, device)
    if kind == "latency":
        return spin_work(target_us, device)
    return copy_work(target_us, device)


def spin_work(target_us: float, device: Any) -> Callable[[], None]:
    """Latency-bound scheduler bookkeeping: one single-thread spin kernel of ``target_us``.

    A real scheduler's GPU bookkeeping is a chain of tiny kernels (index writes, copies) that
    occupy a few SMs for their latency; a spin models that without competing with the forward
    for the whole GPU (a big matmul would, and then no barrier can recover its time).
    """
    import torch  # noqa: PLC0415 - deferred: importing the benchmarks does not need torch

    if target_us <= 0:
        return lambda: None

    def spin(cycles: int) -> Callable[[], None]:
        def work() -> None:
            torch.cuda._sleep(cycles)

        return work

    cycles = 200_000
    for _ in range(3):  # spin time is linear in cycles
        took = _time_us(spin(cycles))
        cycles = max(int(cycles * target_us / max(took, 1e-3)), 1000)
    return spin(cycles)


def copy_work(target_us: float, device: Any) -> Callable[[], None]:
    """Copy-engine scheduler bookkeeping: a pinned host-to-device upload of about ``target_us``.

    A scheduler uploads the next batch's metadata from pinned host memory; the DMA engines do
    it, so it overlaps the forward without taking SMs (a kernel on the schedule stream would
    hold SMs that persistent forward kernels wait for, which no barrier can give back).
    """
    import torch  # noqa: PLC0415 - deferred: importing the benchmarks does not need torch

    if target_us <= 0:
        return lambda: None
    nbytes = 4 << 20
    for _ in range(3):  # copy time is linear in bytes at these sizes
        src = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
        dst = torch.empty(nbytes, dtype=torch.uint8, device=device)
        took = _time_us(lambda: dst.copy_(src, non_blocking=True))  # noqa: B023 - called at once
        nbytes = max(int(nbytes * target_us / max(took, 1e-3)) // 4096 * 4096, 4096)
    src = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    dst = torch.empty(nbytes, dtype=torch.uint8, device=device)

    def work() -> None:
        dst.copy_(src, non_blocking=True)

    return work


def matmul_work(
    rows: int, hidden: int, device: Any, dtype: Any = None, seed: int = 1
) -> Callable[[], None]:
    """A closure doing one ``rows x hidden @ hidden x hidden`` matmul (scheduler bookkeeping)."""
    import torch  # noqa: PLC0415 - deferred: importing the benchmarks does not need torch

    device = torch.device(device)
    dtype = dtype or (torch.bfloat16 if device.type == "cuda" else torch.float32)
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(max(rows, 1), hidden, generator=g).to(device, dtype)
    b = (torch.randn(hidden, hidden, generator=g) / math.sqrt(hidden)).to(device, dtype)
    out = torch.empty(max(rows, 1), hidden, device=device, dtype=dtype)

    def work() -> None:
        torch.matmul(a, b, out=out)

    return work
