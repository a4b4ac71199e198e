"""How the harness builds the runtime's composition root, on 0.2 and on 0.3.

0.2.0 builds ``Platform(impl, pm)`` and every component looks observers up through the
platform's plugin manager; 0.3 (issue 17 item 4) builds ``Platform(impl)`` and passes the
manager's observers to each component (``observers=``). The matrix and the regression tests
ran on both, so the runtime's acceptance test was run before and after the change (the 0.2.0
figures in CHANGELOG); this is the one place that knows the difference. The scenarios added
since (the WAR canary, the engine-owned capture, per-batch decisions) import 0.3's runtime.
"""

from __future__ import annotations

import importlib
import inspect
from typing import Any

import pluggy

from warpolicy.runtime import manager
from warpolicy.runtime.runners import GraphRunner


def _facade() -> tuple[Any, bool]:
    """The `Platform` class, and whether it carries the plugin manager (0.2)."""
    platforms = importlib.import_module("warpolicy.runtime.platforms")
    facade = getattr(platforms, "Platform", None)
    if facade is not None:  # 0.3: the facade lives with the platforms, no plugin manager
        return facade, False
    return importlib.import_module("warpolicy.runtime.platform").Platform, True  # 0.2


Platform, PLATFORM_CARRIES_PM = _facade()

#: Whether components take their observers as ``observers=`` (0.3).
OBSERVERS_PASSED_IN = "observers" in inspect.signature(GraphRunner.__init__).parameters


def make_platform(impl: Any, pm: pluggy.PluginManager) -> Any:
    """The `Platform` facade over ``impl`` (observers on ``pm``)."""
    return Platform(impl, pm) if PLATFORM_CARRIES_PM else Platform(impl)


def component_kwargs(pm: pluggy.PluginManager) -> dict[str, Any]:
    """What to pass a runner, fence, barrier, loop or speculative step so it calls ``pm``'s
    observers (nothing on 0.2: they find them through the platform)."""
    return {"observers": manager.observers_of(pm)} if OBSERVERS_PASSED_IN else {}


def open_device(pm: pluggy.PluginManager, device: str) -> Any:
    """The platform a plugin on ``pm`` claims for ``device``."""
    opener = getattr(manager, "open_platform", None)
    if opener is not None:  # 0.3
        return opener(pm, device)
    return Platform.for_device(device, pm)


def publish_args(bucket: Any) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    """The arguments of ``fence.before_replay`` and ``fence.after_replay`` for a captured
    bucket: its release decision (0.3), or its policy and event (0.2)."""
    release = getattr(bucket, "release", None)
    if release is not None:
        return (release,), (release,)
    return (bucket.policy,), (bucket.policy, bucket.event)
