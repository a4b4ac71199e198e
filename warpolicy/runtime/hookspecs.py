"""The ``warpolicy_*`` hook specifications.

Four kinds of hooks:

* **Fragment hook** (`warpolicy_capabilities`): every plugin's result is collected and
  merged by the registry's own rules (`warpolicy.runtime.manager.collect_fragments` sorts them by
  plugin name), never by pluggy call order.
* **Platform hook** (`warpolicy_platform`): asked once when a `warpolicy.runtime.platform.Platform` is
  built for a device. A plugin claims the device by returning an object implementing
  `warpolicy.runtime.platforms.PlatformImpl`; from then on its methods are called directly, with no
  plugin dispatch per operation. Exactly one plugin may claim a device type.
* **Observer hooks** (``warpolicy_on_*``, no result): see every decision, publish, barrier,
  fallback and capture-time demotion (every one, not only the first), for logging, metrics and
  tracing. With none registered the runtime pays nothing; each registered implementation is
  called directly (`warpolicy.runtime.observers`) with exactly the arguments pluggy would
  pass it, and through pluggy's own hook caller only while a wrapper wraps the hook or
  hook-call monitoring (tracing) is on. An observer that raises is reported (a warning and
  `warpolicy_on_fallback`) and never changes what is published or when the scheduler is
  released. Adding one is this module's hookspec plus its typed method on
  `warpolicy.runtime.observers.Reporter`: everything else is derived from the hookspec.

* **Per-batch action hook** (`warpolicy_batch_action`): performs a per-batch action (a snapshot,
  a staging copy) that the registry says can make one batch's release earlier. Its
  implementations are resolved once (with the observers' machinery) and called directly, only
  for the actions a captured cell names; results combine by a rule independent of call order.

Implementations may accept any subset of a hook's arguments (pluggy passes only the ones
they name), so new arguments can be added here without breaking plugins.
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from warpolicy.registry.vocabulary import ForwardMode, WarReadDonePolicy
from warpolicy.runtime.markers import PROJECT, hookimpl, hookspec

if TYPE_CHECKING:  # annotations only (no cycle: nothing below imports this module)
    from warpolicy.registry.decision import Decision
    from warpolicy.runtime.platforms import EventHandle, PlatformImpl

__all__ = [
    "ACTION_HOOKS",
    "DIRECT_HOOKS",
    "OBSERVER_HOOKS",
    "PROJECT",
    "REMOVED_PLATFORM_HOOKS",
    "hookimpl",
    "hookspec",
]

#: What `warpolicy_capabilities` may return: a file (``pathlib.Path``), YAML text (``str``),
#: an already-parsed mapping, or a list of these.
FragmentResult = (
    os.PathLike | str | Mapping[str, Any] | Sequence[os.PathLike | str | Mapping[str, Any]]
)

#: The 0.1 per-operation platform hooks. A plugin still implementing one is refused at
#: registration with an error naming `warpolicy_platform`.
REMOVED_PLATFORM_HOOKS = (
    "warpolicy_platform_name",
    "warpolicy_external_events_supported",
    "warpolicy_platform_log",
    "warpolicy_create_event",
    "warpolicy_record_event",
    "warpolicy_wait_event",
    "warpolicy_wait_stream",
    "warpolicy_is_capturing",
    "warpolicy_new_stream",
    "warpolicy_current_stream",
    "warpolicy_use_stream",
    "warpolicy_new_graph",
    "warpolicy_graph_pool",
    "warpolicy_capture",
    "warpolicy_capture_callable",
    "warpolicy_replay",
    "warpolicy_synchronize",
)

# -- registry fragments ------------------------------------------------------------------------


@hookspec
def warpolicy_capabilities() -> FragmentResult | None:
    """Contribute registry fragments: backends, spec algorithms, flags or gates.

    Fires when a registry is loaded with plugins (`PolicyEngine.load`, the CLI). Return a
    ``pathlib.Path`` naming a YAML file, a ``str`` of YAML *text* (a ``str`` is never taken as
    a file name), a mapping in the registry format, a list of these, or ``None``.

    Results combine: all are collected, ordered by plugin name (not call order) and merged
    after the core file by the registry's rules; an invalid fragment stops loading with an
    error naming the plugin.
    """


# -- platform ----------------------------------------------------------------------------------


@hookspec
def warpolicy_platform(device: str) -> PlatformImpl | None:
    """Claim a device: return a `warpolicy.runtime.platforms.PlatformImpl` for ``device``, or None.

    Fires once each time a `Platform` is built (`Platform.for_device`). ``device`` is a
    lower-case string such as ``"cuda:0"`` or ``"sim"``; read its type with
    `warpolicy.runtime.platforms.device_type`. Every plugin is asked; exactly one may claim a device
    type (two claims are a `PluginError` naming both plugins, whatever the registration
    order), and a device nobody claims is an unknown device type.

    :param device: the device asked for, normalised to a lower-case string
    """


# -- observers ---------------------------------------------------------------------------------


@hookspec
def warpolicy_on_decision(decision: Decision, where: str) -> None:
    """A policy decision was made; fires when a runner resolves a bucket's policy at capture.

    :param decision: the `warpolicy.registry.engine.Decision`, with every reason that moved it
    :param where: the caller, e.g. ``"engine"`` or ``"runner:decode"``
    """


@hookspec
def warpolicy_on_publish(
    runner: str, step: int, policy: WarReadDonePolicy, event: EventHandle | None
) -> None:
    """A fence published for one step; fires at the end of `ReadDoneFence.after_replay`.

    :param runner: the fence's (runner's) name
    :param step: the fence's step number
    :param policy: the policy really applied (``NONE`` when nothing was published)
    :param event: the handed-out event, or None (the scheduler goes coarse)
    """


@hookspec
def warpolicy_on_barrier(runner: str, step: int | None, kind: str, reason: str) -> None:
    """The scheduler barrier was applied; fires at the end of `SchedulerBarrier.apply`.

    :param runner: the publishing fence's name (the barrier's name when nothing was taken)
    :param step: the published step, or None when nothing was taken
    :param kind: ``"event"`` or ``"coarse"``
    :param reason: the policy label, ``"forced"``, ``"no read-done event"`` or ``"hook failed"``
    """


@hookspec
def warpolicy_on_fallback(where: str, error: BaseException) -> None:
    """A runtime failure was absorbed by failing closed; fires once per failure.

    :param where: the component and place, e.g. ``"fence 'decode':after_replay"``
    :param error: the exception absorbed
    """


@hookspec
def warpolicy_on_demotion(runner: str, bucket: int, reason: str) -> None:
    """A captured bucket was demoted at capture time (fires every time, once per bucket and
    capture): its marker failed the self-check, derived placement could not plant its node (it
    then publishes no earlier than ``post_replay``), or something raised or could not be
    confirmed (it then publishes nothing).

    :param runner: the runner's name
    :param bucket: the bucket's size
    :param reason: one line naming what failed (for a failed self-check: kernel, buffer, bucket)
    """


@hookspec
def warpolicy_on_violation(
    runner: str,
    backend: str,
    mode: ForwardMode,
    spec: str,
    bucket: int | None,
    step: int,
    detail: str,
) -> None:
    """The WAR canary caught an early release: a sampled step's overlapped output differed from
    the same graph replayed behind a full barrier. Fires once per violation, after the cell
    (backend, mode, spec, bucket) has been demoted to the coarse barrier for the rest of the
    process, so an observer that raises changes nothing.

    :param runner: the runner's name
    :param backend: the attention backend of the runner's policy (``""`` when the policy is a
        plain callable that does not name one)
    :param mode: the forward mode of the step
    :param spec: the speculative algorithm of the runner's policy (``""`` when unknown)
    :param bucket: the captured bucket, or None for an eager step
    :param step: the runner's step number of the sampled step
    :param detail: one line naming the first differing element (output name, index, expected,
        got)
    """


@hookspec
def warpolicy_on_release_lead(
    runner: str, mode: ForwardMode, bucket: int | None, step: int, lead_us: float
) -> None:
    """How long before the end of a forward the scheduler was released, measured on a sampled
    step from GPU timestamps (the overlap the barrier actually bought). Fires once per sampled
    step, after the step's timing events completed (never on the step path).

    :param runner: the runner's name
    :param mode: the forward mode of the step
    :param bucket: the captured bucket, or None for an eager step
    :param step: the runner's step number of the sampled step
    :param lead_us: microseconds from the scheduler's release to the forward's end (0 for a
        coarse barrier; negative values are clamped to 0)
    """


# -- per-batch actions -------------------------------------------------------------------------


@hookspec
def warpolicy_batch_action(
    action: str, runner: str, mode: ForwardMode, bucket: int | None, batch: object
) -> bool | None:
    """Perform the per-batch action ``action`` for this batch; return ``True`` once it is done.

    Fires once per batch and per action the batch's cell names (`CompiledPolicy.actions`:
    the ``type: action`` facts whose success can make this cell earlier, e.g.
    ``sparse_prefill_snapshot``, ``prefill_staged``, ``draft_extend_staged``), after the
    runner's ``host_prep`` and before anything of the step is published, on the host thread that
    runs the step with the forward stream current (work enqueued there precedes the release
    point). A cell with no actions never calls it.

    Return ``True`` only when the action is done (its copies enqueued on the forward stream),
    ``False`` when it was not, ``None`` when the action is not yours. Results combine
    independently of call order: the action succeeded only if at least one implementation
    returned exactly ``True`` and none returned anything else that is not ``None`` (``False``,
    ``1``, ``"yes"``) or raised. An ``Exception`` means not performed (reported to
    ``warpolicy_on_fallback``); a ``BaseException`` (``KeyboardInterrupt``) makes the step publish
    nothing (the coarse barrier), then propagates. An action that did not succeed gives that batch
    the later policy, never the earlier one.

    :param action: the action fact's name as the registry declares it
    :param runner: the runner's name
    :param mode: the runner's forward mode
    :param bucket: the captured bucket the step replays, or None for an eager step
    :param batch: the engine's batch, as given to ``runner.run``
    """


# -- derived: what the runtime calls directly ----------------------------------------------------


def _arguments(prefix: str) -> Mapping[str, tuple[str, ...]]:
    """Every hookspec above whose name starts with ``prefix``, in definition order, with its
    arguments in the order the runtime passes them (the hookspec's own)."""
    return {
        name: tuple(inspect.signature(spec).parameters)
        for name, spec in list(globals().items())
        if name.startswith(prefix) and inspect.isfunction(spec)
    }


#: The observer hooks (``warpolicy_on_*``), in the order of their arguments as the runtime
#: passes them.
OBSERVER_HOOKS: Mapping[str, tuple[str, ...]] = _arguments("warpolicy_on_")

#: The per-batch action hook, its arguments in the order the runtime passes them.
ACTION_HOOKS: Mapping[str, tuple[str, ...]] = _arguments("warpolicy_batch_action")

#: Every hook the runtime calls directly, per implementation (`warpolicy.runtime.observers`).
DIRECT_HOOKS: Mapping[str, tuple[str, ...]] = {**OBSERVER_HOOKS, **ACTION_HOOKS}
