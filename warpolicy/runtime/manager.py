"""The composition root: the plugin manager, the platform and the observers, built once.

`open_runtime` is where an engine (or the CLI, or a benchmark) builds everything the runtime
needs, once, and passes it down::

    rt = open_runtime("cuda")            # Runtime(pm, platform, observers)
    runner = DecodeRunner(model, policy, rt.platform, observers=rt.observers)

Nothing below this module looks a manager up: the platform facade carries none, and runners,
fences, barriers and overlap loops receive their `Observers`.

The manager (`new_plugin_manager`): built-ins are ordinary plugins registered by name:
``"cuda"`` (`warpolicy.runtime.platforms.cuda`) and ``"sim"`` (a
`warpolicy.runtime.platforms.sim.SimPlugin`); third-party plugins come from the entry-point
group ``warpolicy``; the entry point's name is the plugin name. The platform claim
(`claim_platform`, `open_platform`) asks ``warpolicy_platform`` once through pluggy and checks the
answer's types; fragments (`collect_fragments`) are the registry's input.

Environment:

* ``WARPOLICY_DISABLE_PLUGINS=a,b``: block these plugin names (built-ins too); a blocked
  entry point is not even imported, so this is how to get past a broken plugin.
* ``WARPOLICY_TRACE_HOOKS=1``: trace every hook call to stderr.
"""

from __future__ import annotations

import importlib.metadata
import logging
import sys
import threading
import types
from collections.abc import Callable, Mapping, Sequence
from typing import Any, cast

import attrs
import pluggy

from warpolicy import __version__, environment
from warpolicy.errors import CudaUnavailableError, PluginError, Problem, UnknownNameError
from warpolicy.registry.inputs import env_switch, parse_bool
from warpolicy.registry.loader import Fragment, FragmentError, fragment_plugin, plugin_fragments
from warpolicy.runtime import hookspecs
from warpolicy.runtime.markers import PROJECT
from warpolicy.runtime.nvtx import nvtx_plugin_if_enabled
from warpolicy.runtime.observers import Observers
from warpolicy.runtime.platforms import (
    Platform,
    PlatformImpl,
    cuda,
    cuda_available,
    device_type,
    implementation_problems,
)
from warpolicy.runtime.platforms.sim import SimPlugin

log = logging.getLogger("warpolicy")

GROUP = "warpolicy"


@attrs.frozen
class PluginSource:
    """Where a plugin came from, for `describe_plugins` and error messages."""

    source: str  # "builtin" or "distribution:<dist>"
    version: str
    entry_point: str | None = None  # "warpolicy:name = value"


class WarpolicyPluginManager(pluggy.PluginManager):
    """A pluggy manager that remembers where each plugin came from, refuses plugins written
    against the removed 0.1 platform hooks, and keeps its `observers` current."""

    def __init__(self) -> None:
        super().__init__(PROJECT)
        self.sources: dict[str, PluginSource] = {}
        super().add_hookspecs(hookspecs)
        #: the observer calls of this manager, refreshed on every registration change
        self.observers = Observers(self)

    def register(self, plugin: object, name: str | None = None) -> str | None:
        plugin_name = name or self.get_canonical_name(plugin)
        if not self.is_blocked(plugin_name):
            for hook in hookspecs.REMOVED_PLATFORM_HOOKS:
                # hasattr first: older pluggy releases' parse_hookimpl_opts assumes the name
                # exists on the plugin
                if hasattr(plugin, hook) and self.parse_hookimpl_opts(plugin, hook) is not None:
                    raise PluginError(
                        plugin_name,
                        f"implements {hook}, a 0.1 platform hook removed "
                        "in 0.2; implement warpolicy_platform(device) returning a "
                        "PlatformImpl instead (CHANGELOG: Migrating from 0.1)",
                    )
        registered = super().register(plugin, name)
        self.observers.refresh()
        return registered

    def unregister(self, plugin: object | None = None, name: str | None = None) -> Any:
        removed = super().unregister(plugin, name)
        self.observers.refresh()
        return removed

    def add_hookspecs(self, module_or_class: types.ModuleType | type) -> None:
        super().add_hookspecs(module_or_class)
        self.observers.refresh()

    def add_hookcall_monitoring(self, before: Any, after: Any) -> Callable[[], None]:
        """pluggy's monitoring (tracing uses it too); while any is on, observers are called
        through pluggy so the monitor sees them."""
        undo_monitoring = super().add_hookcall_monitoring(before, after)
        self.observers.monitored += 1
        self.observers.refresh()

        def undo() -> None:
            undo_monitoring()
            self.observers.monitored -= 1
            self.observers.refresh()

        return undo


def observers_of(pm: pluggy.PluginManager) -> Observers:
    """The manager's observers (the runtime needs a `WarpolicyPluginManager`, which keeps them
    current on every registration change)."""
    if not isinstance(pm, WarpolicyPluginManager):
        raise TypeError(
            "the warpolicy runtime needs a plugin manager from "
            "warpolicy.runtime.manager.new_plugin_manager, not a bare pluggy.PluginManager"
        )
    return pm.observers


def _builtin_version() -> str:
    return __version__


def _disabled(environ: Mapping[str, str]) -> list[str]:
    raw = environment.DISABLE_PLUGINS.get(environ)
    return [name.strip() for name in raw.split(",") if name.strip()]


def autoload_disabled(environ: Mapping[str, str] | None = None) -> bool:
    """``WARPOLICY_DISABLE_PLUGIN_AUTOLOAD`` says no entry-point plugin loads (as pytest's
    ``PYTEST_DISABLE_PLUGIN_AUTOLOAD``). Unset or blank: autoload. A value that is not a
    boolean is an `InputError` naming the variable: which plugins run is not guessed."""
    raw = environment.DISABLE_PLUGIN_AUTOLOAD.get(environ)
    return bool(raw.strip()) and parse_bool(raw, environment.DISABLE_PLUGIN_AUTOLOAD.name)


def new_plugin_manager(
    *, load_entry_points: bool = True, environ: Mapping[str, str] = environment.PROCESS
) -> WarpolicyPluginManager:
    """A fresh manager: hookspecs, built-ins, then (optionally) the ``warpolicy`` entry points.

    Entry points load when ``load_entry_points`` is true and ``WARPOLICY_DISABLE_PLUGIN_AUTOLOAD``
    in ``environ`` does not say otherwise (`autoload_disabled`). Raises `PluginError` naming the
    plugin and its entry point when one fails to import or register; the message says how to
    disable it.
    """
    load_entry_points = load_entry_points and not autoload_disabled(environ)
    pm = WarpolicyPluginManager()
    for name in _disabled(environ):
        pm.set_blocked(name)
    if env_switch(environ, environment.TRACE_HOOKS):
        pm.trace.root.setwriter(sys.stderr.write)
        pm.enable_tracing()
    _register_builtins(pm)
    nvtx = nvtx_plugin_if_enabled(environ)  # WARPOLICY_NVTX: Nsight ranges, off by default
    if nvtx is not None:
        pm.sources["nvtx"] = PluginSource("builtin", _builtin_version())
        pm.register(nvtx, name="nvtx")
    if load_entry_points:
        load_entry_point_plugins(pm)
    _check_pending(pm)
    return pm


def _register_builtins(pm: WarpolicyPluginManager) -> None:
    version = _builtin_version()
    for name, plugin in (("cuda", cuda), ("sim", SimPlugin())):
        pm.sources[name] = PluginSource("builtin", version)  # also when blocked: describe shows it
        pm.register(plugin, name=name)


def _entry_points() -> list[tuple[importlib.metadata.EntryPoint, str, str]]:
    """(entry point, distribution name, version) of group ``warpolicy``, one per name
    (the first distribution on sys.path wins, as imports do)."""
    found: dict[str, tuple[importlib.metadata.EntryPoint, str, str]] = {}
    for dist in importlib.metadata.distributions():
        try:
            eps = [ep for ep in dist.entry_points if ep.group == GROUP]
            if not eps:
                continue
            dist_name, version = dist.metadata["Name"] or "?", dist.version or "?"
        except Exception as exc:  # noqa: BLE001 - any installed distribution, not only ours
            # Broken metadata (unparseable entry_points.txt, non-UTF-8 METADATA) breaks that
            # distribution for every consumer; it must not stop warpolicy: one line, skip it.
            where = getattr(dist, "_path", None) or "a distribution"
            log.warning(
                "warpolicy: skipping %s: unreadable metadata (%s: %s)",
                where,
                type(exc).__name__,
                _one_line(str(exc)),
            )
            continue
        for ep in eps:
            if ep.name not in found:
                found[ep.name] = (ep, dist_name, version)
    return [found[name] for name in sorted(found)]


def _one_line(text: str) -> str:
    """Error text on one line (pluggy's validation messages span several)."""
    return " ".join(str(text).split())


def _ep_text(ep: importlib.metadata.EntryPoint) -> str:
    return f"{ep.group}:{ep.name} = {ep.value}"


def load_entry_point_plugins(pm: WarpolicyPluginManager) -> list[str]:
    """Import and register every ``warpolicy`` entry point that is not blocked.

    Returns the names registered. Blocked ones are recorded (for `describe_plugins`) but never
    imported.
    """
    loaded: list[str] = []
    for ep, dist_name, version in _entry_points():
        source = PluginSource(f"distribution:{dist_name}", version, _ep_text(ep))
        if pm.is_blocked(ep.name):
            pm.sources.setdefault(ep.name, source)
            continue
        if ep.name in pm.sources:
            raise PluginError(
                ep.name,
                f"its name clashes with the {pm.sources[ep.name].source} plugin "
                f"{ep.name!r}; rename the entry point",
                entry_point=_ep_text(ep),
            )
        try:
            plugin = ep.load()
        except KeyboardInterrupt:
            raise  # the operator's Ctrl-C, not the plugin's failure
        except BaseException as exc:  # GeneratorExit, a custom BaseException too: broken plugin
            raise PluginError(
                ep.name,
                _one_line(f"failed to import: {type(exc).__name__}: {exc}"),
                entry_point=_ep_text(ep),
            ) from exc
        try:
            pm.register(plugin, name=ep.name)
        except PluginError as exc:
            raise PluginError(ep.name, exc.message, entry_point=_ep_text(ep)) from exc
        except pluggy.PluginValidationError as exc:
            raise PluginError(
                ep.name, _one_line(f"invalid hook implementation: {exc}"), entry_point=_ep_text(ep)
            ) from exc
        except ValueError as exc:  # e.g. two entry points naming the same module
            other = pm.get_name(plugin)
            why = (
                f"it is the same object as the already registered plugin {other!r}"
                if other is not None
                else str(exc)
            )
            raise PluginError(
                ep.name, _one_line(f"cannot be registered: {why}"), entry_point=_ep_text(ep)
            ) from exc
        pm.sources[ep.name] = source
        loaded.append(ep.name)
    return loaded


def _check_pending(pm: WarpolicyPluginManager) -> None:
    """A ``warpolicy_*`` implementation with no matching spec is a typo: report it."""
    try:
        pm.check_pending()
    except pluggy.PluginValidationError as exc:
        name = pm.get_name(exc.plugin) or repr(exc.plugin)
        source = _source_of(pm, name)
        raise PluginError(
            name, _one_line(f"unknown hook: {exc}"), entry_point=source.entry_point
        ) from exc


_DEFAULT: WarpolicyPluginManager | None = None
_DEFAULT_AUTOLOAD = True  # what _DEFAULT was built with
_LOCK = threading.Lock()


def get_plugin_manager(*, load_entry_points: bool = True) -> WarpolicyPluginManager:
    """The CLI's process-wide manager (built on first use from the process environment;
    ``load_entry_points`` False, as ``warpolicy --disable-plugin-autoload`` asks, builds one
    without the entry-point plugins in place of a manager that has them).

    The runtime never looks it up: runners, fences and platforms receive what they need from
    the composition root (`open_runtime`)."""
    global _DEFAULT, _DEFAULT_AUTOLOAD
    with _LOCK:
        if _DEFAULT is None or load_entry_points != _DEFAULT_AUTOLOAD:
            _DEFAULT = new_plugin_manager(load_entry_points=load_entry_points)
            _DEFAULT_AUTOLOAD = load_entry_points
        return _DEFAULT


def reset_plugin_manager() -> None:
    """Forget the process-wide manager (tests, or after installing a plugin)."""
    global _DEFAULT
    with _LOCK:
        _DEFAULT = None


# -- platform claim --------------------------------------------------------------------------


def claim_platform(pm: pluggy.PluginManager, device: str) -> tuple[str, PlatformImpl] | None:
    """Ask every plugin's `warpolicy_platform` for ``device`` once; (plugin name, impl) of the
    one claim, or None when nobody claims it.

    Each plugin is called through pluggy's own `HookCaller` (narrowed to that plugin), so it
    receives its arguments exactly as ``pm.hook.warpolicy_platform(device=...)`` passes them.
    Two claims are a `PluginError` naming both plugins (sorted, so never pluggy call order); a
    plugin that raises, or returns something that is not a platform implementation (checked
    by type: `warpolicy.runtime.platforms.implementation_problems`), is a `PluginError` naming it.
    """
    caller = pm.hook.warpolicy_platform
    impls = [i for i in caller.get_hookimpls() if not (i.hookwrapper or i.wrapper)]
    plugins = [impl.plugin for impl in caller.get_hookimpls()]
    claims: list[tuple[str, PlatformImpl]] = []
    for impl in reversed(impls):  # pluggy's call order
        name = impl.plugin_name
        only = pm.subset_hook_caller(caller.name, [p for p in plugins if p is not impl.plugin])
        try:
            results = only(device=device)
        except Exception as exc:
            raise _plugin_error(
                pm, name, f"warpolicy_platform({device!r}) raised {type(exc).__name__}: {exc}"
            ) from exc
        for result in results:
            problems = implementation_problems(result)
            if problems:
                raise _plugin_error(
                    pm,
                    name,
                    f"warpolicy_platform({device!r}) returned a {type(result).__name__} that "
                    f"is not a platform implementation: {'; '.join(problems)}",
                )
            claims.append((name, cast(PlatformImpl, result)))
    if len(claims) > 1:
        first, second = sorted(name for name, _ in claims)[:2]
        raise _plugin_error(
            pm,
            first,
            f"claims device {device!r}, and so does plugin {second!r}; "
            "exactly one plugin may claim a device type",
        )
    return claims[0] if claims else None


def normalize_device(device: Any) -> str:
    """None -> ``"cuda"`` when CUDA is available, else ``"sim"``; anything else its lower-case
    string (``torch.device("cuda", 0)`` -> ``"cuda:0"``)."""
    if device is None:
        return "cuda" if cuda_available() else "sim"
    return str(device).strip().lower()


def open_platform(pm: pluggy.PluginManager, device: Any = None) -> Platform:
    """The platform for ``device`` (``torch.device``, ``"cuda"``, ``"cuda:0"``, ``"sim"``, or
    None = CUDA if available, else the simulated platform), claimed once through ``pm``.

    Raises `CudaUnavailableError` when CUDA is asked for and not available,
    `UnknownNameError` when no plugin claims the device type, and `PluginError` when two do or
    the claim is not a platform implementation.
    """
    wanted = normalize_device(device)
    kind = device_type(wanted)
    if kind == "cuda" and not cuda_available():
        raise CudaUnavailableError(
            f"device {wanted!r} needs CUDA, but torch.cuda.is_available() is False"
        )
    claim = claim_platform(pm, wanted)
    if claim is None:
        raise UnknownNameError("device type", kind, ["cuda", "sim"])
    platform = Platform(claim[1])
    platform.announce()
    return platform


@attrs.frozen
class Runtime:
    """What the composition root builds once and passes down."""

    pm: WarpolicyPluginManager
    platform: Platform
    observers: Observers


def open_runtime(
    device: Any = None,
    *,
    pm: WarpolicyPluginManager | None = None,
    load_entry_points: bool = True,
    environ: Mapping[str, str] = environment.PROCESS,
) -> Runtime:
    """Build the plugin manager (unless given), the platform for ``device`` and the observers,
    once. ``load_entry_points`` and ``environ`` are `new_plugin_manager`'s."""
    if pm is None:
        pm = new_plugin_manager(load_entry_points=load_entry_points, environ=environ)
    return Runtime(pm, open_platform(pm, device), pm.observers)


# -- fragments ---------------------------------------------------------------------------------


def collect_fragments(pm: pluggy.PluginManager) -> list[Fragment]:
    """Every plugin's `warpolicy_capabilities` result as `warpolicy.registry.loader.Fragment` objects,
    ordered by plugin name (never pluggy call order), read and composed once by the loader.

    Unreadable files, YAML that does not compose, wrong result types and exceptions raise
    `PluginError` naming the plugin and its entry point. Problems in a fragment's content are
    the loader's (located at ``plugin:<name>``; `blame_plugins` adds the entry point).
    """
    impls = pm.hook.warpolicy_capabilities.get_hookimpls()
    fragments: list[Fragment] = []
    for impl in sorted(impls, key=lambda i: i.plugin_name):
        if impl.hookwrapper or impl.wrapper:  # wraps the others' calls; contributes nothing itself
            continue
        name = impl.plugin_name
        try:
            result = impl.function()
        except Exception as exc:
            raise _plugin_error(
                pm, name, f"warpolicy_capabilities raised {type(exc).__name__}: {exc}"
            ) from exc
        try:
            fragments.extend(plugin_fragments(name, result))
        except FragmentError as exc:
            raise _plugin_error(pm, name, exc.message) from exc
    return fragments


def blame_plugins(pm: pluggy.PluginManager, problems: Sequence[Problem]) -> list[Problem]:
    """Registry problems located in a plugin fragment also name its entry point and how to
    disable it, so a broken plugin's fragment reads like any other broken plugin."""
    out = []
    for problem in problems:
        name = fragment_plugin(problem.file)
        if name is None:
            out.append(problem)
            continue
        err = _plugin_error(pm, name, problem.message)
        out.append(attrs.evolve(problem, message=str(err)))
    return out


def _plugin_error(pm: pluggy.PluginManager, plugin: str, message: str) -> PluginError:
    return PluginError(plugin, _one_line(message), entry_point=_source_of(pm, plugin).entry_point)


# -- description -------------------------------------------------------------------------------


def _source_of(pm: pluggy.PluginManager, name: str) -> PluginSource:
    sources = getattr(pm, "sources", {})
    if name in sources:
        return sources[name]
    return PluginSource("registered", "?")  # registered by hand (pm.register) at runtime


def describe_plugins(pm: pluggy.PluginManager) -> list[dict]:
    """One dict per plugin, sorted by name: ``name``, ``version``, ``source`` (``"builtin"``,
    ``"distribution:<dist>"`` or ``"registered"``), ``hooks`` (sorted hook names),
    ``entry_point`` (or None) and ``status`` (``"active"`` or ``"disabled"``)."""
    rows: list[dict] = []
    names = {name for name, _ in pm.list_name_plugin()} | set(getattr(pm, "sources", {}))
    for name in sorted(names):
        plugin = pm.get_plugin(name)
        source = _source_of(pm, name)
        blocked = plugin is None or pm.is_blocked(name)
        hooks = [] if blocked else sorted(c.name for c in (pm.get_hookcallers(plugin) or []))
        rows.append(
            {
                "name": name,
                "version": source.version,
                "source": source.source,
                "hooks": hooks,
                "entry_point": source.entry_point,
                "status": "disabled" if blocked else "active",
            }
        )
    return rows
