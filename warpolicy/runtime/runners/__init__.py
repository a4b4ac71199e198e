"""Graph runners with the read-done fence built in, and the scheduler-side overlap loop.

An engine supplies a `ModelAdapter` (static shared buffers, host-side prep, in-graph prep,
forward); a runner warms up, captures one graph per bucket with the node planted after the
in-graph prep, pads, falls back to eager, and publishes per policy. `OverlapLoop` is the
scheduler side: barrier right after each launch, next-batch writes on the schedule stream.
`SpecStep` runs the phases of one speculative step (draft, target verify, draft extend) and
hands the scheduler the event of the algorithm's last shared reader.
"""

from warpolicy.runtime.runners.base import (
    CapturedBucket,
    GraphRunner,
    ModelAdapter,
    PolicyFn,
    StepInfo,
    resolve_policy_fn,
    sound,
)
from warpolicy.runtime.runners.decode import DecodeRunner
from warpolicy.runtime.runners.draft_extend import DraftExtendRunner
from warpolicy.runtime.runners.overlap import OverlapLoop, StepProbe
from warpolicy.runtime.runners.prefill import PrefillRunner
from warpolicy.runtime.runners.spec_step import Phase, SpecStep, StepMailbox, last_reader_of
from warpolicy.runtime.runners.verify import VerifyRunner

__all__ = [
    "CapturedBucket",
    "DecodeRunner",
    "DraftExtendRunner",
    "GraphRunner",
    "ModelAdapter",
    "OverlapLoop",
    "Phase",
    "PolicyFn",
    "PrefillRunner",
    "SpecStep",
    "StepInfo",
    "StepMailbox",
    "StepProbe",
    "VerifyRunner",
    "last_reader_of",
    "resolve_policy_fn",
    "sound",
]
