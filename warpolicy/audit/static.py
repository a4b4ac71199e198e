"""Static graph audit: walk every captured CUDA graph of a runner and find shared-buffer
readers that are not ordered before its release point.

`audit_static_buckets` walks each captured bucket with the policy that bucket publishes and
combines the results (UNSAFE if any bucket has a late reader, naming the bucket). Each graph is
found by `warpolicy.audit.cuda_graph`, read by `warpolicy.runtime.graphwalk.cuda.read_graph` (the walk
the marker self-check uses) and judged by `warpolicy.audit.graph`. Any failure here is an
INCONCLUSIVE result with the reason, never an exception.

`self_check_refutation` reads what the runner's capture self-check did: a declared
``in_graph`` marker bucket the check demoted because shared readers follow the marker is a
refuted declaration (`Refutation`); the late readers are named by walking that bucket's kept
graph again through the platform's own check (`Platform.check_marker`), so the simulated
platform's graph model and CUDA graphs are read alike.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs

from warpolicy.audit.cuda_graph import graph_for
from warpolicy.audit.graph import analyze_graph
from warpolicy.audit.report import (
    INCONCLUSIVE,
    SAFE,
    UNSAFE,
    Offender,
    Refutation,
    StaticResult,
    Verdict,
)
from warpolicy.registry.vocabulary import IN_GRAPH, NONE, PRE_REPLAY, Placement, WarReadDonePolicy
from warpolicy.runtime.graphwalk.cuda import read_graph
from warpolicy.runtime.graphwalk.model import Graph, buffer_ranges
from warpolicy.runtime.runners import GraphRunner, SpecStep
from warpolicy.runtime.runners.protocols import Runner


def unavailable(why: str) -> StaticResult:
    """The INCONCLUSIVE result of a static audit that could not run."""
    return StaticResult(INCONCLUSIVE, reason=f"static audit unavailable: {why}")


def audit_static(
    runner: Runner,
    bucket: int | None,
    shared: Mapping[str, Any],
    policy: WarReadDonePolicy | None,
    *,
    post_step: bool = False,
) -> StaticResult:
    """Walk the graph of ``runner``'s ``bucket`` and judge ``policy``. Never raises."""
    try:
        return _audit_static(runner, bucket, shared, policy, post_step)
    except Exception as exc:  # noqa: BLE001 - a static audit failure is never a crash
        return unavailable(f"{type(exc).__name__}: {exc}")


def audit_static_buckets(
    runner: Runner, shared: Mapping[str, Any], *, post_step: bool = False
) -> StaticResult:
    """Walk every captured bucket of ``runner`` with the policy it publishes. Never raises.

    A speculative step whose last step was staged releases at target verify: verify's buckets
    are walked with their policy, and the staged consumer's (the draft extend's) as released
    before they run: any reader of a shared buffer in them is late (staging that does not copy
    everything the consumer reads)."""
    if isinstance(runner, SpecStep) and runner.staged and runner.staging is not None:
        verify, consumer = runner.staging
        return combine_parts(
            audit_static_buckets(verify, shared, post_step=post_step),
            _staged_consumer(consumer, shared),
            consumer.name,
        )
    try:
        captured = dict(runner.captured)
    except Exception as exc:  # noqa: BLE001 - a runner's own failure is not the audit's crash
        return unavailable(f"{type(exc).__name__}: {exc}")
    if not captured:
        return unavailable("the runner captured no graph")
    results = {
        b: audit_static(runner, b, shared, c.policy, post_step=post_step)
        for b, c in sorted(captured.items())
    }
    return combine_buckets(results)


def _staged_consumer(consumer: Runner, shared: Mapping[str, Any]) -> StaticResult:
    try:
        captured = dict(consumer.captured)
    except Exception as exc:  # noqa: BLE001 - a runner's own failure is not the audit's crash
        return unavailable(f"{type(exc).__name__}: {exc}")
    if not captured:
        return unavailable(f"the staged {consumer.name} captured no graph")
    return combine_buckets(
        {b: audit_static(consumer, b, shared, PRE_REPLAY) for b in sorted(captured)}
    )


def combine_parts(release: StaticResult, consumer: StaticResult, name: str) -> StaticResult:
    """A staged step's result: the releasing phase's and the staged consumer's (its offenders
    named ``<consumer>: <kernel>``). UNSAFE if either is; else INCONCLUSIVE if either is."""
    offenders = release.offenders + tuple(
        attrs.evolve(o, name=f"{name}: {o.name}") for o in consumer.offenders
    )
    verdicts = (release.verdict, consumer.verdict)
    verdict = (
        UNSAFE
        if offenders or UNSAFE in verdicts
        else INCONCLUSIVE
        if INCONCLUSIVE in verdicts
        else SAFE
    )
    reasons = [r for r in (release.reason, consumer.reason and f"{name}: {consumer.reason}") if r]
    return StaticResult(
        verdict,
        offenders,
        nodes=release.nodes + consumer.nodes,
        readers=release.readers + consumer.readers,
        unreadable=release.unreadable + consumer.unreadable,
        reason="; ".join(reasons) if verdict is not SAFE and not offenders else "",
        buckets=release.buckets,
    )


def combine_buckets(results: Mapping[int, StaticResult]) -> StaticResult:
    """One result for several buckets: UNSAFE if any is (offenders tagged with their bucket);
    else INCONCLUSIVE if any is (the reasons, one per distinct reason); else SAFE."""
    walked = tuple(sorted(results))
    nodes = sum(r.nodes for r in results.values())
    readers = sum(r.readers for r in results.values())
    unreadable = sum(r.unreadable for r in results.values())

    def result(
        verdict: Verdict, offenders: tuple[Offender, ...] = (), reason: str = ""
    ) -> StaticResult:
        return StaticResult(
            verdict,
            offenders,
            nodes=nodes,
            readers=readers,
            unreadable=unreadable,
            reason=reason,
            buckets=walked,
        )

    offenders = tuple(
        attrs.evolve(o, bucket=b) for b, r in sorted(results.items()) for o in r.offenders
    )
    if offenders:
        return result(UNSAFE, offenders)
    vague = {b: r.reason for b, r in sorted(results.items()) if r.verdict is not SAFE}
    if vague:
        reasons = list(dict.fromkeys(vague.values()))
        if len(reasons) == 1 and len(vague) == len(results):
            return result(INCONCLUSIVE, reason=reasons[0])
        by_reason = [
            f"bucket(s) {', '.join(str(b) for b, r in vague.items() if r == why)}: {why}"
            for why in reasons
        ]
        return result(INCONCLUSIVE, reason="; ".join(by_reason))
    return result(SAFE)


def _audit_static(
    runner: Runner,
    bucket: int | None,
    shared: Mapping[str, Any],
    policy: WarReadDonePolicy | None,
    post_step: bool,
) -> StaticResult:
    if policy is None or policy == NONE:
        return analyze_graph(Graph(()), (), NONE)
    if bucket is None:
        return unavailable("the step ran eagerly, there is no captured graph")
    platform = runner.platform.name
    if platform != "cuda":
        return unavailable(f"platform {platform!r} has no CUDA graphs to walk")
    try:
        from cuda.bindings import driver  # noqa: F401, PLC0415 - deferred: an optional dependency
    except ImportError as exc:
        return unavailable(f"cuda-bindings is not installed ({exc}); pip install cuda-bindings")
    ranges = buffer_ranges(shared)
    with graph_for(runner, bucket) as (raw, event):
        walked = read_graph(raw)
    return analyze_graph(walked.graph, ranges, policy, event=event, post_step=post_step)


def self_check_refutation(
    runner: Any,
    shared: Mapping[str, Any],
    declared: WarReadDonePolicy | None,
    published: WarReadDonePolicy | None,
) -> Refutation | None:
    """The `Refutation` of a declared ``in_graph`` by the runner's capture self-check, or None.

    A bucket counts when its capture report says a marker was self-checked and failed
    (``placement`` marker, ``walked``, ``ok`` False) *and* walking its kept graph again finds
    shared readers after the marker. A check that could not run (no graph to read, marker not
    found) demotes the bucket too, but proves nothing about the declaration: not a refutation.
    Never raises.
    """
    if declared != IN_GRAPH:
        return None
    if not isinstance(runner, GraphRunner):  # a speculative step has no reports of its own
        return None
    try:
        reports = dict(runner.capture_report)
        captured = dict(runner.captured)
    except Exception:  # noqa: BLE001 - a runner without the reports refutes nothing
        return None
    late: list[Offender] = []
    buckets: list[int] = []
    detail: list[str] = []
    for bucket, report in sorted(reports.items()):
        if not (report.placement is Placement.MARKER and report.walked and report.ok is False):
            continue
        found = _late_readers_of(runner, captured.get(bucket), shared)
        if not found:
            continue
        buckets.append(bucket)
        detail.append(report.detail)
        late += [
            Offender(r.index, r.kind.value, r.name, r.buffers, bucket=bucket)
            for r in found
            if not r.opaque
        ]
    if not buckets:
        return None
    return Refutation(IN_GRAPH, published, tuple(buckets), tuple(late), tuple(detail))


def _late_readers_of(runner: Any, captured: Any, shared: Mapping[str, Any]) -> tuple:
    """The readers the self-check finds after the marker in ``captured``'s kept graph (empty
    when it cannot tell). The marker records the bucket's own event (``recorded``, kept
    whatever the release decided)."""
    graph = getattr(captured, "graph", None)
    event = getattr(captured, "recorded", None) or getattr(captured, "event", None)
    if graph is None or event is None:
        return ()
    try:
        check = runner.platform.check_marker(graph, shared, event)
    except Exception:  # noqa: BLE001 - PlacementError or anything else: cannot tell
        return ()
    return tuple(r for r in check.late if not r.opaque)
