"""The harness's engine parts: a model with shared buffers, its graph model, observers, policy.

`HarnessModel` is a `ModelAdapter` whose every callback is a fault target and whose shared
reads and private work are logged into the platform's call log (`Harness.read` /
`Harness.work`), at the stages its *read plan* names: ``host_prep`` (a snapshotting backend:
``pre_replay``), ``graph_prep`` (the in-graph metadata prep: ``in_graph``) and ``forward``
(a reader after the marker: ``post_replay``, or a late reader the self-check must catch).

With a WAR canary (the ``canary`` scenario) the model is also a `CanaryAdapter`: its shared
buffers are `LoggedSnapshot` entries, so every save the canary makes is a logged read and every
load a logged write, and the oracle judges the canary's own ordering (its saves before the
release, its restores and replay after the step and the scheduler's writes, its put-back
before the next forward's reads) exactly like the scheduler's.

`graph_model` turns what a capture really logged into a `warpolicy.runtime.graphwalk.Graph`
(a chain: shared reads are kernels pointing into the shared buffers, private work kernels
pointing elsewhere, the planted record an event-record node), so derived placement and the
marker self-check run on the truth of each capture.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

import attrs

from warpolicy.registry.compiled import CompiledPolicy
from warpolicy.registry.engine import PolicyEngine
from warpolicy.registry.vocabulary import ForwardMode, WarReadDonePolicy
from warpolicy.runtime.canary import CanarySpec
from warpolicy.runtime.graphwalk import Graph, Node, NodeKind
from warpolicy.runtime.hookspecs import OBSERVER_HOOKS, hookimpl
from warpolicy.testing.faults.injection import Injector
from warpolicy.testing.perbatch import perbatch_policy


class HarnessCalls(Protocol):
    """What the model side needs of one case's `warpolicy.testing.faults.harness.Harness`
    (which builds on this module, so the model names the protocol, not the class)."""

    injector: Injector
    #: the model whose per-batch snapshot the action hook builds (the per_batch scenario)
    snapshot_model: Any | None

    def read(self, label: str) -> None: ...
    def work(self, label: str) -> None: ...
    def write(self, label: str = "write", through: int | None = None) -> None: ...
    def pause(self) -> None: ...
    def replaying(self) -> int | None: ...
    def replay_stage(self, graph: int, label: str) -> None: ...


#: Where the model reads shared state, per stage, for each read plan.
READ_PLANS: Mapping[str, frozenset[str]] = {
    "host": frozenset({"host_prep"}),  # snapshots during host prep: pre_replay is sound
    "prep": frozenset({"graph_prep"}),  # in-graph prep only: in_graph is sound
    "late": frozenset({"graph_prep", "forward"}),  # a reader after the marker
}

#: Model callbacks the harness can fail.
MODEL_TARGETS = (
    "bucket_sizes",
    "prepare_bucket",
    "batch_size",
    "host_prep",
    "graph_prep",
    "forward",
    "canary_spec",
)
#: Observer hooks the harness implements but does not fail: no path of the harness calls them.
#: ``warpolicy_on_violation`` fires when the WAR canary's replay differs from the step, and the
#: harness's model has no values to differ (its reads and writes are log entries);
#: tests/runtime/test_canary.py drives it, observers that raise included. A test checks they
#: stay uncalled here; once a scenario calls one, it belongs in `OBSERVER_TARGETS`.
UNCALLED_OBSERVERS = ("warpolicy_on_violation",)
#: The observer hooks the harness implements and can fail: every hookspec's but the uncalled
#: (the release lead's: the ``canary`` scenario times every step).
OBSERVER_TARGETS = tuple(hook for hook in OBSERVER_HOOKS if hook not in UNCALLED_OBSERVERS)
#: The per-batch action hook: the harness implements it (it builds the ``per_batch`` scenario's
#: snapshot and answers True); the ``per_batch`` scenario's prefill calls it.
ACTION_TARGETS = ("warpolicy_batch_action",)
#: The ``per_batch`` scenario's threshold: a forward over more tokens reads shared state unless
#: the batch's snapshot was built (the extend buckets are 4 and 8: one on each side).
PER_BATCH_THRESHOLD = 4

_SHARED_BASE = 0x10_0000
_PRIVATE_BASE = 0x80_0000
_BUFFER_BYTES = 0x1000


@attrs.frozen
class FakeBuffer:
    """A device buffer as far as the graph walk cares (`TensorLike`: address and extent)."""

    address: int
    nbytes: int

    @property
    def shape(self) -> tuple[int, ...]:
        return (self.nbytes,)

    def data_ptr(self) -> int:
        return self.address

    def numel(self) -> int:
        return self.nbytes

    def stride(self) -> tuple[int, ...]:
        return (1,)

    def element_size(self) -> int:
        return 1


SHARED_BUFFERS: Mapping[str, FakeBuffer] = {
    "req_to_token": FakeBuffer(_SHARED_BASE, _BUFFER_BYTES),
    "seq_lens": FakeBuffer(_SHARED_BASE + 2 * _BUFFER_BYTES, _BUFFER_BYTES),
}


class LoggedSnapshot:
    """A shared buffer as the WAR canary sees it (`warpolicy.runtime.canary.Snapshot`): a save
    is a logged read of it, a load a logged write (on the current stream)."""

    def __init__(self, harness: HarnessCalls, label: str, nbytes: int) -> None:
        self.harness = harness
        self.label = label
        self.nbytes = nbytes

    def save(self) -> Any:
        self.harness.read(f"canary.save.{self.label}")
        return self.label

    def load(self, saved: Any) -> None:
        self.harness.write(f"canary.load.{self.label}")


class HarnessModel:
    """A `ModelAdapter` reading shared state where ``reads`` says (a set of stages)."""

    def __init__(
        self,
        harness: HarnessCalls,
        reads: frozenset[str],
        buckets: Mapping[ForwardMode, Sequence[int]],
        name: str = "model",
    ) -> None:
        self.harness = harness
        self.reads = reads
        self.buckets = buckets
        self.name = name
        self.shared_buffers: Mapping[str, FakeBuffer] = SHARED_BUFFERS

    def _call(self, target: str, act: Callable[[], Any]) -> Any:
        if self.harness.replaying() is not None:
            return act()  # a replay re-runs the captured body: not a call
        return self.harness.injector.call(target, act)

    def _stage(self, stage: str) -> None:
        graph = self.harness.replaying()
        if graph is not None:
            self.harness.replay_stage(graph, f"{self.name}.{stage}")
            return
        if stage in self.reads:
            self.harness.read(f"{self.name}.{stage}")
        self.harness.work(f"{self.name}.{stage}")

    def bucket_sizes(self, mode: ForwardMode) -> Sequence[int]:
        return self._call("bucket_sizes", lambda: tuple(self.buckets.get(mode, ())))

    def prepare_bucket(self, bucket: int) -> None:
        self._call("prepare_bucket", lambda: None)

    def batch_size(self, batch: Any) -> int:
        return self._call("batch_size", lambda: len(batch))

    def host_prep(self, batch: Any, bucket: int) -> None:
        self.harness.pause()
        self._call("host_prep", lambda: self._stage("host_prep"))

    def graph_prep(self, bucket: int) -> None:
        self._call("graph_prep", lambda: self._stage("graph_prep"))

    def forward(self, bucket: int) -> Any:
        def act() -> Any:
            self._stage("forward")
            return (self.name, bucket)

        return self._call("forward", act)

    def canary_spec(self, mode: ForwardMode, bucket: int, batch: Any) -> CanarySpec | None:
        """The WAR canary's spec: every shared buffer, logged (`LoggedSnapshot`)."""

        def act() -> CanarySpec:
            inputs = {
                name: LoggedSnapshot(self.harness, f"{self.name}.{name}", buffer.nbytes)
                for name, buffer in self.shared_buffers.items()
            }
            return CanarySpec(inputs=inputs)

        return self._call("canary_spec", act)


class PerBatchModel(HarnessModel):
    """A prefill that reads shared state in host prep (its snapshot point: ``pre_replay`` is
    sound) and, for a forward over more than ``threshold`` tokens, in the forward too unless
    the batch's snapshot was built (`snapshot`, by the action hook): the synthetic twin of
    DeepSeek-V4's sparse prefill. A graph captured for such a bucket logs the forward's read;
    its replays repeat it unless that batch was snapshotted (the replay then reads the copy)."""

    def __init__(
        self,
        harness: HarnessCalls,
        threshold: int,
        buckets: Mapping[ForwardMode, Sequence[int]],
        name: str = "extend",
    ) -> None:
        super().__init__(harness, READ_PLANS["host"], buckets, name)
        self.threshold = threshold
        self.snapshotted = False

    def host_prep(self, batch: Any, bucket: int) -> None:
        self.snapshotted = False  # each batch builds its own snapshot
        super().host_prep(batch, bucket)

    def snapshot(self) -> None:
        """Copy the shared reads of the forward (a read, on the current stream, before the
        step's release point) for this batch."""
        self.harness.read(f"{self.name}.snapshot")
        self.snapshotted = True

    def forward(self, bucket: int) -> Any:
        label = f"{self.name}.forward"

        def act() -> Any:
            snapshotted, self.snapshotted = self.snapshotted, False  # one forward per batch
            graph = self.harness.replaying()
            if graph is not None:
                if snapshotted:
                    self.harness.work(label)
                else:
                    self.harness.replay_stage(graph, label)
                return (self.name, bucket)
            if bucket > self.threshold and not snapshotted:
                self.harness.read(label)
            self.harness.work(label)
            return (self.name, bucket)

        return self._call("forward", act)


class StagedModel(HarnessModel):
    """A draft extend whose shared reads (its ``reads`` plan) are staged by verify's per-batch
    action ``draft_extend_staged``: once `snapshot` (the staging copy, a logged read before
    verify's release point) ran for this step, its prep and forward read the staged copies
    (private work only), in replays too; ``staged`` is cleared by verify's host prep
    (`ResettingModel`) and consumed by the forward."""

    staged = False

    def snapshot(self) -> None:
        self.harness.read(f"{self.name}.stage")
        self.staged = True

    def _stage(self, stage: str) -> None:
        if self.staged and stage in ("graph_prep", "forward"):
            self.harness.work(f"{self.name}.{stage}")
            if stage == "forward":
                self.staged = False
            return
        super()._stage(stage)


class ResettingModel(HarnessModel):
    """Target verify: a step starts here, so the draft extend's staging of the step before
    (if its draft extend never ran) does not count for this one."""

    def __init__(self, *args: Any, staged: StagedModel, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.staged_model = staged

    def host_prep(self, batch: Any, bucket: int) -> None:
        self.staged_model.staged = False
        super().host_prep(batch, bucket)


@functools.cache
def _per_batch_compiled(threshold: int) -> CompiledPolicy:
    return perbatch_policy(threshold)


@functools.cache
def eagle_compiled() -> CompiledPolicy:
    """The default registry's fa3 + EAGLE: verify ``in_graph`` only after
    ``draft_extend_staged``, draft extend ``none``."""
    return PolicyEngine.load(environ={}).compile("fa3", "eagle", strict=True)


class BatchPolicyTable:
    """The ``per_batch`` scenario's policy: the registry's compiled ``perbatch_prefill`` (a
    fact-dependent cell; `warpolicy.testing.perbatch`) whose lookups are the ``policy`` fault
    target (``compiled``: another compiled policy, e.g. `eagle_compiled`). ``trusting`` (a
    positive control's engine bug): its rule takes every action as succeeded whatever the hook
    answered."""

    def __init__(
        self,
        harness: HarnessCalls,
        threshold: int = 0,
        *,
        trusting: bool = False,
        compiled: CompiledPolicy | None = None,
    ) -> None:
        self.harness = harness
        self.compiled = compiled if compiled is not None else _per_batch_compiled(threshold)
        self.trusting = trusting

    def lookup(
        self, mode: ForwardMode, eager: bool = False, planted: bool = True
    ) -> WarReadDonePolicy:
        return self.harness.injector.call(
            "policy", lambda: self.compiled.lookup(mode, eager, planted)
        )

    def rule(self, mode: ForwardMode, eager: bool = False, planted: bool = True) -> Any:
        rule = self.compiled.rule(mode, eager, planted)
        if rule is None or not self.trusting:
            return rule
        return _TrustingRule(rule)


class _TrustingRule:
    """A rule that reads every batch as if its actions succeeded (a bug, for a control)."""

    def __init__(self, rule: Any) -> None:
        self.rule = rule
        self.facts = rule.facts
        self.actions = rule.actions
        self.unknown = rule.unknown
        self.earliest = rule.earliest

    def __call__(self, facts: Mapping[str, object] | None = None) -> WarReadDonePolicy:
        return self.rule({**(facts or {}), **dict.fromkeys(self.actions, True)})


def graph_model(
    captured: Sequence[tuple], planted: set[int], renamed: Mapping[int, int] | None = None
) -> Graph:
    """The chain of nodes one capture logged (see the module docstring); ``renamed``: the event
    a node records now for the event the capture recorded (a restored clone's)."""
    nodes: list[Node] = []

    def add(kind: NodeKind, **fields: Any) -> None:
        index = len(nodes)
        nodes.append(Node(index, kind, deps=(index - 1,) if index else (), **fields))

    shared = [b.address for b in SHARED_BUFFERS.values()]
    for entry in captured:
        kind = entry[0]
        if kind == "read":
            add(NodeKind.KERNEL, name=str(entry[4]), words=(shared[len(nodes) % len(shared)],))
        elif kind == "work":
            add(NodeKind.KERNEL, name=str(entry[2]), words=(_PRIVATE_BASE + 8 * len(nodes),))
        elif kind == "record" and entry[3] is True:
            event = (renamed or {}).get(entry[1], entry[1])
            if event in planted:
                add(NodeKind.EVENT_RECORD, event=int(event))
    return Graph(nodes)


class HarnessObservers:
    """Every observer hook (one counting implementation per hookspec, derived below from
    `OBSERVER_HOOKS`); each call is a fault target (the work done is counting it).

    One instance serves every case of a process (building a plugin manager costs more than a
    case): ``harness`` is the case running now."""

    def __init__(self, harness: HarnessCalls | None = None) -> None:
        self.harness = harness
        self.seen: dict[str, int] = {}

    def _call(self, hook: str) -> None:
        def act() -> None:
            self.seen[hook] = self.seen.get(hook, 0) + 1

        if self.harness is not None:
            self.harness.injector.call(hook, act)

    @hookimpl
    def warpolicy_batch_action(
        self, action: str, runner: str, mode: Any, bucket: int | None, batch: object
    ) -> bool | None:
        """Build the snapshot of the harness's `PerBatchModel` and answer True (a fault target:
        ``raise`` / ``interrupt`` / ``base`` before acting, ``none`` / ``false`` / ``nonbool``
        answer without acting, ``act_then_raise`` acts and raises)."""
        harness = self.harness
        if harness is None:
            return None
        model = harness.snapshot_model

        def act() -> bool | None:
            self.seen["warpolicy_batch_action"] = self.seen.get("warpolicy_batch_action", 0) + 1
            if not isinstance(model, (PerBatchModel, StagedModel)):
                return None
            model.snapshot()
            return True

        result: bool | None = harness.injector.call("warpolicy_batch_action", act)
        return result


def _counting(hook: str) -> Callable[[HarnessObservers], None]:
    """The harness's implementation of one observer hook: it takes no argument (pluggy passes
    an implementation only the arguments it names) and counts the call, a fault target."""

    def observe(self: HarnessObservers) -> None:
        self._call(hook)

    observe.__name__ = observe.__qualname__ = hook
    return hookimpl(observe)


for _hook in OBSERVER_HOOKS:
    setattr(HarnessObservers, _hook, _counting(_hook))


def policy_table(
    harness: HarnessCalls, table: Mapping[ForwardMode, WarReadDonePolicy]
) -> Callable[[ForwardMode, bool, bool], WarReadDonePolicy]:
    """A ``(mode, eager, planted)`` policy callable answering ``table[mode]`` (a fault target;
    the runner applies sound demotion itself)."""

    def policy(mode: ForwardMode, eager: bool, planted: bool) -> WarReadDonePolicy:
        return harness.injector.call("policy", lambda: table[mode])

    return policy
