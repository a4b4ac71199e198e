"""Platforms: what a platform is (`base`), the facade the runtime calls (`facade`), and the
built-in implementations (`cuda` on ``torch.cuda``, `sim` for CPU runs).

The composition root (`warpolicy.runtime.manager`) registers the built-ins as plugins, asks the
``warpolicy_platform`` hook once per device and wraps the claim in a `Platform`.
"""

from warpolicy.runtime.platforms.base import (
    GRAPH_WALK_METHODS,
    PLATFORM_OPERATIONS,
    RESTORE_METHODS,
    SIM_DEVICE_TYPES,
    EventFirstWait,
    EventHandle,
    GraphHandle,
    GraphRestorer,
    GraphWalker,
    PlatformImpl,
    PoolHandle,
    StreamHandle,
    cuda_available,
    device_type,
    implementation_problems,
    is_simulated,
)
from warpolicy.runtime.platforms.facade import Platform, PlatformError

__all__ = [
    "GRAPH_WALK_METHODS",
    "PLATFORM_OPERATIONS",
    "SIM_DEVICE_TYPES",
    "EventFirstWait",
    "EventHandle",
    "GraphHandle",
    "GraphRestorer",
    "GraphWalker",
    "Platform",
    "PlatformError",
    "PlatformImpl",
    "PoolHandle",
    "RESTORE_METHODS",
    "StreamHandle",
    "cuda_available",
    "device_type",
    "implementation_problems",
    "is_simulated",
]
