"""The pluggy markers of project ``warpolicy``: `hookimpl` for plugins, `hookspec` for specs.

They sit below everything else in the runtime so a built-in plugin (the CUDA and simulated
platforms, the NVTX observer) imports only this module, never the hook specifications or the
plugin manager (the eggsample shape: the host builds the manager, a plugin imports the marker).
`warpolicy.hookimpl` and `warpolicy.runtime.hookspecs.hookimpl` are the same object.
"""

from __future__ import annotations

import pluggy

PROJECT = "warpolicy"

hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)

__all__ = ["PROJECT", "hookimpl", "hookspec"]
