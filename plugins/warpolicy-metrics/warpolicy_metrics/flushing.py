"""Multi-process mode: moving the per-step counts into prometheus_client's per-process files.

In multi-process mode (``PROMETHEUS_MULTIPROC_DIR`` set, as SGLang and vLLM run
prometheus_client) the process serving ``/metrics`` reads only the files each process's
prometheus_client metrics write; custom collectors are not consulted (prometheus_client's
"Multiprocess Mode" documentation: "Custom collectors do not work"). The per-step counters stay
plain integers on the scheduler's thread (a multi-process ``Counter.inc`` takes a lock and
writes the mmap file: several times the no-op observer's cost per call), and a `Flusher`
thread adds what they gained since the last flush to real ``Counter`` objects every
``interval`` seconds, at exit, and on `WarpolicyMetrics.flush`. A scrape therefore lags the
steps by at most ``interval``.

Fork: a child starts with its parent's counts in memory and its own (empty) files; the
at-fork hook marks those counts as already flushed (the parent flushes them) and starts a new
flusher thread in the child, so nothing is counted twice.
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
import weakref
from collections.abc import Callable, Mapping
from typing import Protocol

from warpolicy import environment

log = logging.getLogger("warpolicy")

#: Where prometheus_client looks for its multi-process directory (the lower-case name is its
#: deprecated spelling, still honoured).
MULTIPROC_ENV = (environment.PROMETHEUS_MULTIPROC_DIR, environment.PROMETHEUS_MULTIPROC_DIR_LEGACY)


def multiprocess_from(environ: Mapping[str, str]) -> bool:
    """True when prometheus_client runs in multi-process mode in this environment (the test it
    makes itself when it is imported)."""
    return any(var.is_set(environ) for var in MULTIPROC_ENV)


class Flushable(Protocol):
    def flush(self) -> None: ...

    def forget_in_child(self) -> None: ...


class Flusher:
    """A daemon thread calling ``flush`` every ``interval`` seconds until `stop`."""

    def __init__(self, flush: Callable[[], None], interval: float) -> None:
        self._flush = flush
        self.interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._run, name="warpolicy-metrics-flush", daemon=True
        )
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self._flush()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not threading.current_thread():
            self._thread.join()

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()


#: Every instance in multi-process mode: flushed at exit, reset in a forked child.
_LIVE: weakref.WeakSet = weakref.WeakSet()
_HOOKED = False
_HOOK_LOCK = threading.Lock()


def track(metrics: Flushable) -> None:
    """Flush ``metrics`` at interpreter exit and reset it in forked children."""
    global _HOOKED
    with _HOOK_LOCK:
        _LIVE.add(metrics)
        if not _HOOKED:
            atexit.register(_flush_all)
            if hasattr(os, "register_at_fork"):
                os.register_at_fork(after_in_child=_forget_all_in_child)
            _HOOKED = True


def untrack(metrics: Flushable) -> None:
    with _HOOK_LOCK:
        _LIVE.discard(metrics)


def _flush_all() -> None:
    for metrics in list(_LIVE):
        metrics.flush()


def _forget_all_in_child() -> None:
    for metrics in list(_LIVE):
        metrics.forget_in_child()
