"""The read-done point of graphs an engine captures itself: the engine-facing API.

Every serving engine captures its own CUDA graphs (SGLang's ``CudaGraphRunner``, vLLM's model
runner). This module is what such an engine calls, and what warpolicy's own runners call
(`warpolicy.runtime.runners.capture.CaptureTransaction` is built on it), so both fail closed
the same way. One mode of one engine, per capture of its buckets::

    cell = resolve_cell(engine, "triton", "decode", "none", platform=rt.platform)   # once
    fence = ReadDoneFence(rt.platform, name="decode", observers=rt.observers)
    capture = ReadDoneCapture(rt.platform, cell, fence, observers=rt.observers)
    for bs in reversed(batch_sizes):                 # per bucket, largest first
        bucket = capture.begin(bs)                   # a fresh read-done event for this graph
        graph = torch.cuda.CUDAGraph(keep_graph=True)
        with torch.cuda.graph(graph, pool=pool):
            metadata_prep(bs)                        # the reads of scheduler-shared state
            bucket.mark()                            # marker placement only (no-op for derived)
            forward(bs)
        outcome = bucket.finish(graph, shared_buffers)   # check or derive, instantiate, decide
        releases[bs] = outcome.release               # immutable: all a step reads

with the warm-up and the captures inside the orderings this module owns (``finally`` included,
``KeyboardInterrupt`` too)::

    with capturing(rt.platform):                     # the first capture and every re-capture
        with warm_up(rt.platform):                   # a side stream, joined and synchronized
            for bs in batch_sizes:
                forward(bs)                          # eager: cuBLAS, the allocator
        ...                                          # the loop above

and per step, on the forward stream, then on the scheduler's side::

    fence.before_replay(release); graph.replay(); fence.after_replay(release)
    barrier.apply(schedule_stream, forward_stream, fence.take())

What each piece does:

* `resolve_cell` / `cell_policy`: the policy for one (backend, mode, spec, flags), asked once
  for each set of facts a bucket can end with, and where the read-done node goes (`CellPolicy`).
  A lookup that fails (an unknown backend, say) makes every answer ``none``, with the reason;
* `warm_up`, `capturing`, `eager_release`, `shutdown`: the orderings around the engine's own
  code (its warm-up, its captures, steps served before any capture, the end of serving): each
  orders what follows after what it enqueued, also when that code raises, and a second fault
  in the fallback still leaves the host waiting (`warpolicy.runtime.ordering`);
* `ReadDoneCapture`: one capture of one mode's buckets; it asks once whether the platform can
  walk its graphs (`WalkProbe`) and begins each bucket;
* `BucketCapture`: one bucket. ``mark()`` records its event in the capture body (the marker,
  confirmed by the capture state); ``finish(graph, shared_buffers)`` self-checks that marker
  (or a ``marker=`` event the engine recorded itself), or plants the derived node after the
  last shared readers the walk finds, instantiates the graph and decides the bucket's
  `BucketRelease`, reported in a `CaptureReport`. The graph is a torch ``CUDAGraph`` captured
  with ``keep_graph=True``, or a `RawGraph` wrapping the ``cudaGraph_t`` the engine holds (the
  engine instantiates that one itself, after ``finish``).

Failing closed, exactly as in the runners: a verified refutation (a late shared reader, no
shared reader found, no external events, a platform that cleanly cannot walk its graphs for
derived placement, an engine-recorded marker nothing can confirm) gives the bucket the policy's
*unplanted* answer (``post_replay`` in the default registry), with one line why; a doubt
(anything that raised or returned nonsense: the event, the plant, the probe, the check, the
instantiation, a marker never recorded) makes it publish nothing (the coarse barrier). Both
reach ``warpolicy_on_demotion`` every time and one warning per bucket. ``self_check="error"``
raises `SelfCheckError` instead of demoting a marker.
"""

from __future__ import annotations

import contextlib
import operator
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence

import attrs

from warpolicy.errors import InputError, UnknownNameError, WarpolicyError
from warpolicy.registry.decision import Context, Decision, Reason
from warpolicy.registry.engine import PolicyEngine
from warpolicy.registry.vocabulary import IN_GRAPH, ForwardMode, Placement, WarReadDonePolicy
from warpolicy.runtime.batch import NO_PLANS, BucketBatch, CellPlans, cell_plans, lower_policies
from warpolicy.runtime.fence import ReadDoneFence, SchedulerBarrier
from warpolicy.runtime.graphwalk.anchor import SavedAnchors
from warpolicy.runtime.graphwalk.launch_sites import Sites
from warpolicy.runtime.graphwalk.plant import RawGraph, SharedBuffers
from warpolicy.runtime.graphwalk.restore import Rebound
from warpolicy.runtime.observers import NO_OBSERVERS, Observers, Reporter
from warpolicy.runtime.ordering import order_after, synchronize_all
from warpolicy.runtime.placement import (
    PlacementOutcome,
    Verdict,
    check_bucket_marker,
    instantiate_kept,
    plant_bucket_derived,
    walk_unavailable,
)
from warpolicy.runtime.platforms import (
    EventHandle,
    GraphHandle,
    Platform,
    StreamHandle,
    is_simulated,
)
from warpolicy.runtime.policy import ExplainedPolicy, PlacedPolicy, RunnerPolicy, policy_function
from warpolicy.runtime.rebind import RELEASE_LABEL, rebind_bucket, save_bucket
from warpolicy.runtime.release import (
    BucketFacts,
    BucketRelease,
    ModePolicies,
    ReadDone,
    decide_bucket,
    resolve_policies,
)

#: Values of ``self_check``: warn and demote (default), skip the check, raise `SelfCheckError`.
SELF_CHECK_MODES = ("warn", "off", "error")


class SelfCheckError(WarpolicyError):
    """``self_check="error"``: a captured marker failed the self-check (or it could not run)."""


# -- the policy, resolved once ----------------------------------------------------------------


def parse_placement(given: Placement | str) -> Placement:
    """``marker`` or ``derived`` (a `Placement` or its name), else an `InputError`."""
    try:
        return Placement(given)
    except ValueError:
        choices = ", ".join(p.value for p in Placement)
        raise InputError(f"placement must be one of {choices}, not {given!r}") from None


def placement_of(
    policy: RunnerPolicy, mode: ForwardMode, given: Placement | str | None = None
) -> tuple[Placement, str | None]:
    """Where ``mode``'s read-done node goes: ``given`` (an `InputError` when it is not a
    placement), else the policy's ``placement(mode)`` (a `PlacedPolicy`), else the marker.
    Returns the placement and, when the policy's lookup failed, one line why: the marker is then
    the conservative answer (its self-check guards it)."""
    if given is not None:
        return parse_placement(given), None
    if not isinstance(policy, PlacedPolicy):
        return Placement.MARKER, None
    try:
        return Placement(policy.placement(mode)), None
    except Exception as exc:  # noqa: BLE001 - the marker is the conservative default
        return Placement.MARKER, f"placement lookup failed ({exc!r}); planting the marker"


@attrs.frozen
class CellPolicy:
    """What one mode's buckets may publish, resolved once (`resolve_cell`, `cell_policy`).

    ``policies``: the answers for a graph with a confirmed node, without one, and for an eager
    step (every answer ``none`` when the lookup failed: ``failure`` says why); ``placement``:
    where the node goes; ``source``: the policy they came from (observers get its explanation
    when it has one); ``note``: a lookup that fell back (the placement), else None.
    """

    mode: ForwardMode
    policies: ModePolicies
    placement: Placement = Placement.MARKER
    source: RunnerPolicy | None = attrs.field(default=None, eq=False, repr=False)
    note: str | None = None
    #: the per-batch plans of the mode's cells (``per_batch=True`` only; `warpolicy.runtime.
    #: batch`): the policies above are then the earliest any batch can get, and every step must
    #: go through its bucket's `BucketOutcome.batch`
    plans: CellPlans = attrs.field(default=NO_PLANS, eq=False, repr=False)

    @property
    def failure(self) -> str | None:
        """Why every answer is ``none`` (the policy lookup failed), else None."""
        return self.policies.failure


def cell_policy(
    policy: RunnerPolicy,
    mode: ForwardMode | str,
    *,
    placement: Placement | str | None = None,
    per_batch: bool = False,
    observers: Observers = NO_OBSERVERS,
) -> CellPolicy:
    """The `CellPolicy` of ``mode`` from any runner policy: a compiled policy (or another
    object with ``lookup(mode, eager, planted)``) or a ``(mode, eager, planted) -> policy``
    callable. The policy is asked once per fact set (`resolve_policies`); any exception or
    junk answer makes every answer ``none``. ``placement`` overrides the policy's.

    ``per_batch=True`` (opt in): a cell whose policy reads per-batch facts is resolved for the
    earliest policy any of its batches can get (`warpolicy.runtime.batch.lower_policies`) and
    carries its plans; each bucket's `BucketOutcome.batch` (and `ReadDoneCapture.eager_batch`)
    then gives every step its own release, the same or later. Only opt in if every step calls
    it: publishing ``outcome.release`` itself would be that earliest policy for every batch.
    Without it such a cell answers what a batch reporting no facts gets (later, sound)."""
    mode = ForwardMode.parse(mode)
    where, note = placement_of(policy, mode, placement)
    policies = resolve_policies(policy_function(policy), mode)
    plans = NO_PLANS
    if per_batch and policies.failure is None:
        plans = cell_plans(policy, mode, Reporter(observers, f"cell {mode.label}"))
        policies = lower_policies(policies, plans)
    return CellPolicy(mode, policies, where, policy, note, plans)


def resolve_cell(
    engine: PolicyEngine,
    backend: str,
    mode: ForwardMode | str,
    spec: str = "none",
    flags: Mapping[str, bool | str] | None = None,
    *,
    platform: Platform,
    placement: Placement | str | None = None,
    per_batch: bool = False,
    observers: Observers = NO_OBSERVERS,
) -> CellPolicy:
    """The policy of (``backend``, ``mode``, ``spec``, ``flags``) on ``platform`` from the
    registry ``engine`` holds, resolved once (call it at capture, never per step);
    ``per_batch``: see `cell_policy`.

    Fails closed, loudly: an unknown backend or spec, or any error while compiling, gives every
    answer ``none`` (the coarse barrier) with the error as ``failure`` and one `RuntimeWarning`
    per call; an unknown name's warning says to load the registry layer that declares it.
    Nothing raises but an `UnknownNameError` for the mode itself and an `InputError` for a bad
    ``placement``.
    """
    mode = ForwardMode.parse(mode)
    try:
        compiled = engine.compile(
            backend,
            spec,
            flags,
            platform=platform.name,
            external_events=platform.external_events_supported(),
            strict=True,
        )
    except Exception as exc:  # noqa: BLE001 - fail closed: coarse, saying why
        failure = f"compiling the policy of {backend!r} (spec {spec!r}) failed: {exc}"
        where = parse_placement(placement) if placement is not None else Placement.MARKER
        cell = CellPolicy(mode, ModePolicies.coarse(mode, failure, exc), where)
        hint = ""
        if isinstance(exc, UnknownNameError):
            hint = (
                "; a name your own registry file declares needs that file loaded: "
                "PolicyEngine.load(['default', 'my_capabilities.yaml'])"
            )
        warnings.warn(
            f"warpolicy {mode.label}: {failure}{hint}; every bucket uses the coarse barrier",
            RuntimeWarning,
            stacklevel=2,
        )
        return cell
    return cell_policy(
        compiled, mode, placement=placement, per_batch=per_batch, observers=observers
    )


# -- the orderings around the engine's own code -------------------------------------------------


@contextlib.contextmanager
def warm_up(
    platform: Platform,
    *,
    after: Sequence[StreamHandle] = (),
    observers: Observers = NO_OBSERVERS,
) -> Iterator[StreamHandle]:
    """The engine's eager warm-up before a capture (cuBLAS, the allocator: torch's rule), on a
    side stream it yields::

        with warm_up(rt.platform):
            for bs in batch_sizes:
                forward(bs)

    The side stream starts after the current stream and ``after`` (e.g. the schedule stream,
    when the engine warms up while serving). On exit, whatever happened in the body
    (``KeyboardInterrupt`` and other ``BaseException`` included), the current stream joins the
    side stream and then the host synchronizes, so later work (an eager step, the scheduler's
    coarse barrier on the current stream) is ordered after every read the warm-up enqueued. A
    join that fails makes the host wait for everything instead (reported as a fallback); a
    second interrupt there still does. The body's exception propagates."""
    main = platform.current_stream()
    side = platform.new_stream()
    for stream in (main, *after):
        platform.wait_stream(side, stream)  # nothing ran on ``side`` yet if this raises
    try:
        with platform.stream(side):
            yield side
    finally:
        failed = order_after(platform, main, (side,))
        if failed is None:
            synchronize_all(platform)
        else:
            Reporter(observers, "warm-up").fallback(
                "warm_up", failed, f"joining the warm-up stream failed ({failed!r}); waited"
            )


@contextlib.contextmanager
def capturing(platform: Platform) -> Iterator[None]:
    """Around one capture of a mode's buckets (warm-up, every bucket's capture and ``finish``):
    the first capture, one after the engine served eager steps, and every re-capture.

    The host waits for everything before (steps in flight may still replay graphs being
    replaced, read the pool the capture reuses and record their events) and after, on any exit
    (``BaseException`` included: what the captures, the events' seeding and the instantiations
    enqueued is done before the next step or a retry). Keep the old graphs and outcomes until
    the block succeeded, then swap them in: a capture that raises leaves no half-built set."""
    synchronize_all(platform)
    try:
        yield
    finally:
        synchronize_all(platform)


def eager_release(
    cell: CellPolicy, fence: ReadDoneFence, *, observers: Observers = NO_OBSERVERS
) -> BucketRelease:
    """The release of a step served without a graph before any capture (the same as
    `ReadDoneCapture.eager` afterwards): the cell's eager answer, decided once, without probing
    the graph walk. Publish it as any step (``fence.before_replay(release)``, the eager forward,
    ``fence.after_replay(release)``); a forward that raises publishes nothing."""
    release = decide_bucket(cell.policies, BucketFacts(None), fence.name)
    reporter = Reporter(observers, f"{fence.name} eager")
    notify_decision(reporter, cell.source, cell.mode, release, eager=True, planted=False)
    return release


def shutdown(platform: Platform, *fences: ReadDoneFence) -> None:
    """Before freeing graphs, their events or the shared buffers: the host waits for everything
    in flight (replays still read the shared buffers and record the events; a second interrupt
    still waits), then each fence's untaken read-done is dropped."""
    synchronize_all(platform)
    for fence in fences:
        try:
            read_done = fence.take()
            if read_done is not None:
                read_done.discard()
        except Exception:  # noqa: BLE001 - nothing waits on it either way
            pass


# -- what a capture established ---------------------------------------------------------------


@attrs.frozen
class CaptureReport:
    """What the capture of one bucket did about its release point.

    ``walked``: a graph walk ran (derived placement, or the marker self-check); ``ok``: the plant
    or check was confirmed (True), or refuted or doubted (False, also when the walk could not run:
    ``walked=False, ok=False``); None when no plant or check was attempted;
    ``walk_ms``: what the walk cost, 0 when none ran; ``detail``: one line (the plant or check
    described, or why it failed or was skipped); ``policy``: what the bucket publishes.
    """

    bucket: int
    placement: Placement
    planted: bool
    walked: bool
    ok: bool | None
    walk_ms: float
    detail: str
    policy: WarReadDonePolicy | None = None
    #: a restored graph (`ReadDoneCapture.restore`), not a fresh capture
    restored: bool = False
    #: what re-pointing the restored executable's planted nodes cost (us), None when none ran
    rebind_us: float | None = None


@attrs.frozen(eq=False)
class BucketOutcome:
    """The result of `BucketCapture.finish`: the bucket's `BucketRelease` (the only thing its
    steps read), its `CaptureReport`, the verified `BucketFacts` it was decided from, what the
    walk (the self-check or the derived plant) established, if one ran, and the event the graph
    records (keep the outcome, or that event, as long as the graph)."""

    release: BucketRelease
    report: CaptureReport
    facts: BucketFacts
    placement: PlacementOutcome | None = None
    #: the event the graph's read-done node records, whatever the release decided (None: no
    #: node). Keep it alive as long as the graph: a graph exec recording a destroyed event is
    #: undefined behaviour in CUDA (seen on the H200: an abort inside ``replay``).
    recorded: EventHandle | None = None
    #: per batch (a cell resolved with ``per_batch=True`` that reads facts): each step's own
    #: release, ``batch.step(size, bucket, batch, name, model, observers.batch_action,
    #: reporter)`` -> (release, facts), the same as ``release`` or later; None: every step
    #: publishes ``release``
    batch: BucketBatch | None = attrs.field(default=None, repr=False)

    @property
    def policy(self) -> WarReadDonePolicy:
        """What every step of this bucket publishes."""
        return self.release.policy

    @property
    def event(self) -> EventHandle | None:
        """The read-done event the graph records, when the bucket publishes ``in_graph``."""
        return self.release.event


@attrs.frozen
class WalkProbe:
    """Whether a capture walks its graphs, asked once per capture (`ReadDoneCapture.walk`).

    ``needed``: an ``in_graph`` answer for planted graphs, with derived placement, or with the
    marker and the self-check on; ``unavailable``: why the platform cleanly cannot walk its
    graphs; ``failed``: why the probe itself failed (a doubt for every bucket).
    """

    needed: bool
    unavailable: str | None = None
    failed: str | None = None

    @property
    def available(self) -> bool:
        return self.needed and self.unavailable is None and self.failed is None


# -- one capture of one mode --------------------------------------------------------------------


class ReadDoneCapture:
    """One capture of the buckets of one mode: begin each bucket, finish it after its capture.

    ``cell``: the mode's `CellPolicy` (resolved once, reused across captures). ``fence``: the
    `ReadDoneFence` whose events the graphs record and which publishes at replay (its ``name``
    names this capture). ``marker=False``: this capture body records no marker (only derived
    placement can plant; e.g. SGLang's draft-extend graph). ``self_check``: one of
    `SELF_CHECK_MODES`. ``observers`` (or a ``reporter`` to share, as the runners do) see every
    demotion and decision.

    The walk probe runs at construction (once per capture): build a new `ReadDoneCapture` for
    every capture of the mode's buckets, after the warm-up.
    """

    def __init__(
        self,
        platform: Platform,
        cell: CellPolicy,
        fence: ReadDoneFence,
        *,
        marker: bool = True,
        self_check: str = "warn",
        observers: Observers = NO_OBSERVERS,
        reporter: Reporter | None = None,
    ) -> None:
        if not isinstance(platform, Platform):
            raise InputError(
                "ReadDoneCapture needs a Platform (build one with warpolicy.runtime.manager."
                f"open_runtime or open_platform), not {type(platform).__name__}"
            )
        if self_check not in SELF_CHECK_MODES:
            raise InputError(
                f"self_check must be one of {', '.join(SELF_CHECK_MODES)}, not {self_check!r}"
            )
        self.platform = platform
        self.cell = cell
        self.fence = fence
        self.name = fence.name
        self.marker = bool(marker)
        self.self_check = self_check
        self.reporter = (
            reporter if reporter is not None else Reporter(observers, f"{self.name} capture")
        )
        if cell.note is not None:
            self.reporter.warn("placement", cell.note)
        self.walk = self._probe()

    @property
    def mode(self) -> ForwardMode:
        return self.cell.mode

    @property
    def policies(self) -> ModePolicies:
        return self.cell.policies

    @property
    def placement(self) -> Placement:
        return self.cell.placement

    @property
    def derived(self) -> bool:
        return self.cell.placement is Placement.DERIVED

    @property
    def keep_graphs(self) -> bool:
        """Whether this capture walks its graphs, so they must be captured with
        ``keep_graph=True`` (capturing them so anyway costs nothing but the kept graph)."""
        return self.walk.available

    def _probe(self) -> WalkProbe:
        wants_in_graph = self.policies.planted is IN_GRAPH
        if self.derived:
            needed = wants_in_graph
        else:
            needed = self.marker and wants_in_graph and self.self_check != "off"
        if not needed:
            return WalkProbe(False)
        unavailable, failed = walk_unavailable(self.platform)
        walk = WalkProbe(True, unavailable, failed)
        if not self.derived and walk.unavailable is not None and self.self_check == "error":
            raise SelfCheckError(
                f"{self.name}: self_check='error' but the marker self-check cannot run: "
                f"{walk.unavailable}"
            )
        return walk

    def begin(self, bucket: int) -> BucketCapture:
        """Before capturing ``bucket``: a fresh read-done event for its graph (none without
        external events, or when this capture plants nothing; a failure to create it is a doubt
        that `BucketCapture.finish` reports)."""
        try:
            size = operator.index(bucket)  # an int, or an integer numpy / torch scalar
        except TypeError:
            size = 0
        if isinstance(bucket, bool) or size < 1:
            raise InputError(
                f"{self.name}: begin(bucket): a bucket is a batch size, a positive int, "
                f"not {bucket!r}"
            )
        event: EventHandle | None = None
        doubt: str | None = None
        if self.platform.external_events_supported() and (self.derived or self.marker):
            event = self.fence.prepare()
            if event is None:
                doubt = "creating or seeding the read-done event failed"
        return BucketCapture(self, size, event, doubt)

    def eager(self) -> BucketRelease:
        """The release of a step that runs without a graph (a batch no bucket holds)."""
        release = decide_bucket(self.policies, BucketFacts(None), self.name)
        self.notify(release, eager=True, planted=False)
        return release

    def save(self, graph: GraphHandle, outcome: BucketOutcome) -> SavedAnchors | None:
        """After `BucketCapture.finish`: where the kept ``graph``'s read-done node sits, as plain
        data (``saved.to_json()``) to persist beside the graph for `restore`. None, with one
        warning, when it cannot be saved (a restore of the graph is then coarse)."""
        planted = {RELEASE_LABEL: outcome.recorded} if outcome.recorded is not None else {}
        saved, why = save_bucket(self.platform, graph, planted)
        if saved is None:
            self.reporter.warn("save", f"bucket {outcome.report.bucket}: {why}")
        return saved

    def restore(
        self,
        bucket: int,
        graph: GraphHandle,
        saved: SavedAnchors | None,
        shared_buffers: SharedBuffers,
        *,
        events: Mapping[str, EventHandle] | None = None,
        instantiate: bool | None = None,
    ) -> BucketOutcome:
        """A graph of ``bucket`` that was cloned, restored from a saved description or
        recaptured: a new capture for the release decision. A fresh read-done event (as
        `begin`), the saved nodes found again by position and rebound to it
        (`warpolicy.runtime.rebind`), the self-check on the restored graph, the graph
        instantiated (unless it already is, or is a `RawGraph`), and the same
        `decide_bucket` as a capture. ``saved``: what `save` returned for the graph (None:
        nothing known, a doubt); ``events``: events for other planted labels (one per buffer
        class; each gets a fresh one otherwise). Never raises an ``Exception`` for a failed
        find, rebind, check or instantiation: a doubt publishes nothing, a refutation the
        unplanted answer; ``self_check="error"`` raises `SelfCheckError` instead."""
        return self.begin(bucket).restore(
            graph, saved, shared_buffers, events=events, instantiate=instantiate
        )

    def eager_batch(self, release: BucketRelease) -> BucketBatch | None:
        """The per-batch plan of the eager ``release`` (`eager`), for a cell resolved with
        ``per_batch=True`` whose eager cell reads facts; else None."""
        return BucketBatch.bind(self.cell.plans.eager, release)

    def notify(self, release: BucketRelease, *, eager: bool, planted: bool) -> None:
        """Tell the decision observers what a bucket (or the eager path) publishes."""
        notify_decision(self.reporter, self.cell.source, self.mode, release, eager, planted)


class BucketCapture:
    """The read-done side of one bucket's capture (`ReadDoneCapture.begin`).

    ``event``: the external event this bucket's graph records (the marker, or the derived
    node), None without one. ``mark`` goes in the capture body; ``finish`` after the capture.
    """

    def __init__(
        self,
        capture: ReadDoneCapture,
        bucket: int,
        event: EventHandle | None,
        doubt: str | None,
    ) -> None:
        self.capture = capture
        self.bucket = bucket
        self.event = event
        self._doubt = doubt
        self._marks: list[EventHandle | None] = []
        self.outcome: BucketOutcome | None = None
        #: the capture's launch sites given to `finish` (names the walk's readers by line)
        self.sites: Sites | None = None

    @property
    def keep_graph(self) -> bool:
        """Whether ``finish`` walks this bucket's graph (capture it with ``keep_graph=True``)."""
        return self.capture.keep_graphs

    def mark(self, event: EventHandle | None = None) -> EventHandle | None:
        """In the capture body, right after the metadata prep: record the bucket's event (or
        ``event``: the engine's own external event) with the capture stream current.

        Returns the event the graph now records, or None (derived placement, a warm-up or eager
        pass, no event, or a failed record, which the fence reports). Only the first call of a
        capture counts: a platform that re-runs the body at each replay (the simulated one)
        calls it again inside steps, and a failure there makes that step publish nothing.
        """
        c = self.capture
        if c.derived or not c.marker:
            return None
        target = event if event is not None else self.event
        if target is None:
            return None
        node = c.fence.plant(target)
        if not self._marks:
            self._marks.append(node)
        return node

    def finish(
        self,
        graph: GraphHandle,
        shared_buffers: SharedBuffers,
        *,
        marker: EventHandle | None = None,
        instantiate: bool | None = None,
        sites: Sites | None = None,
    ) -> BucketOutcome:
        """After the capture: check the marker or plant the derived node, instantiate the graph,
        and decide the bucket's release (a `BucketOutcome`; also kept as ``self.outcome``).

        ``graph``: the captured graph (a torch ``CUDAGraph`` with ``keep_graph=True``, a
        `RawGraph` around the engine's ``cudaGraph_t``, or the simulated platform's graph).
        ``shared_buffers``: the scheduler-shared tensors by name (or their address ranges).
        ``marker``: an external event the engine recorded in the capture body itself (instead
        of `mark`); only a graph walk can confirm it. ``instantiate``: build the executable
        graph now (default: yes, except for a `RawGraph`, which the engine instantiates after
        this call; derived placement must come before any instantiation). ``sites``: the
        capture's launch sites (`warpolicy.runtime.graphwalk.launch_sites.LaunchRecorder`), so
        the self-check and the derived plant name each reader as ``kernel (file.py:line)``.

        Never raises an ``Exception`` for a failed plant, check or instantiation: the bucket
        fails closed (see the module docstring); ``self_check="error"`` raises `SelfCheckError`.
        """
        self.sites = sites
        facts, outcome = self._facts(graph, shared_buffers, marker)
        facts = self._instantiated(graph, facts, instantiate)
        release = decide_bucket(self.capture.policies, facts, self.capture.name)
        report = self._report(release, facts, outcome)
        recorded = marker if marker is not None and not self.capture.derived else self.event
        demote_refuted = outcome is not None
        return self._settled(release, report, facts, outcome, recorded, demote_refuted)

    def restore(
        self,
        graph: GraphHandle,
        saved: SavedAnchors | None,
        shared_buffers: SharedBuffers,
        *,
        events: Mapping[str, EventHandle] | None = None,
        instantiate: bool | None = None,
    ) -> BucketOutcome:
        """`ReadDoneCapture.restore` for this bucket (begun with a fresh event)."""
        facts, outcome, rebound = self._restored_facts(graph, saved, shared_buffers, events)
        facts = self._instantiated(graph, facts, instantiate)
        release = decide_bucket(self.capture.policies, facts, self.capture.name)
        report = attrs.evolve(
            self._report(release, facts, outcome),
            restored=True,
            rebind_us=rebound.rebind_us if rebound is not None else None,
        )
        recorded = self.event if rebound is not None else None
        planted = saved is not None and bool(saved.anchors)
        return self._settled(release, report, facts, outcome, recorded, planted)

    def _instantiated(
        self, graph: GraphHandle, facts: BucketFacts, instantiate: bool | None
    ) -> BucketFacts:
        """Instantiates ``graph`` where asked (by default unless it is a `RawGraph`): sound
        facts become a doubt when the instantiation fails; with a doubt already, the graph is
        instantiated all the same (it must still replay)."""
        if instantiate is None:
            instantiate = not isinstance(graph, RawGraph)
        if instantiate and facts.doubt is None:
            failed = instantiate_kept(self.capture.platform, graph)
            if failed is not None:
                return BucketFacts(self.bucket, doubt=f"bucket {self.bucket}: {failed}")
        elif instantiate:
            instantiate_kept(self.capture.platform, graph)  # the graph must still replay
        return facts

    def _settled(
        self,
        release: BucketRelease,
        report: CaptureReport,
        facts: BucketFacts,
        outcome: PlacementOutcome | None,
        recorded: EventHandle | None,
        demote_refuted: bool,
    ) -> BucketOutcome:
        """The bucket's decided release reported (a demotion on a doubt, or on a refuted
        placement where ``demote_refuted``), notified and bound to its plan: the outcome."""
        c = self.capture
        if facts.doubt is not None or (facts.refuted is not None and demote_refuted):
            c.reporter.demotion(c.name, self.bucket, self._demotion_text(release, facts))
        c.notify(release, eager=False, planted=facts.event is not None)
        plans = c.cell.plans
        plan = plans.planted if facts.event is not None else plans.unplanted
        batch = BucketBatch.bind(plan, release)
        self.outcome = BucketOutcome(release, report, facts, outcome, recorded, batch)
        return self.outcome

    def _restored_facts(
        self,
        graph: GraphHandle,
        saved: SavedAnchors | None,
        shared: SharedBuffers,
        given: Mapping[str, EventHandle] | None,
    ) -> tuple[BucketFacts, PlacementOutcome | None, Rebound | None]:
        c, bucket = self.capture, self.bucket
        where = f"bucket {bucket} (restored): "
        if self._doubt is not None:
            return BucketFacts(bucket, doubt=where + self._doubt), None, None
        if saved is None:
            why = "nothing was saved about its read-done node"
            return BucketFacts(bucket, doubt=where + why), None, None
        if self.event is None:
            why = (
                "no read-done event to rebind to"
                if c.platform.external_events_supported()
                else f"platform {c.platform.name!r} has no external events"
            )
            return BucketFacts(bucket, refuted=where + why), None, None
        events: dict[str, EventHandle] = {RELEASE_LABEL: self.event}
        for label in saved.labels:
            if label in (given or {}):
                events[label] = (given or {})[label]
            elif label not in events:
                extra = c.platform.create_event(external=True)
                c.platform.record(extra)  # a handle, as the fence seeds its own
                events[label] = extra
        # the self-check guards a node whose event the release hands out (as at capture)
        check = c.policies.planted is IN_GRAPH and c.self_check != "off"
        outcome, rebound = rebind_bucket(c.platform, graph, saved, events, shared, check=check)
        if outcome.verdict is Verdict.CONFIRMED:
            return BucketFacts(bucket, event=self.event), outcome, rebound
        if c.self_check == "error":
            raise SelfCheckError(f"{c.name}: {where}{outcome.detail}")
        if outcome.verdict is Verdict.REFUTED:
            return BucketFacts(bucket, refuted=where + outcome.detail), outcome, rebound
        return BucketFacts(bucket, doubt=where + outcome.detail), outcome, rebound

    # -- the facts -------------------------------------------------------------------------------

    def _facts(
        self, graph: GraphHandle, shared: SharedBuffers, marker: EventHandle | None
    ) -> tuple[BucketFacts, PlacementOutcome | None]:
        """What the capture of this bucket verifiably did (and the walk's outcome, if any)."""
        c, bucket = self.capture, self.bucket
        where = f"bucket {bucket}: "
        if self._doubt is not None:
            return BucketFacts(bucket, doubt=where + self._doubt), None
        if c.derived:
            return self._derived_facts(graph, shared)
        if marker is not None:
            return self._engine_marker_facts(graph, shared, marker)
        if self.event is None:
            why = (
                "no in-graph marker on this path"
                if c.platform.external_events_supported()
                else f"platform {c.platform.name!r} has no external events"
            )
            return BucketFacts(bucket, refuted=why), None
        node = self._marks[0] if self._marks else None
        if node is None:
            why = (
                "the plant failed (no confirmed node)"
                if self._marks
                else "the marker was not recorded (mark() not called in the capture body)"
            )
            return BucketFacts(bucket, doubt=where + why), None
        walk = c.walk
        if not walk.needed:
            return BucketFacts(bucket, event=node), None
        if walk.failed is not None:
            return BucketFacts(bucket, doubt=where + walk.failed), None
        if walk.unavailable is not None:
            self._skipped_check(walk.unavailable)
            return BucketFacts(bucket, event=node), None
        return self._checked(graph, shared, node)

    def _checked(
        self, graph: GraphHandle, shared: SharedBuffers, node: EventHandle
    ) -> tuple[BucketFacts, PlacementOutcome | None]:
        c, bucket = self.capture, self.bucket
        outcome = check_bucket_marker(c.platform, graph, shared, node, self.sites)
        if outcome.verdict is Verdict.CONFIRMED:
            return BucketFacts(bucket, event=node), outcome
        if c.self_check == "error":
            raise SelfCheckError(f"{c.name}: bucket {bucket}: {outcome.detail}")
        if outcome.verdict is Verdict.REFUTED:
            return BucketFacts(bucket, refuted=f"bucket {bucket}: {outcome.detail}"), outcome
        return BucketFacts(bucket, doubt=f"bucket {bucket}: {outcome.detail}"), outcome

    def _engine_marker_facts(
        self, graph: GraphHandle, shared: SharedBuffers, marker: EventHandle
    ) -> tuple[BucketFacts, PlacementOutcome | None]:
        """A marker the engine recorded itself: nothing saw the capture state when it was
        recorded, so only a walk can confirm it (else the unplanted answer, never ``in_graph``)."""
        c, bucket = self.capture, self.bucket
        where = f"bucket {bucket}: "
        if not c.platform.external_events_supported():
            return BucketFacts(
                bucket, refuted=f"platform {c.platform.name!r} has no external events"
            ), None
        walk = c.walk
        if c.policies.planted is not IN_GRAPH:  # the node would not be used
            return BucketFacts(bucket, event=marker), None
        if not walk.needed:  # self_check="off", or a capture that records no marker
            why = "the engine's marker cannot be confirmed without the self-check"
            return BucketFacts(bucket, refuted=where + why), PlacementOutcome(Verdict.REFUTED, why)
        if walk.failed is not None:
            return BucketFacts(bucket, doubt=where + walk.failed), None
        if walk.unavailable is not None:
            why = f"the engine's marker cannot be confirmed ({walk.unavailable})"
            return BucketFacts(bucket, refuted=where + why), PlacementOutcome(Verdict.REFUTED, why)
        return self._checked(graph, shared, marker)

    def _derived_facts(
        self, graph: GraphHandle, shared: SharedBuffers
    ) -> tuple[BucketFacts, PlacementOutcome | None]:
        c, bucket = self.capture, self.bucket
        where = f"bucket {bucket}: "
        event = self.event
        if event is None:
            why = (
                "no read-done event for derived placement"
                if c.platform.external_events_supported()
                else f"platform {c.platform.name!r} has no external events"
            )
            return BucketFacts(bucket, refuted=why), None
        walk = c.walk
        if not walk.needed:  # the planted answer is not in_graph: no node wanted
            return BucketFacts(bucket, refuted="derived placement not needed"), None
        if walk.failed is not None:
            return BucketFacts(bucket, doubt=where + walk.failed), None
        if walk.unavailable is not None:
            outcome = PlacementOutcome(Verdict.REFUTED, walk.unavailable)
            return BucketFacts(bucket, refuted=where + walk.unavailable), outcome
        outcome = plant_bucket_derived(c.platform, graph, shared, event, self.sites)
        if outcome.verdict is Verdict.CONFIRMED:
            return BucketFacts(bucket, event=event), outcome
        if outcome.verdict is Verdict.REFUTED:
            return BucketFacts(bucket, refuted=where + outcome.detail), outcome
        return BucketFacts(bucket, doubt=where + outcome.detail), outcome

    def _skipped_check(self, reason: str) -> None:
        """The self-check cannot run here: say so once, on every real platform (a platform
        plugin without a graph walker included); the simulated platform's graphs re-run their
        Python body, so nothing is lost there."""
        c = self.capture
        if not is_simulated(c.platform.device):
            c.reporter.warn("self-check-unavailable", f"marker self-check skipped: {reason}")

    # -- reporting -------------------------------------------------------------------------------

    def _report(
        self, release: BucketRelease, facts: BucketFacts, outcome: PlacementOutcome | None
    ) -> CaptureReport:
        c = self.capture
        walked = outcome is not None and outcome.walked
        ok = None if outcome is None else outcome.confirmed
        if facts.doubt is not None:
            detail = facts.doubt
        elif facts.refuted is not None:
            detail = facts.refuted
        elif outcome is not None:
            detail = outcome.detail
        else:
            detail = "derived" if c.derived else "marker after the metadata prep"
        return CaptureReport(
            self.bucket,
            c.placement,
            release.planted,
            walked,
            ok,
            outcome.walk_ms if outcome is not None else 0.0,
            detail,
            release.policy,
        )

    def _demotion_text(self, release: BucketRelease, facts: BucketFacts) -> str:
        bucket = self.bucket
        if facts.doubt is not None:
            return f"{facts.doubt}; bucket {bucket} publishes nothing (the coarse barrier)"
        if self.capture.derived:
            return (
                f"bucket {bucket}: derived placement left the bucket unplanted "
                f"({facts.refuted}); it publishes no earlier than {release.policy.label}"
            )
        return f"{facts.refuted}; bucket {bucket} demoted to {release.policy.label}"


# -- observers ---------------------------------------------------------------------------------


def notify_decision(
    reporter: Reporter,
    policy: RunnerPolicy | None,
    mode: ForwardMode,
    release: BucketRelease,
    eager: bool,
    planted: bool,
) -> None:
    """Tell the decision observers what a bucket (or the eager path) publishes, with the
    reasons (``where="runner:<name>"``; explaining never changes the release)."""
    if not reporter.observers.on_decision:
        return
    decision = explain(policy, release.source, mode, release, eager, planted, reporter.warn)
    if decision is not None:
        reporter.decision(decision, f"runner:{release.source}")


def explain(
    policy: RunnerPolicy | None,
    name: str,
    mode: ForwardMode,
    release: BucketRelease,
    eager: bool,
    planted: bool,
    warn: Callable[[str, str], None],
) -> Decision | None:
    """The `Decision` behind ``release``: the policy's own explanation when it has one, with
    the runtime's override added when the release differs (a doubt, a failed lookup).
    ``policy`` None (a cell whose policy could not even be compiled): the release's reason."""
    try:
        if policy is None:
            ctx = Context(name, mode, eager=eager, planted=planted)
            why = Reason("runtime-capture", release.reason or "capture-time facts", release.policy)
            return Decision(release.policy, ctx, (why,))
        if isinstance(policy, ExplainedPolicy):
            decision = policy.decision(mode, eager, planted)
        else:
            ctx = Context(name, mode, eager=eager, planted=planted)
            reason = Reason(
                "policy-callable", "given by the engine's policy callable", release.policy
            )
            decision = Decision(release.policy, ctx, (reason,))
        if decision.policy != release.policy:  # the runtime moved it (later, never earlier)
            why = Reason("runtime-capture", release.reason or "capture-time facts", release.policy)
            decision = attrs.evolve(
                decision, policy=release.policy, reasons=(*decision.reasons, why)
            )
    except Exception as exc:  # noqa: BLE001 - explaining never changes the policy
        warn("explain", f"explaining the decision failed ({exc!r})")
        return None
    return decision


__all__ = [
    "SELF_CHECK_MODES",
    "BucketCapture",
    "BucketFacts",
    "BucketOutcome",
    "BucketRelease",
    "CaptureReport",
    "CellPolicy",
    "RELEASE_LABEL",
    "RawGraph",
    "ReadDone",
    "ReadDoneCapture",
    "ReadDoneFence",
    "SavedAnchors",
    "SchedulerBarrier",
    "SelfCheckError",
    "WalkProbe",
    "capturing",
    "cell_policy",
    "decide_bucket",
    "eager_release",
    "explain",
    "notify_decision",
    "parse_placement",
    "placement_of",
    "resolve_cell",
    "shutdown",
    "warm_up",
]
