"""warpolicy plugin: a Chrome-trace / Perfetto JSON timeline of decisions, publishes, barriers.

Registered through the entry point ``[project.entry-points.warpolicy] trace =
"warpolicy_trace"``; implements only observer hooks, so it never changes a decision or a
barrier. Events are instant events (``"ph": "i"``) with host timestamps in microseconds, one
track (``tid``) per runner plus one for the scheduler barrier. The file named by
``WARPOLICY_TRACE_FILE`` is written at exit and on `flush`.
"""

from __future__ import annotations

import atexit
import json
import os
import threading
import time
from typing import Any

import pluggy

from warpolicy import environment

__version__ = "0.2.0"

hookimpl = pluggy.HookimplMarker("warpolicy")


def _label(value: Any) -> str:
    """A policy's lowercase label, or its str."""
    return str(getattr(value, "label", value))


class Tracer:
    """Collects trace events in memory; `write` dumps them as ``{"traceEvents": [...]}``."""

    def __init__(self, max_events: int = 200_000) -> None:
        self.max_events = max_events
        self.dropped = 0
        self._events: list[dict] = []
        self._tracks: dict[str, int] = {}
        self._lock = threading.Lock()
        self._pid = os.getpid()
        self._t0 = time.perf_counter_ns()

    def _track(self, name: str) -> int:
        tid = self._tracks.get(name)
        if tid is None:
            tid = self._tracks[name] = len(self._tracks) + 1
        return tid

    def add(self, track: str, name: str, args: dict) -> None:
        """Append one instant event on ``track``."""
        ts = (time.perf_counter_ns() - self._t0) / 1000.0
        with self._lock:
            if len(self._events) >= self.max_events:
                self.dropped += 1
                return
            self._events.append(
                {
                    "name": name,
                    "cat": "warpolicy",
                    "ph": "i",
                    "s": "t",
                    "ts": ts,
                    "pid": self._pid,
                    "tid": self._track(track),
                    "args": args,
                }
            )

    def events(self) -> list[dict]:
        with self._lock:
            return list(self._events)

    def document(self) -> dict:
        """The trace: events plus thread-name metadata so each track shows its runner."""
        with self._lock:
            names = [
                {
                    "name": "thread_name",
                    "ph": "M",
                    "pid": self._pid,
                    "tid": tid,
                    "args": {"name": track},
                }
                for track, tid in self._tracks.items()
            ]
            body = names + list(self._events)
            dropped = self.dropped
        doc: dict = {"traceEvents": body, "displayTimeUnit": "ms"}
        if dropped:
            doc["otherData"] = {"dropped_events": dropped}
        return doc

    def write(self, path: str) -> str:
        """Write the trace to ``path`` (atomically: temp file then rename)."""
        tmp = f"{path}.tmp{os.getpid()}"
        with open(tmp, "w", encoding="utf-8") as fh:
            json.dump(self.document(), fh)
        os.replace(tmp, path)
        return path

    def clear(self) -> None:
        with self._lock:
            self._events.clear()
            self._tracks.clear()
            self.dropped = 0


def _max_events() -> int:
    try:
        return max(1, int(environment.TRACE_MAX_EVENTS.get() or "200000"))
    except ValueError:
        return 200_000


TRACER = Tracer(_max_events())


def events() -> list[dict]:
    """The events collected so far (a copy)."""
    return TRACER.events()


def flush(path: str | None = None) -> str | None:
    """Write the trace to ``path`` or ``$WARPOLICY_TRACE_FILE``; returns the path written, or
    None when there is no path."""
    target = path or environment.TRACE_FILE.get()
    if not target:
        return None
    return TRACER.write(target)


def _flush_at_exit() -> None:
    try:
        flush()
    except OSError:  # exit must not fail because a trace file cannot be written
        pass


atexit.register(_flush_at_exit)


# -- observer hooks --------------------------------------------------------------------------------


@hookimpl
def warpolicy_on_decision(decision: Any, where: str) -> None:
    context = getattr(decision, "context", None)
    args: dict[str, object] = {
        "policy": _label(getattr(decision, "policy", decision)),
        "where": where,
    }
    if context is not None:
        args["context"] = str(context)
    reasons = getattr(decision, "reasons", None)
    if reasons:
        args["reasons"] = [str(r) for r in reasons]
    TRACER.add(f"decisions:{where}", f"decide {args['policy']}", args)


@hookimpl
def warpolicy_on_publish(runner: str, step: int, policy: Any, event: Any) -> None:
    published = event is not None
    TRACER.add(
        f"runner:{runner}",
        f"publish {_label(policy)}" if published else "publish none",
        {"step": step, "policy": _label(policy), "event": published},
    )


@hookimpl
def warpolicy_on_barrier(runner: str, step: int | None, kind: str, reason: str) -> None:
    TRACER.add(
        "scheduler",
        f"barrier {kind}",
        {"runner": runner, "step": step, "kind": kind, "reason": reason},
    )


@hookimpl
def warpolicy_on_fallback(where: str, error: BaseException) -> None:
    TRACER.add("fallbacks", "fallback", {"where": where, "error": repr(error)})
