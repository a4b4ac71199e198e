"""warpolicy-example: a complete warpolicy plugin, to copy (docs/plugins.md walks through it).

It does two of the three things a plugin can do:

* **a registry fragment** (`warpolicy_capabilities`): the backend ``example_attn`` from the
  ``capabilities.yaml`` beside this file, layered on the default registry;
* **an observer** (``warpolicy_on_*``): `CoarseSteps` counts, per runner, the steps whose
  scheduler was released early and those that went coarse (waited for the whole forward), and
  logs one line the first time each runner goes coarse, falls back or is demoted.

(The third, claiming a device type with `warpolicy_platform`, is in docs/plugins.md.)

Entry point (pyproject.toml): ``[project.entry-points.warpolicy] example =
"warpolicy_example:plugin"``: pluggy registers the object `plugin`, an instance, so its hook
methods share state. Observers must not raise and must be cheap: the per-step hooks
(``warpolicy_on_publish``, ``warpolicy_on_barrier``) run on the scheduler's thread, between the
forward's launch and the next batch's writes.
"""

from __future__ import annotations

import collections
import logging
import pathlib
import threading

from warpolicy import WarReadDonePolicy, hookimpl

__version__ = "0.1.0"

log = logging.getLogger("warpolicy.example")

#: The fragment this plugin ships (package data, see pyproject.toml).
CAPABILITIES = pathlib.Path(__file__).with_name("capabilities.yaml")


class CoarseSteps:
    """The plugin object: a fragment and an observer.

    ``released[runner]`` counts barriers that waited on a read-done event (the scheduler was
    released early), ``coarse[runner]`` barriers that waited for the whole forward; a coarse
    barrier with nothing taken is counted for the runner that published last.
    """

    def __init__(self) -> None:
        self.released: collections.Counter[str] = collections.Counter()
        self.coarse: collections.Counter[str] = collections.Counter()
        self.fallbacks: collections.Counter[str] = collections.Counter()
        self.demotions: collections.Counter[str] = collections.Counter()
        self._last_runner: str | None = None
        self._logged: set[str] = set()
        self._lock = threading.Lock()  # logging only; the counters are the scheduler thread's

    # -- fragment -----------------------------------------------------------------------------

    @hookimpl
    def warpolicy_capabilities(self) -> pathlib.Path:
        """A path is read as a YAML file; a ``str`` would be YAML text, a dict a parsed
        document; a list may mix them."""
        return CAPABILITIES

    # -- observer: per step (keep these cheap) ----------------------------------------------

    @hookimpl
    def warpolicy_on_publish(self, runner: str, policy: WarReadDonePolicy) -> None:
        # an implementation names only the arguments it uses (pluggy passes those)
        self._last_runner = runner

    @hookimpl
    def warpolicy_on_barrier(self, runner: str, step: int | None, kind: str) -> None:
        if step is None and self._last_runner is not None:  # nothing taken: the barrier's name
            runner = self._last_runner
        if kind == "event":
            self.released[runner] += 1
            return
        self.coarse[runner] += 1
        self._once(
            f"coarse:{runner}",
            "runner %r went coarse (the scheduler waited for the whole forward)",
            runner,
        )

    # -- observer: rare events ------------------------------------------------------------------

    @hookimpl
    def warpolicy_on_fallback(self, where: str, error: BaseException) -> None:
        self.fallbacks[where] += 1
        self._once(f"fallback:{where}", "fallback at %s: %r", where, error)

    @hookimpl
    def warpolicy_on_demotion(self, runner: str, bucket: int, reason: str) -> None:
        self.demotions[runner] += 1
        self._once(
            f"demotion:{runner}:{bucket}", "%s bucket %d demoted: %s", runner, bucket, reason
        )

    def coarse_share(self, runner: str) -> float:
        """The share of ``runner``'s barriers that were coarse (0.0 with none yet)."""
        total = self.released[runner] + self.coarse[runner]
        return self.coarse[runner] / total if total else 0.0

    def _once(self, key: str, message: str, *args: object) -> None:
        with self._lock:
            if key in self._logged:
                return
            self._logged.add(key)
        log.warning("warpolicy-example: " + message, *args)


#: What the entry point registers.
plugin = CoarseSteps()

__all__ = ["CAPABILITIES", "CoarseSteps", "plugin"]
