"""What the audit audits (`AuditSubject`) and how it widens race windows (GPU stalls)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import attrs

from warpolicy.registry.vocabulary import ForwardMode, WarReadDonePolicy
from warpolicy.runtime.canary import CanarySpec
from warpolicy.runtime.runners.adapters import ModelView
from warpolicy.runtime.runners.protocols import CanaryAdapter, Runner

#: Default stall before each captured segment, in microseconds.
DEFAULT_STALL_US = 200.0
#: GPU clock assumed when torch does not report one (the H200 boosts to ~1.98 GHz).
_DEFAULT_CLOCK_KHZ = 1_980_000

RunnerBuilder = Callable[[Any], Runner]  # (model adapter) -> an uncaptured runner
BatchMaker = Callable[[ForwardMode, int], Any]  # (mode, trial) -> a batch on the device
PostStep = Callable[[ForwardMode, Any, Any], Any]  # (mode, batch, output) -> step output
#: A buffer's poison override: one poison (tensor -> tensor) or a set of them, one poisoned
#: step each (`warpolicy.audit.poison`).
PoisonOverride = Callable[[Any], Any] | Sequence[Callable[[Any], Any]]


def _modes(value: Mapping) -> Mapping[ForwardMode, Any]:
    return {ForwardMode.parse(k): v for k, v in dict(value or {}).items()}


def _names(value: Mapping) -> Mapping[str, Any]:
    return {str(k): v for k, v in dict(value or {}).items()}


@attrs.frozen
class AuditSubject:
    """What a factory (``module:callable``, called with the `Platform`) returns.

    ``runners`` maps each mode to a builder that wraps the given model adapter in an
    uncaptured runner (``lambda m: DecodeRunner(m, policy, platform, keep_graphs=True)``):
    the audit passes a stall-wrapped copy of ``model``. ``make_batch(mode, trial)`` returns the
    trial's batch, on the device, deterministic in ``trial``; the trials must replay every
    captured bucket, or the mode is INCONCLUSIVE. ``post_step`` is eager work the engine runs
    on the forward stream after the runner's step (its reads of shared state count as reads
    of the step). ``poison`` overrides the default poison set per buffer (one callable, or a
    sequence of them: one poisoned step each). ``extra_outputs`` names state the step writes
    besides what it returns (KV pools, say): the audit snapshots it before each step, puts it
    back between the reference and the poisoned step, and compares it too, so a late read
    whose only effect is *where* the step writes is caught.
    """

    name: str
    model: Any
    runners: Mapping[ForwardMode, RunnerBuilder] = attrs.field(converter=_modes)
    make_batch: BatchMaker
    platform: Any
    declared: Mapping[ForwardMode, WarReadDonePolicy] = attrs.field(factory=dict, converter=_modes)
    spec: str = "none"
    post_step: PostStep | None = None
    poison: Mapping[str, PoisonOverride] = attrs.field(factory=dict)
    extra_outputs: Mapping[str, Any] = attrs.field(factory=dict, converter=_names)
    #: per mode declared per buffer class (``declared`` is then their latest): the overlap
    #: benchmark's per-class rows (`warpolicy.bench.overlap_classes`)
    declared_classes: Mapping[ForwardMode, Mapping[str, WarReadDonePolicy]] = attrs.field(
        factory=dict, converter=_modes
    )
    #: the buffer class of each shared buffer (one not listed: ``metadata``); the per-class
    #: audit poisons a class's buffers at that class's read-done
    buffer_classes: Mapping[str, str] = attrs.field(factory=dict, converter=_names)

    def class_of(self, buffer: str) -> str:
        """The buffer class of shared buffer ``buffer``."""
        return str(self.buffer_classes.get(buffer, "metadata"))


def make_stall(platform: Any, stall_us: float) -> Callable[[], None] | None:
    """A callable enqueueing a ``stall_us`` GPU spin on the current stream (None: no stall)."""
    if stall_us <= 0 or getattr(platform, "name", "") != "cuda":
        return None
    import torch  # noqa: PLC0415 - deferred: the audit package imports without torch

    props = torch.cuda.get_device_properties(platform.device)
    clock_khz = int(getattr(props, "clock_rate", 0) or 0)
    if clock_khz < 100_000:  # missing, or not in kHz: a too-short stall would hide races
        clock_khz = _DEFAULT_CLOCK_KHZ
    cycles = max(1, int(stall_us * clock_khz / 1000))
    return lambda: torch.cuda._sleep(cycles)


class StalledModel(ModelView):
    """A model adapter that spins the GPU before each captured segment, then delegates.

    Everything else (shared buffers, buckets, host prep, ``batch_size``, and any attribute
    beyond the protocol, such as a synthetic model's ``make_batch``) is the wrapped model's, so
    a runner built around it captures the same work with wider race windows.
    """

    def __init__(self, model: Any, stall: Callable[[], None]) -> None:
        super().__init__(model)
        self.stall = stall

    def graph_prep(self, bucket: int) -> None:
        self.stall()
        self.model.graph_prep(bucket)

    def forward(self, bucket: int) -> Any:
        self.stall()  # right after the plant: a late reader is still pending at the release
        return self.model.forward(bucket)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.model, name)


class StalledCanaryModel(StalledModel):
    """A `StalledModel` of a model the WAR canary can check. ``canary_spec`` is defined on the
    class because a runtime protocol check does not see ``__getattr__`` (Python 3.12's
    ``isinstance`` reads attributes statically): the canary would never sample it."""

    def __init__(self, model: CanaryAdapter, stall: Callable[[], None]) -> None:
        super().__init__(model, stall)
        self._canary_model = model

    def canary_spec(self, mode: ForwardMode, bucket: int, batch: Any) -> CanarySpec | None:
        return self._canary_model.canary_spec(mode, bucket, batch)


def stalled_model(model: Any, stall: Callable[[], None]) -> StalledModel:
    """``model`` with a GPU spin before each captured segment, keeping its optional protocols."""
    if isinstance(model, CanaryAdapter):
        return StalledCanaryModel(model, stall)
    return StalledModel(model, stall)
