"""`Platform`: a small facade over the ``warpolicy_*`` platform hooks for one device.

Runners, the fence and the audit talk to streams, events and graphs only through this
facade, so the same code runs on CUDA (`warpolicy.cuda`) and on the recording fake
(`warpolicy.testing.fake`). Hook callers are looked up once here; each call is one pluggy
dispatch with no per-call allocation beyond the keyword arguments.
"""

from __future__ import annotations

import logging
from typing import Any, Callable, ContextManager, Optional

import pluggy

from warpolicy.errors import CudaUnavailableError, UnknownNameError

log = logging.getLogger("warpolicy")

try:  # pluggy's default dispatcher; our fast path applies only while it is in use
    from pluggy._callers import _multicall as _PLUGGY_MULTICALL
except ImportError:  # pragma: no cover - another pluggy layout: always use pluggy itself
    _PLUGGY_MULTICALL = None

_ANNOUNCED: set[tuple[str, str, bool]] = set()  # (platform, device, external) already logged


def device_type(device: Any) -> str:
    """The type part of a device: ``torch.device("cuda:0")`` and ``"cuda:0"`` give ``"cuda"``."""
    kind = getattr(device, "type", None)
    if isinstance(kind, str):
        return kind
    return str(device).split(":", 1)[0].strip().lower()


def _torch_or_none() -> Any:
    try:
        import torch
    except ImportError:  # the core installs without torch; the fake platform needs none
        return None
    return torch


def cuda_available() -> bool:
    torch = _torch_or_none()
    return bool(torch is not None and torch.cuda.is_available())


def _normalize_device(device: Any) -> Any:
    """None -> CUDA if available else ``"fake"``; strings torch knows become ``torch.device``."""
    if device is None:
        return _normalize_device("cuda") if cuda_available() else "fake"
    torch = _torch_or_none()
    if isinstance(device, str) and torch is not None:
        try:
            return torch.device(device)
        except (RuntimeError, ValueError):
            return device.strip().lower()  # not a torch device type, e.g. "fake"
    return device


class FirstResultCaller:
    """Calls one ``firstresult`` hook with positional arguments, exactly as pluggy would
    (implementations in pluggy's order, the first non-None result wins, exceptions propagate),
    without pluggy's generic per-call work (keyword dict, argument checks, wrapper machinery).

    It reads two pluggy internals (``PluginManager._inner_hookexec`` and
    ``pluggy._callers._multicall``) and the public `HookImpl` attributes, so it is used only
    while that is provably equivalent: pluggy's default dispatcher in place (no
    ``WARPOLICY_TRACE_HOOKS`` tracing, no call monitoring), a ``firstresult`` spec and no hook
    wrappers. Anything else, including a pluggy whose layout it does not recognise, calls the
    pluggy hook itself. Registrations are re-read on every call (a cheap list compare), so
    plugins registered or unregistered later are honoured.
    """

    __slots__ = ("_pm", "_caller", "_argnames", "_state")

    def __init__(self, pm: pluggy.PluginManager, name: str, argnames: tuple[str, ...]) -> None:
        self._pm = pm
        self._caller = getattr(pm.hook, name)
        self._argnames = argnames
        # (hook impls the plan was built from, plan or None = call pluggy); one attribute so a
        # concurrent rebuild never pairs one registration list with another's plan.
        self._state: tuple[Optional[list], Optional[list]] = (None, None)

    def _plan_for(self, impls: list) -> Optional[list]:
        """[(function, argument indices or None)] in pluggy's call order, or None when the fast
        path would not be equivalent (or this pluggy's layout is not the one we know)."""
        try:
            spec = self._caller.spec
            if spec is None or not spec.opts.get("firstresult"):
                return None
            plan = []
            for impl in reversed(impls):  # pluggy calls the last registered (non-trylast) first
                if impl.hookwrapper or impl.wrapper:
                    return None
                names = tuple(impl.argnames)
                if names == self._argnames:
                    plan.append((impl.function, None))
                else:
                    plan.append((impl.function, tuple(self._argnames.index(a) for a in names)))
            return plan
        except Exception:  # noqa: BLE001 - unknown pluggy internals: plain pluggy is always right
            return None

    @property
    def fast(self) -> bool:
        """Whether the next call takes the fast path (for tests and diagnostics)."""
        impls = self._caller.get_hookimpls()
        if impls != self._state[0]:
            self._state = (impls, self._plan_for(impls))
        return self._state[1] is not None and _PLUGGY_MULTICALL is not None and \
            getattr(self._pm, "_inner_hookexec", None) is _PLUGGY_MULTICALL

    def __call__(self, *args: Any) -> Any:
        impls = self._caller.get_hookimpls()
        state = self._state
        if impls != state[0]:
            state = self._state = (impls, self._plan_for(impls))
        plan = state[1]
        if plan is None or _PLUGGY_MULTICALL is None or \
                getattr(self._pm, "_inner_hookexec", None) is not _PLUGGY_MULTICALL:
            return self._caller(**dict(zip(self._argnames, args)))
        for function, index in plan:
            result = function(*args) if index is None else function(*[args[i] for i in index])
            if result is not None:
                return result
        return None


class Platform:
    """Streams, events and graphs of one device, delegated to the first plugin that handles it.

    Build it with `Platform.for_device`. Every method raises ``NotImplementedError`` when no
    plugin implements that operation for the device (the fence turns that into fail-closed).
    """

    def __init__(self, device: Any, pm: pluggy.PluginManager, name: str) -> None:
        self.device = device
        self.pm = pm
        self._name = name
        self._external: Optional[bool] = None
        # Per-step hooks get a cached first-result caller (see `FirstResultCaller`).
        self._h_record = FirstResultCaller(pm, "warpolicy_record_event", ("device", "event", "stream"))
        self._h_wait_event = FirstResultCaller(pm, "warpolicy_wait_event", ("device", "stream", "event"))
        self._h_wait_stream = FirstResultCaller(pm, "warpolicy_wait_stream", ("device", "stream", "other"))
        self._h_is_capturing = FirstResultCaller(pm, "warpolicy_is_capturing", ("device",))
        self._h_replay = FirstResultCaller(pm, "warpolicy_replay", ("device", "graph"))
        self._h_current_stream = FirstResultCaller(pm, "warpolicy_current_stream", ("device",))

    # -- construction ---------------------------------------------------------------------------

    @classmethod
    def for_device(cls, device: Any = None, pm: Optional[pluggy.PluginManager] = None) -> "Platform":
        """The platform for ``device`` (``torch.device``, ``"cuda"``, ``"cuda:0"``, ``"fake"``,
        or None = CUDA if available, else the fake).

        Raises `CudaUnavailableError` when CUDA is asked for and not available, and
        `UnknownNameError` when no plugin handles the device type.
        """
        if pm is None:
            from warpolicy.plugins import get_plugin_manager  # late: plugins imports platform
            pm = get_plugin_manager()
        dev = _normalize_device(device)
        kind = device_type(dev)
        if kind == "cuda" and not cuda_available():
            raise CudaUnavailableError(
                f"device {str(device or 'cuda')!r} needs CUDA, but torch.cuda.is_available() is False")
        name = pm.hook.warpolicy_platform_name(device=dev)
        if name is None:
            raise UnknownNameError("device type", kind, ["cuda", "cpu", "fake"])
        platform = cls(dev, pm, str(name))
        platform._announce()
        return platform

    def _announce(self) -> None:
        """Log once per process which read-done fast path is active on this platform."""
        external = self.external_events_supported()
        key = (self._name, str(self.device), external)
        if key in _ANNOUNCED:
            return
        _ANNOUNCED.add(key)
        if self._name == "cuda":
            torch = _torch_or_none()
            version = getattr(torch, "__version__", "?")
            if external:
                log.info("warpolicy: CUDA external events available (torch %s): "
                         "in-graph read-done enabled", version)
            else:
                log.info("warpolicy: CUDA external events unavailable (torch %s has no "
                         "torch.cuda.Event(external=...)): in-graph read-done disabled, "
                         "in_graph demotes to post_replay", version)
        else:
            state = "simulated" if external else "disabled"
            log.info("warpolicy: platform %r on device %s: in-graph read-done %s",
                     self._name, self.device, state)

    def __repr__(self) -> str:
        return f"Platform(name={self._name!r}, device={self.device!r})"

    # -- identity -------------------------------------------------------------------------------

    @property
    def name(self) -> str:
        """The platform's name, e.g. ``"cuda"`` or ``"fake"``."""
        return self._name

    def external_events_supported(self) -> bool:
        """Whether a record during capture becomes an in-graph node (cached)."""
        if self._external is None:
            result = self.pm.hook.warpolicy_external_events_supported(device=self.device)
            self._external = bool(result)
        return self._external

    @property
    def log(self) -> list:
        """The call log of a recording platform (the fake); raises on real platforms."""
        result = self.pm.hook.warpolicy_platform_log(device=self.device)
        if result is None:
            raise NotImplementedError(f"platform {self._name!r} does not record calls")
        return result

    # -- events ---------------------------------------------------------------------------------

    def create_event(self, external: bool = False) -> Any:
        """A new event; ``external=True`` for the persistent event planted in graphs."""
        event = self.pm.hook.warpolicy_create_event(device=self.device, external=external)
        return self._handled(event, "create_event")

    def record(self, event: Any, stream: Any = None) -> None:
        """Record ``event`` on ``stream`` (None = the current stream, required for a plant)."""
        if self._h_record(self.device, event, stream) is None:
            self._unhandled("record")

    def wait_event(self, stream: Any, event: Any) -> None:
        """``stream`` waits for ``event``."""
        if self._h_wait_event(self.device, stream, event) is None:
            self._unhandled("wait_event")

    def wait_stream(self, stream: Any, other: Any) -> None:
        """Coarse: ``stream`` waits for all work queued so far on ``other``."""
        if self._h_wait_stream(self.device, stream, other) is None:
            self._unhandled("wait_stream")

    # -- streams --------------------------------------------------------------------------------

    def is_capturing(self) -> bool:
        """Whether the current stream is capturing a graph."""
        return bool(self._h_is_capturing(self.device))

    def new_stream(self) -> Any:
        return self._handled(self.pm.hook.warpolicy_new_stream(device=self.device), "new_stream")

    def current_stream(self) -> Any:
        return self._handled(self._h_current_stream(self.device), "current_stream")

    def stream(self, stream: Any) -> ContextManager[Any]:
        """Context manager making ``stream`` current."""
        cm = self.pm.hook.warpolicy_use_stream(device=self.device, stream=stream)
        return self._handled(cm, "stream")

    # -- graphs ---------------------------------------------------------------------------------

    def new_graph(self, keep_graph: bool = False) -> Any:
        """An empty graph; ``keep_graph=True`` keeps the raw graph (static audit)."""
        graph = self.pm.hook.warpolicy_new_graph(device=self.device, keep_graph=keep_graph)
        return self._handled(graph, "new_graph")

    def graph_pool(self) -> Any:
        """A memory-pool handle several graphs can share (pass as ``pool=``)."""
        return self._handled(self.pm.hook.warpolicy_graph_pool(device=self.device), "graph_pool")

    def capture(self, graph: Any, stream: Any = None, pool: Any = None) -> ContextManager[Any]:
        """Context manager capturing its block into ``graph``."""
        cm = self.pm.hook.warpolicy_capture(device=self.device, graph=graph, stream=stream, pool=pool)
        return self._handled(cm, "capture")

    def capture_callable(self, graph: Any, fn: Callable[[], Any], stream: Any = None,
                         pool: Any = None) -> None:
        """Capture ``fn()`` into ``graph``. On the fake, each replay runs ``fn`` again.

        Falls back to ``with capture(graph): fn()`` when no plugin implements the callable form.
        """
        handled = self.pm.hook.warpolicy_capture_callable(
            device=self.device, graph=graph, fn=fn, stream=stream, pool=pool)
        if handled is None:
            with self.capture(graph, stream=stream, pool=pool):
                fn()

    def replay(self, graph: Any) -> None:
        """Enqueue a replay of ``graph`` on the current stream."""
        if self._h_replay(self.device, graph) is None:
            self._unhandled("replay")

    def synchronize(self) -> None:
        """Block the host until the device is idle."""
        if self.pm.hook.warpolicy_synchronize(device=self.device) is None:
            self._unhandled("synchronize")

    # -- helpers --------------------------------------------------------------------------------

    def _handled(self, result: Any, op: str) -> Any:
        if result is None:
            self._unhandled(op)
        return result

    def _unhandled(self, op: str) -> None:
        raise NotImplementedError(
            f"no warpolicy plugin implements {op!r} for device {self.device!r} (platform {self._name!r})")
