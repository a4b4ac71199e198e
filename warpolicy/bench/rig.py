"""The bench rig: what every GPU benchmark sets up the same way, written once.

* `open_rig`: the platform for a device (``None``: CUDA, which must be present, else
  `CudaUnavailableError` naming the benchmark; ``sim``/``fake``: the simulated platform, tiny
  and host-timed, numbers meaningless), its torch device and the probe that times steps on it
  (`warpolicy.bench.timing.CudaProbe`, or `HostProbe` on the simulated platform);
* `Rig.layer_rows` and `Rig.bookkeeping`: a synthetic layer's width for a target time, and
  the scheduler's GPU bookkeeping of a kind (`warpolicy.bench.timing.SCHED_KINDS`), both
  calibrated on CUDA and tiny on the simulated platform;
* `synthetic_config`: the synthetic decode model's configuration the benchmarks share (the
  audit's model, `warpolicy.audit.synthetic_model`, wide and bf16 on CUDA);
* `device_name`, `torch_version`: what a result's config names.

Everything that touches torch imports it inside the function, so importing a benchmark (and
the CLI's ``bench`` listing) does not.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import attrs

from warpolicy.bench.timing import (
    SCHED_KINDS,
    CudaProbe,
    HostProbe,
    calibrate_rows,
    matmul_work,
    scheduler_work,
)
from warpolicy.errors import CudaUnavailableError, InputError
from warpolicy.registry.vocabulary import ForwardMode
from warpolicy.runtime.manager import open_runtime
from warpolicy.runtime.platforms import Platform, cuda_available, is_simulated

#: The simulated platform's stand-in for a synthetic layer's and the bookkeeping's width.
SIM_ROWS = 8


@attrs.frozen
class Rig:
    """One benchmark's platform, torch device and step probe."""

    platform: Platform
    #: the torch device the models and the bookkeeping live on (the CPU when simulated)
    device: Any
    #: whether this is the simulated platform (host times: numbers meaningless)
    simulated: bool
    #: a new probe per timed run (`CudaProbe` or `HostProbe`)
    probe: Callable[[], Any]

    def layer_rows(self, target_us: float, hidden: int) -> int:
        """The rows of a synthetic layer taking about ``target_us`` (tiny when simulated)."""
        if self.simulated:
            return SIM_ROWS
        return calibrate_rows(target_us, hidden, self.device, tanh=True)

    def bookkeeping(
        self, kind: str, target_us: float, hidden: int, *, rows: int | None = None
    ) -> Callable[[], None]:
        """The scheduler's GPU bookkeeping after its writes: about ``target_us`` of ``kind``
        (a ``matmul`` of ``rows``, calibrated when None); a tiny matmul when simulated."""
        check_sched_kind(kind)
        if self.simulated:
            return matmul_work(SIM_ROWS, hidden, self.device)
        if kind == "matmul" and rows is None:
            rows = calibrate_rows(target_us, hidden, self.device)
        return scheduler_work(kind, target_us, self.device, rows=rows or 0, hidden=hidden)


def check_sched_kind(kind: str) -> None:
    if kind not in SCHED_KINDS:
        raise InputError(f"sched_kind must be one of {', '.join(SCHED_KINDS)}, not {kind!r}")


def open_rig(device: Any, what: str, *, pm: Any = None) -> Rig:
    """The rig of ``device`` (None: ``cuda``) for the benchmark named ``what``: raises
    `CudaUnavailableError` without CUDA unless ``device`` is simulated."""
    simulated = device is not None and is_simulated(device)
    if not simulated and not cuda_available():
        raise CudaUnavailableError(
            f"{what} needs a CUDA device (torch.cuda.is_available() is False); "
            "--device sim runs it on the simulated platform"
        )
    return rig_of(open_runtime("sim" if simulated else (device or "cuda"), pm=pm).platform)


def rig_of(platform: Platform) -> Rig:
    """The rig of a platform already open (CUDA, else the simulated platform on the CPU)."""
    import torch  # noqa: PLC0415 - deferred: importing the benchmarks does not need torch

    if platform.name != "cuda":
        return Rig(platform, torch.device("cpu"), True, HostProbe)
    return Rig(platform, torch.device(platform.device), False, CudaProbe)


def synthetic_config(
    device: Any,
    *,
    batch: int,
    hidden: int,
    layers: int,
    layer_rows: int,
    modes: Iterable[ForwardMode] = (ForwardMode.DECODE,),
    **more: Any,
) -> Any:
    """The synthetic model's configuration every benchmark shares: ``2 * batch`` requests of
    64 positions, one bucket of ``batch`` per mode, bf16 on a CUDA ``device`` (else float32);
    ``more`` sets other `SyntheticConfig` fields (``window_rows``, ``shared_index``, ``seed``)."""
    import torch  # noqa: PLC0415 - deferred: importing the benchmarks does not need torch

    # deferred: the synthetic model imports torch
    from warpolicy.audit.synthetic_model import SyntheticConfig  # noqa: PLC0415

    return SyntheticConfig(
        reqs=2 * batch,
        ctx=64,
        swa_slots=1024,
        hidden=hidden,
        layers=layers,
        buckets={mode: (batch,) for mode in modes},
        layer_rows=layer_rows,
        dtype=torch.bfloat16 if torch.device(device).type == "cuda" else torch.float32,
        **more,
    )


def device_name(platform: Platform) -> str:
    """The GPU's name on CUDA, else the platform's."""
    if platform.name != "cuda":
        return platform.name
    import torch  # noqa: PLC0415 - deferred: importing the benchmarks does not need torch

    return str(torch.cuda.get_device_name(platform.device))


def torch_version() -> str:
    import torch  # noqa: PLC0415 - deferred: importing the benchmarks does not need torch

    return str(torch.__version__)
