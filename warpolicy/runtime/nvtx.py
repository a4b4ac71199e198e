"""NVTX ranges for Nsight Systems timelines: an observer plugin, registered only when asked.

With ``WARPOLICY_NVTX=1`` the composition root registers `NvtxPlugin` (see
`nvtx_plugin_if_enabled`); without it nothing is registered, so the fence's observer checks
find no implementation and the ranges cost nothing. On the host thread's NVTX row each step
then shows:

* a range ``warpolicy <runner> step <n> <policy>`` from the publish (right after the replay
  is enqueued) to the scheduler barrier, ``(nothing published)`` appended when the step
  published no event;
* a mark ``warpolicy <runner> step <n> released: <kind> (<reason>)`` where the barrier was
  applied, i.e. where the scheduler was released (``event``) or made to wait for the whole
  forward (``coarse``);
* marks for capture-time decisions and fail-closed fallbacks;
* a mark ``warpolicy VIOLATION <runner> <mode> bucket <b> step <n>: <first difference>`` where
  the WAR canary caught an early release (the cell runs coarse from there on).

Ranges go through torch's own binding, ``torch.cuda.nvtx``. At most one range per thread is
open: a publish whose barrier never came (a runner used without a scheduler, or an observer
that raised before this one) is closed at the next publish, fallback or `NvtxPlugin.close`,
so pushes and pops stay balanced. The plugin never raises: if NVTX fails, it turns itself off
with one log line.
"""

from __future__ import annotations

import importlib
import logging
import threading
from collections.abc import Mapping
from typing import Any, Protocol

from warpolicy import environment
from warpolicy.registry.inputs import env_switch
from warpolicy.runtime.markers import hookimpl

log = logging.getLogger("warpolicy")


class NvtxApi(Protocol):
    """The part of ``torch.cuda.nvtx`` the plugin uses."""

    def range_push(self, msg: str) -> Any: ...

    def range_pop(self) -> Any: ...

    def mark(self, msg: str) -> Any: ...


def load_nvtx() -> NvtxApi:
    """``torch.cuda.nvtx``. Imported here, not at module level: the registry, engine and CLI
    import without torch, and only a process that asked for ranges needs it."""
    return importlib.import_module("torch.cuda.nvtx")


def _label(value: Any) -> str:
    return str(getattr(value, "label", value))


class NvtxPlugin:
    """Observer hooks that push NVTX ranges and marks (see the module docstring)."""

    def __init__(self, nvtx: NvtxApi | None = None) -> None:
        self._nvtx: NvtxApi | None = nvtx if nvtx is not None else load_nvtx()
        self._local = threading.local()  # NVTX ranges nest per thread
        self.pushed = 0
        self.popped = 0

    @property
    def enabled(self) -> bool:
        """False once an NVTX call failed (the plugin then does nothing)."""
        return self._nvtx is not None

    def close(self) -> None:
        """Pop this thread's open range, if any (end of a run)."""
        nvtx = self._nvtx
        if nvtx is None or not getattr(self._local, "open", False):
            return
        self._local.open = False  # first: a pop that raises is not retried
        try:
            nvtx.range_pop()
            self.popped += 1
        except Exception as exc:  # noqa: BLE001 - an observer must not raise
            self._off(exc)

    def _off(self, exc: BaseException) -> None:
        nvtx, self._nvtx = self._nvtx, None
        log.warning("warpolicy: NVTX ranges are off (%s: %s)", type(exc).__name__, exc)
        # A failed mark must not strand this thread's open range: pop it once, now.
        if nvtx is not None and getattr(self._local, "open", False):
            self._local.open = False
            try:
                nvtx.range_pop()
                self.popped += 1
            except Exception:  # noqa: BLE001 - already off; the range is lost either way
                pass

    def _mark(self, text: str) -> None:
        nvtx = self._nvtx
        if nvtx is None:
            return
        try:
            nvtx.mark(text)
        except Exception as exc:  # noqa: BLE001
            self._off(exc)

    @hookimpl
    def warpolicy_on_publish(self, runner: str, step: int, policy: Any, event: Any) -> None:
        self.close()
        nvtx = self._nvtx
        if nvtx is None:
            return
        name = f"warpolicy {runner} step {step} {_label(policy)}"
        if event is None:
            name += " (nothing published)"
        try:
            nvtx.range_push(name)
        except Exception as exc:  # noqa: BLE001 - nothing was pushed: nothing to pop
            self._off(exc)
            return
        self.pushed += 1
        self._local.open = True

    @hookimpl
    def warpolicy_on_barrier(self, runner: str, step: int | None, kind: str, reason: str) -> None:
        self.close()
        self._mark(f"warpolicy {runner} step {step} released: {kind} ({reason})")

    @hookimpl
    def warpolicy_on_fallback(self, where: str, error: BaseException) -> None:
        self.close()
        self._mark(f"warpolicy fallback {where}: {type(error).__name__}")

    @hookimpl
    def warpolicy_on_violation(
        self, runner: str, mode: Any, bucket: int | None, step: int, detail: str
    ) -> None:
        self.close()
        where = "eager" if bucket is None else f"bucket {bucket}"
        self._mark(f"warpolicy VIOLATION {runner} {_label(mode)} {where} step {step}: {detail}")

    @hookimpl
    def warpolicy_on_decision(self, decision: Any, where: str) -> None:
        context = getattr(decision, "context", None)
        mode = getattr(getattr(context, "mode", None), "value", "?")
        self._mark(
            f"warpolicy decide {where} {mode} {_label(getattr(decision, 'policy', decision))}"
        )


def nvtx_plugin_if_enabled(environ: Mapping[str, str]) -> NvtxPlugin | None:
    """The plugin when ``WARPOLICY_NVTX`` is set true, else None (nothing to register).

    Asked for but unusable (no torch, a torch without NVTX): None and one log line, so a
    profiling switch never stops an engine.
    """
    if not env_switch(environ, environment.NVTX):
        return None
    try:
        nvtx = load_nvtx()
        nvtx.mark("warpolicy: NVTX ranges on")  # a CPU-only torch raises here
    except Exception as exc:  # noqa: BLE001 - ImportError, or the stub's RuntimeError
        log.warning(
            "warpolicy: %s is set but NVTX is unavailable (%s: %s); no ranges",
            environment.NVTX.name,
            type(exc).__name__,
            exc,
        )
        return None
    return NvtxPlugin(nvtx)
