"""Graph runners with the read-done fence built in, and the scheduler-side overlap loop.

An engine supplies a `ModelAdapter` (static shared buffers, host-side prep, in-graph prep,
forward); a runner warms up, captures one graph per bucket with the node planted after the
in-graph prep, pads, falls back to eager, and publishes per policy. `OverlapLoop` is the
scheduler side: barrier right after each launch, next-batch writes on the schedule stream.
"""

from warpolicy.runners.base import (CapturedBucket, GraphRunner, ModelAdapter, PolicyFn,
                                    StepInfo, resolve_policy_fn, sound)
from warpolicy.runners.decode import DecodeRunner
from warpolicy.runners.overlap import OverlapLoop, StepProbe
from warpolicy.runners.prefill import PrefillRunner
from warpolicy.runners.verify import VerifyRunner

__all__ = [
    "CapturedBucket", "DecodeRunner", "GraphRunner", "ModelAdapter", "OverlapLoop", "PolicyFn",
    "PrefillRunner", "StepInfo", "StepProbe", "VerifyRunner", "resolve_policy_fn", "sound",
]
