"""Graph runners with the read-done fence built in, and the scheduler-side overlap loop.

An engine supplies a `ModelAdapter` (static shared buffers, host-side prep, in-graph prep,
forward); a runner warms up, captures one graph per bucket (a transaction) with one release
decision each, pads, falls back to eager, and publishes per decision. `OverlapLoop` is the
scheduler side: barrier right after each launch, next-batch writes on the schedule stream.
`SpecStep` runs the phases of one speculative step (draft, target verify, draft extend) and
hands the scheduler the event of the last phase that reads shared state.
"""

from typing import TYPE_CHECKING

from warpolicy.runtime.policy import sound
from warpolicy.runtime.release import BucketRelease
from warpolicy.runtime.runners.base import GraphRunner, check_buckets
from warpolicy.runtime.runners.capture import (
    SELF_CHECK_MODES,
    CaptureReport,
    CaptureTransaction,
    SelfCheckError,
)
from warpolicy.runtime.runners.decode import DecodeRunner
from warpolicy.runtime.runners.draft_extend import DraftExtendRunner
from warpolicy.runtime.runners.overlap import OverlapLoop, StepProbe
from warpolicy.runtime.runners.prefill import PrefillRunner
from warpolicy.runtime.runners.protocols import (
    CanaryAdapter,
    CanaryHost,
    CapturedBucket,
    Mailbox,
    ModelAdapter,
    Runner,
    SizedModelAdapter,
    StepInfo,
)
from warpolicy.runtime.runners.spec_step import Phase, SpecStep, StepMailbox, last_reader_of
from warpolicy.runtime.runners.verify import VerifyRunner

if TYPE_CHECKING:  # mypy checks that both are `Runner`s and `CanaryHost`s (no runtime cost)

    def _both_are_runners(graph: GraphRunner, step: SpecStep) -> tuple[Runner, Runner]:
        return graph, step

    def _both_host_canaries(graph: GraphRunner, step: SpecStep) -> tuple[CanaryHost, CanaryHost]:
        return graph, step


__all__ = [
    "SELF_CHECK_MODES",
    "BucketRelease",
    "CanaryAdapter",
    "CanaryHost",
    "CaptureReport",
    "CaptureTransaction",
    "CapturedBucket",
    "DecodeRunner",
    "DraftExtendRunner",
    "GraphRunner",
    "Mailbox",
    "ModelAdapter",
    "OverlapLoop",
    "Phase",
    "PrefillRunner",
    "Runner",
    "SelfCheckError",
    "SizedModelAdapter",
    "SpecStep",
    "StepInfo",
    "StepMailbox",
    "StepProbe",
    "VerifyRunner",
    "check_buckets",
    "last_reader_of",
    "sound",
]
