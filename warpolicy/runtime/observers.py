"""Observers and the fail-closed reporter: the one way the runtime tells plugins what happened.

`Observers` holds, per observer hook (and for the per-batch action hook
``warpolicy_batch_action``, which `warpolicy.runtime.batch` calls with the same machinery),
what to call for each registered implementation: the implementation's own function called
with exactly the arguments the installed pluggy would pass it (``impl.argnames``, plus the
defaulted ``impl.kwargnames`` where that pluggy passes them: `pluggy_passes_defaults` asks
pluggy itself once), so one failing observer neither stops the others nor changes what the
runtime does, and a call costs a fraction of a microsecond. A hook with a wrapper
implementation, or any hook while pluggy's hook-call monitoring (tracing) is on, is called
once, whole, through pluggy's own `HookCaller`, so the wrapper or the monitor sees every call.
An empty tuple means nobody observes: callers skip the call entirely
(``if observers.on_publish:``).

The plugin manager keeps its `Observers` current on every registration change
(`warpolicy.runtime.manager.WarpolicyPluginManager`); the composition root builds it once and
passes it to runners, fences, barriers and overlap loops. `NO_OBSERVERS` observes nothing.

`Reporter` is the one warn-once helper: each runtime component (a runner, a fence, a barrier,
an overlap loop, a speculative step, the cross-rank check) owns one. It counts every event,
tells the observers about every event (every fallback reaches ``warpolicy_on_fallback``, every
demotion ``warpolicy_on_demotion``), and rate-limits only the Python warning: one per place.
Observers are told before the warning is issued, because under ``-W error`` the warning
raises; callers report only once the safe state (the coarse barrier) is in place.
"""

from __future__ import annotations

import collections
import functools
import warnings
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import attrs
import pluggy

from warpolicy.runtime.hookspecs import DIRECT_HOOKS

if TYPE_CHECKING:  # annotations only
    from warpolicy.registry.decision import Decision
    from warpolicy.registry.vocabulary import ForwardMode, WarReadDonePolicy
    from warpolicy.runtime.platforms import EventHandle


@attrs.frozen
class ObserverCall:
    """One observer implementation (or, with a wrapper or while monitored, the whole hook) and
    how to call it: ``call(*args)`` with the hook's arguments in `DIRECT_HOOKS` order."""

    #: the hook's name (``warpolicy_on_publish``)
    hook: str
    #: the plugin name, or the sorted names joined by commas for a whole-hook call
    plugin: str
    #: the implementation called as the installed pluggy calls it (see `pluggy_passes_defaults`),
    #: or pluggy's own `HookCaller` for a whole-hook call
    call: Callable[..., object] = attrs.field(repr=False)
    #: a whole-hook call (through pluggy): its result is the list of every implementation's
    whole: bool = False


_PROBE = "warpolicy_observer_probe"


@functools.cache
def pluggy_passes_defaults() -> bool:
    """Whether the installed pluggy passes an implementation the arguments it declares with a
    default (pluggy 1.7 does when the caller gives them; 1.5 did not).

    Asked of pluggy itself, once per process, through a throwaway manager and its public API,
    so the direct observer calls below receive exactly what ``pm.hook.<name>(**kwargs)`` would
    pass them under whichever pluggy is installed (CI runs 1.5 and the newest).
    """
    spec_marker = pluggy.HookspecMarker(_PROBE)
    impl_marker = pluggy.HookimplMarker(_PROBE)

    class Spec:
        @spec_marker
        def probe(self, given: object, defaulted: object) -> object:
            """Probe hook."""

    class Impl:
        @impl_marker
        def probe(self, given: object, defaulted: object = None) -> object:
            return defaulted

    pm = pluggy.PluginManager(_PROBE)
    pm.add_hookspecs(Spec)
    pm.register(Impl())
    return bool(pm.hook.probe(given=1, defaulted=2) == [2])


def _direct(impl: pluggy.HookImpl, spec: tuple[str, ...]) -> Callable[..., object]:
    """``impl.function`` called, from the hook's arguments in ``spec`` order, with the arguments
    pluggy passes it: its argument names without defaults positionally, and (where the installed
    pluggy does so) those with defaults by keyword. An implementation that names the spec's
    arguments in order is called as it is, with nothing in between."""
    function = impl.function
    names = tuple(impl.argnames)
    optional = tuple(impl.kwargnames) if pluggy_passes_defaults() else ()
    if names == spec and not optional:
        return function
    index = tuple(spec.index(name) for name in names)
    by_keyword = tuple((name, spec.index(name)) for name in optional if name in spec)

    def call(*args: Any) -> object:
        return function(*[args[i] for i in index], **{name: args[i] for name, i in by_keyword})

    return call


def _whole(caller: pluggy.HookCaller, spec: tuple[str, ...]) -> Callable[..., object]:
    """The whole hook through pluggy, from its arguments in ``spec`` order."""

    def call(*args: Any) -> object:
        return caller(**dict(zip(spec, args)))

    return call


def _calls(
    pm: pluggy.PluginManager, caller: pluggy.HookCaller, monitored: bool
) -> tuple[ObserverCall, ...]:
    """The calls for one hook, in pluggy's call order (last registered first, tryfirst /
    trylast honoured): one direct call per implementation; the whole hook through pluggy when a
    wrapper wraps the implementations or hook-call monitoring (tracing) is on, so the wrapper
    or the monitor sees every call."""
    impls = caller.get_hookimpls()
    if not impls:
        return ()
    spec = DIRECT_HOOKS[caller.name]
    if monitored or any(impl.hookwrapper or impl.wrapper for impl in impls):
        names = ",".join(sorted({impl.plugin_name for impl in impls}))
        return (ObserverCall(caller.name, names, _whole(caller, spec), whole=True),)
    # pluggy calls the implementations last-first
    return tuple(
        ObserverCall(caller.name, impl.plugin_name, _direct(impl, spec)) for impl in reversed(impls)
    )


def attribute(hook: str) -> str:
    """The `Observers` attribute of a directly called hook: its name without ``warpolicy_``
    (``warpolicy_on_publish`` -> ``on_publish``, ``warpolicy_batch_action`` -> ``batch_action``)."""
    return hook[len("warpolicy_") :]


#: Each directly called hook's `Observers` attribute, derived from the hookspecs.
ATTRIBUTES: Mapping[str, str] = {hook: attribute(hook) for hook in DIRECT_HOOKS}


class Observers:
    """The observer implementations of one plugin manager: per directly called hook (every
    hookspec in `DIRECT_HOOKS`), a tuple of calls under its `attribute` name
    (``observers.on_publish``, ``observers.batch_action``), empty when nobody observes it."""

    __slots__ = (*ATTRIBUTES.values(), "monitored", "_pm")

    if TYPE_CHECKING:  # the slots above, one per hook, each a tuple of calls

        def __getattr__(self, name: str) -> tuple[ObserverCall, ...]: ...

    def __init__(self, pm: pluggy.PluginManager | None = None) -> None:
        self._pm = pm
        #: hook-call monitors (tracing is one) active on the manager: observers then go
        #: through pluggy so the monitor sees them
        self.monitored = 0
        for name in ATTRIBUTES.values():
            setattr(self, name, ())
        self.refresh()

    def refresh(self) -> None:
        """Rebuild the calls from the plugin manager (it does so on every registration change)."""
        pm = self._pm
        if pm is None:
            return
        monitored = self.monitored > 0
        for hook, name in ATTRIBUTES.items():
            setattr(self, name, _calls(pm, getattr(pm.hook, hook), monitored))

    def __repr__(self) -> str:
        counts = {hook: len(getattr(self, name)) for hook, name in ATTRIBUTES.items()}
        return f"Observers({counts})"


#: Observes nothing (the default of every runtime component built without observers).
NO_OBSERVERS = Observers()


class Reporter:
    """Fail-closed bookkeeping for one component (``who``, e.g. ``"fence 'decode'"``): every
    event counted and reported to the observers, one Python warning per place."""

    __slots__ = ("counts", "observers", "who", "_warned")

    def __init__(self, observers: Observers, who: str) -> None:
        self.observers = observers
        self.who = who
        #: every event by key (``"fallback:<where>"``, ``"demotion:<bucket>"``, ``"warning:<key>"``,
        #: ``"observer:<hook>:<plugin>"``): counted even when the warning is not repeated
        self.counts: collections.Counter[str] = collections.Counter()
        self._warned: set[str] = set()

    # -- warnings ---------------------------------------------------------------------------------

    def warn(self, key: str, message: str) -> None:
        """Count the event; warn ``"warpolicy <who>: <message>"`` the first time ``key`` occurs."""
        self.counts[f"warning:{key}"] += 1
        self._warn_once(key, message)

    def _warn_once(self, key: str, message: str) -> None:
        if key in self._warned:
            return
        self._warned.add(key)
        warnings.warn(f"warpolicy {self.who}: {message}", RuntimeWarning, stacklevel=4)

    # -- events observers see -----------------------------------------------------------------------

    def fallback(self, where: str, error: BaseException, message: str | None = None) -> None:
        """A failure absorbed by failing closed: ``warpolicy_on_fallback`` every time, one
        warning per ``where``. Call it once the safe state is in place."""
        self.counts[f"fallback:{where}"] += 1
        self._notify(self.observers.on_fallback, f"{self.who}:{where}", error)
        self._warn_once(
            f"fallback:{where}",
            message or f"{where} failed ({error!r}); falling back to the coarse barrier",
        )

    def demotion(self, runner: str, bucket: int, reason: str) -> None:
        """A bucket published later than asked: ``warpolicy_on_demotion`` every time, one
        warning per bucket."""
        self.counts[f"demotion:{bucket}"] += 1
        self._notify(self.observers.on_demotion, runner, bucket, reason)
        self._warn_once(f"demotion:{bucket}", reason)

    def decision(self, decision: Decision, where: str) -> None:
        """``warpolicy_on_decision``."""
        self._notify(self.observers.on_decision, decision, where)

    def publish(
        self, runner: str, step: int, policy: WarReadDonePolicy, event: EventHandle | None
    ) -> None:
        """``warpolicy_on_publish``."""
        self._notify(self.observers.on_publish, runner, step, policy, event)

    def barrier(self, runner: str, step: int | None, kind: str, reason: str) -> None:
        """``warpolicy_on_barrier``."""
        self._notify(self.observers.on_barrier, runner, step, kind, reason)

    def violation(
        self,
        runner: str,
        backend: str,
        mode: ForwardMode,
        spec: str,
        bucket: int | None,
        step: int,
        detail: str,
    ) -> None:
        """The canary caught an early release: counted, ``warpolicy_on_violation`` every time
        (the caller logs its own line and demotes the cell first)."""
        self.counts[f"violation:{bucket}"] += 1
        self._notify(self.observers.on_violation, runner, backend, mode, spec, bucket, step, detail)

    def release_lead(
        self, runner: str, mode: ForwardMode, bucket: int | None, step: int, lead_us: float
    ) -> None:
        """``warpolicy_on_release_lead``."""
        self._notify(self.observers.on_release_lead, runner, mode, bucket, step, lead_us)

    # -- calling -------------------------------------------------------------------------------------

    def _notify(self, calls: tuple[ObserverCall, ...], *args: Any) -> None:
        """Call every observer of one hook with its arguments in hookspec order; one that
        raises is reported and never stops the others."""
        for call in calls:
            try:
                call.call(*args)
            except Exception as exc:  # noqa: BLE001 - an observer never changes what happens
                self._observer_failed(call.hook, call.plugin, exc)

    def _observer_failed(self, hook: str, plugin: str, error: Exception) -> None:
        """Warn once per (hook, plugin); tell the fallback observers (unless the failing hook is
        the fallback hook itself: a failing fallback observer is only warned about)."""
        self.counts[f"observer:{hook}:{plugin}"] += 1
        if hook != "warpolicy_on_fallback":
            for call in self.observers.on_fallback:
                try:
                    call.call(f"{self.who}:{hook}:{plugin}", error)
                except Exception as exc:  # noqa: BLE001 - reported below, never re-raised
                    self._observer_failed("warpolicy_on_fallback", call.plugin, exc)
        self._warn_once(
            f"observer:{hook}:{plugin}",
            f"observer plugin {plugin!r} raised in {hook} ({error!r}); ignored",
        )
