"""The ``warpolicy_*`` hook specifications.

Three kinds of hooks:

* **Fragment hook** (`warpolicy_capabilities`): every plugin's result is collected and
  merged by the registry's own rules (`warpolicy.plugins.collect_fragments` sorts them by
  plugin name), never by pluggy call order.
* **Platform hooks** (``firstresult=True``): each takes ``device`` (a ``torch.device`` or a
  plain string such as ``"fake"``; use `warpolicy.platform.device_type` to read its type).
  An implementation returns ``None`` when it does not handle that device type, so the first
  plugin that handles the device answers. Hooks that have no natural value (record, wait,
  replay, ...) return ``True`` when they handled the call. Built-in platform plugins are
  ``trylast`` so a third-party plugin for the same device type wins. Code calls these hooks
  through `warpolicy.platform.Platform`, never directly.
* **Observer hooks** (no result): see every decision, publish, barrier and fallback, for
  logging, metrics and tracing. They must be cheap and must not raise; if one raises, the
  fence treats the step as failed and falls back to the coarse barrier (fail closed).

Implementations may accept any subset of a hook's arguments (pluggy passes only the ones
they name), so new arguments can be added here without breaking plugins.
"""

from __future__ import annotations

from typing import Any, Callable, ContextManager, Mapping, Optional, Sequence, Union
import os

import pluggy

PROJECT = "warpolicy"

hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)

#: What `warpolicy_capabilities` may return: a file (``pathlib.Path``), YAML text (``str``),
#: an already-parsed mapping, or a list of these.
FragmentResult = Union[os.PathLike, str, Mapping[str, Any], Sequence[Union[os.PathLike, str, Mapping[str, Any]]]]


# -- registry fragments ------------------------------------------------------------------------

@hookspec
def warpolicy_capabilities() -> Optional[FragmentResult]:
    """Contribute registry fragments: backends, spec algorithms, flags or gates.

    Fires when a registry is loaded with plugins (`PolicyEngine.load`, the CLI). Return a
    ``pathlib.Path`` naming a YAML file, a ``str`` of YAML *text* (a ``str`` is never taken as
    a file name), a mapping in the registry format, a list of these, or ``None``.

    Results combine: all are collected, ordered by plugin name (not call order) and merged
    after the core file by the registry's rules; an invalid fragment stops loading with an
    error naming the plugin.
    """


# -- platform: identity ------------------------------------------------------------------------

@hookspec(firstresult=True)
def warpolicy_platform_name(device: Any) -> Optional[str]:
    """Name the platform that handles ``device`` (``"cuda"``, ``"fake"``), or None.

    Fires once when a `Platform` is built for a device; a device nobody names is an error.
    First non-None result wins.
    """


@hookspec(firstresult=True)
def warpolicy_external_events_supported(device: Any) -> Optional[bool]:
    """Whether events recorded during a graph capture on ``device`` become in-graph nodes.

    Fires once per `Platform` (the answer is cached). First non-None result wins; False
    makes the engine demote ``in_graph`` to ``post_replay``.
    """


@hookspec(firstresult=True)
def warpolicy_platform_log(device: Any) -> Optional[list]:
    """The call log of a recording (test) platform, or None for real platforms.

    Fires when `Platform.log` is read. First non-None result wins.
    """


# -- platform: events --------------------------------------------------------------------------

@hookspec(firstresult=True)
def warpolicy_create_event(device: Any, external: bool) -> Any:
    """Create a read-done event for ``device``; ``external=True`` asks for an event whose
    record during a capture becomes a graph node (only valid if external events are supported).

    Fires when a fence prepares (one persistent external event) and fills its ring (plain
    events). First non-None result (the event) wins.
    """


@hookspec(firstresult=True)
def warpolicy_record_event(device: Any, event: Any, stream: Any) -> Optional[bool]:
    """Record ``event`` on ``stream``; ``stream=None`` means the *current* stream.

    Fires for the eager seed record, for the plant inside a capture (always with
    ``stream=None``: the capture stream must be current or no node is made) and for the
    pre/post-replay records. Return True when handled; first non-None result wins.
    """


@hookspec(firstresult=True)
def warpolicy_wait_event(device: Any, stream: Any, event: Any) -> Optional[bool]:
    """Make ``stream`` wait for ``event`` (the scheduler's fine-grained barrier).

    Fires in `SchedulerBarrier.apply` when an event was taken. Return True when handled.
    """


@hookspec(firstresult=True)
def warpolicy_wait_stream(device: Any, stream: Any, other: Any) -> Optional[bool]:
    """Make ``stream`` wait for all work queued so far on ``other`` (the coarse barrier).

    Fires in `SchedulerBarrier.apply` when there is no event, coarse is forced, or a hook
    failed. Return True when handled.
    """


# -- platform: streams and graphs -------------------------------------------------------------

@hookspec(firstresult=True)
def warpolicy_is_capturing(device: Any) -> Optional[bool]:
    """Whether the current stream is capturing a graph; fires in `ReadDoneFence.plant`, which
    records only then. First non-None result wins."""


@hookspec(firstresult=True)
def warpolicy_new_stream(device: Any) -> Any:
    """Create a new stream on ``device`` (runner warm-up, the scheduler's schedule stream).
    First non-None result wins."""


@hookspec(firstresult=True)
def warpolicy_current_stream(device: Any) -> Any:
    """The current stream of ``device`` (the forward stream a runner launches on). First
    non-None result wins."""


@hookspec(firstresult=True)
def warpolicy_use_stream(device: Any, stream: Any) -> Optional[ContextManager[Any]]:
    """A context manager that makes ``stream`` current while it is entered (warm-up, the
    scheduler's writes). First non-None result wins."""


@hookspec(firstresult=True)
def warpolicy_new_graph(device: Any, keep_graph: bool) -> Any:
    """Create an empty graph; ``keep_graph=True`` keeps the raw graph for the static audit."""


@hookspec(firstresult=True)
def warpolicy_graph_pool(device: Any) -> Any:
    """A memory-pool handle that several graphs of one runner can share."""


@hookspec(firstresult=True)
def warpolicy_capture(device: Any, graph: Any, stream: Any, pool: Any) -> Optional[ContextManager[Any]]:
    """A context manager capturing the work of its block into ``graph`` (``stream=None``:
    the platform's capture stream). ``is_capturing()`` is True inside the block."""


@hookspec(firstresult=True)
def warpolicy_capture_callable(device: Any, graph: Any, fn: Callable[[], Any], stream: Any,
                               pool: Any) -> Optional[bool]:
    """Capture ``fn()`` into ``graph``; return True when handled.

    Runners use this form so a platform without real graphs (the fake) can re-run ``fn`` at
    each replay. A platform that does not implement it gets the `warpolicy_capture` form.
    """


@hookspec(firstresult=True)
def warpolicy_replay(device: Any, graph: Any) -> Optional[bool]:
    """Enqueue a replay of ``graph`` on the current stream; return True when handled."""


@hookspec(firstresult=True)
def warpolicy_synchronize(device: Any) -> Optional[bool]:
    """Block the host until all work on ``device`` is done; return True when handled."""


# -- observers ---------------------------------------------------------------------------------

@hookspec
def warpolicy_on_decision(decision: Any, where: str) -> None:
    """A policy decision was made (``decision`` is an `engine.Decision`); ``where`` names the
    caller, e.g. ``"engine"`` or ``"runner:decode"``. Results are ignored."""


@hookspec
def warpolicy_on_publish(runner: str, step: int, policy: Any, event: Any) -> None:
    """A fence published for one step: ``policy`` is the `WarReadDonePolicy` applied and
    ``event`` the handed-out event, or None when nothing was published (coarse)."""


@hookspec
def warpolicy_on_barrier(runner: str, step: Optional[int], kind: str, reason: str) -> None:
    """The scheduler barrier was applied: ``kind`` is ``"event"`` or ``"coarse"``, ``reason``
    says why (the policy label, ``"forced"``, ``"no read-done event"``, ``"hook failed"``)."""


@hookspec
def warpolicy_on_fallback(where: str, error: BaseException) -> None:
    """A runtime failure was absorbed by failing closed (coarse barrier, nothing published)."""
