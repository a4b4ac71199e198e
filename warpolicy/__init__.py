"""warpolicy: where an LLM serving engine's forward may release the scheduler.

The registry, engine and CLI import without torch; the runtime (fence, CUDA plugin, runners,
audit) imports torch lazily.
"""

from warpolicy.registry.vocabulary import ForwardMode, WarReadDonePolicy
from warpolicy.runtime.hookspecs import hookimpl, hookspec

__version__ = "0.4.0"

__all__ = ["ForwardMode", "WarReadDonePolicy", "__version__", "hookimpl", "hookspec"]
