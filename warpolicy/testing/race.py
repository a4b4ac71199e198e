"""A race on the simulated platform, for testing a canary spec or a declaration on the CPU.

The simulated platform runs everything in program order, so the scheduler's writes never race
a forward by themselves. `SimRace` seeds the race the way the audit's simulated trials do: it
lands the scheduler's next-step writes at the instant the step's published release point fires
(the in-graph node's record, or the fence's host record), which is the widest window a real GPU
could give. A reader after that point (a late reader) then reads the next step's values, and a
WAR canary sampling that step sees its output change (docs/canary.md, "Testing an adapter's
spec").
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from warpolicy.registry.vocabulary import IN_GRAPH, NONE
from warpolicy.testing.sim import sim_impl


class SimRace:
    """A `StepProbe` that makes the scheduler's next writes race the step being launched: they
    land at the step's release point (see the module docstring). Use ``writes`` to wrap the
    step's ``write_next``."""

    def __init__(self, platform: Any, runner: Any) -> None:
        self.impl = sim_impl(platform)
        self.runner = runner
        self._next: tuple[Callable[[], None], int] | None = None
        self._armed: tuple[Callable[[], None], int | None, int] | None = None
        self._done = False
        self.fired = 0
        self.impl.listeners.append(self._on_entry)

    def writes(self, fn: Callable[[], None], size: int) -> Callable[[], None]:
        """The step's ``write_next``: ``fn`` runs at the release (or here, if it has not)."""
        self._next = (fn, size)
        self._done = False

        def write_next() -> None:
            if not self._done:
                self._done = True
                fn()

        return write_next

    def mark(self, point: str, stream: Any) -> None:
        if point == "launch" and self._next is not None:
            fn, size = self._next
            self._next = None
            bucket = self.runner.bucket_for(size)
            release = self.runner.release_of(bucket)
            if release.policy is NONE:
                return  # the scheduler waits for the whole forward: nothing can race
            event = release.event.id if release.policy is IN_GRAPH else None
            self._armed = (fn, event, stream.id)
        elif point == "launched":
            self._armed = None

    def _on_entry(self, entry: tuple) -> None:
        armed = self._armed
        if armed is None or entry[0] != "record":
            return
        fn, event, stream = armed
        if (event is not None and entry[1] == event and entry[3] == "in_graph") or (
            event is None and entry[2] == stream and entry[3] is False
        ):
            self._armed = None
            self._done = True
            self.fired += 1
            fn()


__all__ = ["SimRace"]
