"""The race-window widener: make a race of a few microseconds certain, on purpose.

An early release is a race: the scheduler's write must land before the forward's late read.
On a GPU that window is often under 10 us, so a late reader usually wins, and any probe added
to look for the race (a sync, a print, a heavier check) hides it. The widener stretches the
forward's reads *after* the release point: a GPU spin of ``us`` microseconds on the forward
stream, captured into the graph

* at the graph's start (before the in-graph metadata prep): everything the graph reads comes
  ``us`` later than a ``pre_replay`` release;
* right after the in-graph marker (the ``in_graph`` release point): every reader after it comes
  ``us`` later than the event fires.

So a scheduler that waits on a published read-done event writes first, and a reader the
declaration missed reads the new values, every time: a `warpolicy audit` trial, a zoo fixture or
a WAR canary check sees the race deterministically. A correct release is unaffected (its readers
all precede the event); the widened step is only slower.

Off by default and resolved once: `RaceWidener.resolve` reads the API argument, else the
environment variable ``WARPOLICY_WIDEN_RACE_US`` (microseconds; unset, empty or ``0``: off), once,
when a runner or fixture is built. When off, `RaceWidener.wrap` returns the model itself, so the
step path is exactly the unwidened one: zero cost per step (``warpolicy bench widen``
prints the ratio). Only CUDA spins; on the simulated platform the race is already the widest
window (the audit and the canary land the scheduler's writes at the release itself).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping
from typing import Any

import attrs

from warpolicy import environment
from warpolicy.errors import InputError
from warpolicy.registry.vocabulary import ForwardMode
from warpolicy.runtime.canary import CanarySpec
from warpolicy.runtime.runners.adapters import ModelView
from warpolicy.runtime.runners.protocols import CanaryAdapter

log = logging.getLogger("warpolicy")

#: The environment variable: microseconds of spin at the release point (unset/0: off).
WIDEN_ENV = environment.WIDEN_RACE_US.name
#: GPU clock assumed when torch does not report one (an H100/H200 boosts to ~1.98 GHz).
_DEFAULT_CLOCK_KHZ = 1_980_000
#: The most a widener spins per point (a typo of a few zeros must not hang a server for hours).
MAX_US = 1_000_000.0


def _microseconds(value: Any, where: str) -> float:
    if isinstance(value, bool):
        raise InputError(f"{where}: {value!r} is not a number of microseconds")
    try:
        us = float(value)
    except (TypeError, ValueError):
        raise InputError(f"{where}: {value!r} is not a number of microseconds") from None
    if not math.isfinite(us) or us < 0 or us > MAX_US:
        raise InputError(f"{where}: {value!r} must be from 0 to {MAX_US:g} microseconds")
    return us


def _widener_us(value: Any) -> float:
    return _microseconds(value, "race widener")


@attrs.frozen
class RaceWidener:
    """How long to spin at the release point (0: off). Build it with `resolve`."""

    us: float = attrs.field(default=0.0, converter=_widener_us)
    source: str = "off"  # where the value came from ("argument", WIDEN_ENV, "off")

    @classmethod
    def resolve(
        cls, us: float | None = None, environ: Mapping[str, str] | None = None
    ) -> RaceWidener:
        """The API argument when given (`InputError` for a bad one), else ``WIDEN_ENV``: a
        value that is not a number from 0 to `MAX_US` is off, with one log line (a typo in an
        environment never widens, never crashes)."""
        if us is not None:
            return cls(_microseconds(us, "widen_race_us"), "argument")
        raw = environment.WIDEN_RACE_US.get(environ).strip()
        if not raw:
            return cls()
        try:
            value = _microseconds(raw, WIDEN_ENV)
        except InputError as exc:
            log.warning("warpolicy: %s; the race widener is off", exc)
            return cls()
        return cls(value, WIDEN_ENV) if value > 0 else cls()

    @property
    def on(self) -> bool:
        return self.us > 0

    def spin(self, platform: Any) -> Callable[[], None] | None:
        """A callable enqueueing the spin on the current stream; None when off or not CUDA."""
        if not self.on or getattr(platform, "name", "") != "cuda":
            return None
        import torch  # noqa: PLC0415 - deferred: the runtime imports without torch

        props = torch.cuda.get_device_properties(platform.device)
        clock_khz = int(getattr(props, "clock_rate", 0) or 0)
        if clock_khz < 100_000:  # missing, or not in kHz: a too-short spin would hide races
            clock_khz = _DEFAULT_CLOCK_KHZ
        cycles = max(1, int(self.us * clock_khz / 1000))
        return lambda: torch.cuda._sleep(cycles)

    def wrap(self, model: Any, platform: Any) -> Any:
        """``model`` itself when off (or not CUDA); else a view spinning at the release points
        (the module docstring). Call once, when the runner is built."""
        spin = self.spin(platform)
        if spin is None:
            return model
        if isinstance(model, CanaryAdapter):
            return WidenedCanaryModel(model, spin)
        return WidenedModel(model, spin)

    def describe(self) -> str:
        return f"{self.us:g} us ({self.source})" if self.on else "off"


class WidenedModel(ModelView):
    """A model adapter that spins at the graph's start and right after the marker."""

    def __init__(self, model: Any, spin: Callable[[], None]) -> None:
        super().__init__(model)
        self.spin = spin

    def graph_prep(self, bucket: int) -> None:
        self.spin()  # after a pre_replay release: the prep's reads come later
        self.model.graph_prep(bucket)

    def forward(self, bucket: int) -> Any:
        self.spin()  # right after the marker: every later reader comes after the event fires
        return self.model.forward(bucket)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.model, name)


class WidenedCanaryModel(WidenedModel):
    """A `WidenedModel` of a model the WAR canary checks (``canary_spec`` on the class: a
    protocol check does not see ``__getattr__``)."""

    def __init__(self, model: CanaryAdapter, spin: Callable[[], None]) -> None:
        super().__init__(model, spin)
        self._canary_model = model

    def canary_spec(self, mode: ForwardMode, bucket: int, batch: Any) -> CanarySpec | None:
        return self._canary_model.canary_spec(mode, bucket, batch)
