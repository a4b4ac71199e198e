"""Per-batch decisions at runtime: the batch's facts, the per-batch actions, the release.

The capture-time decision stays one per bucket (`warpolicy.runtime.release`). A cell whose
policy reads per-batch facts (`CompiledPolicy.rule`) has a `BatchPlan`, built once per capture
(and for the eager path): the bucket is captured and decided for the **earliest** policy any
batch can get (`BatchRule.earliest`, through `lower_policies`), and each batch then publishes

    effective = max(bucket's release, rule(this batch's facts))

so a batch is never released earlier than its bucket's verified release nor earlier than the
registry's answer for its facts. Later means ``post_replay`` (a host event right after the
replay) or ``none`` (nothing: the coarse barrier); a later release is one of the records built
with the plan (`BatchPlan.later`), never a change to the bucket's.

The facts a runner reports (`batch_facts`):

* ``num_qo_tokens`` (an int): the bucket's size for a captured step (the padded graph size),
  the batch's size eager;
* the facts the engine's model adapter reports through `BatchFactsAdapter.batch_facts` (route
  facts such as ``image_prefill_route``); only the non-action facts the cell reads are taken;
* each action the cell names (`BatchPlan.actions`), ``True`` only when the per-batch action
  hook (``warpolicy_batch_action``) says so by the rule in `perform_action`.

Every failure is later, never earlier: a fact of the wrong type is unreported (the rule's
unknown class); an action that returns ``False``, ``None``, a truthy non-bool, has no
implementation, or raises did not succeed; an adapter that raises reports nothing; a rule that
raises publishes nothing for that batch. A ``BaseException`` in a hook or the adapter makes the
step publish nothing (the runner empties its mailbox) and propagates.

A cell with no facts (no rule) has no plan: its steps do no per-batch work at all.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable

import attrs

from warpolicy.registry.vocabulary import (
    DRAFT_EXTEND_STAGED,
    IN_GRAPH,
    NONE,
    POST_REPLAY,
    ForwardMode,
    WarReadDonePolicy,
)
from warpolicy.runtime.observers import ObserverCall, Reporter
from warpolicy.runtime.policy import policy_answer, sound
from warpolicy.runtime.release import BucketRelease, ModePolicies

#: The fact a runner reports itself: the query tokens the forward sees.
NUM_QO_TOKENS = "num_qo_tokens"


class FactRule(Protocol):
    """How one cell's policy depends on a batch's facts (`warpolicy.registry.compiled.BatchRule`)."""

    #: the facts the rule reads
    facts: tuple[str, ...]
    #: the action facts among them (what the runner performs, each once per batch)
    actions: tuple[str, ...]
    #: the policy of a batch that reports nothing
    unknown: WarReadDonePolicy
    #: the earliest policy any batch can get
    earliest: WarReadDonePolicy

    def __call__(self, facts: Mapping[str, object] | None = None) -> WarReadDonePolicy:
        """The policy for a batch reporting ``facts``."""
        ...


@runtime_checkable
class BatchPolicy(Protocol):
    """A policy whose cells may depend on per-batch facts (what ``engine.compile`` returns)."""

    def rule(self, mode: ForwardMode, eager: bool = False, planted: bool = True) -> Any:
        """The cell's `FactRule`, or None when its policy reads no per-batch fact."""
        ...


@runtime_checkable
class BatchFactsAdapter(Protocol):
    """Optional `ModelAdapter` capability: the per-batch facts only the engine knows.

    Called once per batch of a cell that reads a fact the runner cannot measure itself (a
    router's ``image_prefill_route``: the child that runs the whole forward), after
    ``host_prep`` and before anything is published. Return a plain mapping; a value of the
    wrong type, a name the cell does not read, an action fact (actions are reported only by the
    action hook) or an exception count as unreported (the later policy).
    """

    def batch_facts(self, mode: ForwardMode, batch: Any) -> Mapping[str, object]:
        """The batch's facts by name (e.g. ``{"image_prefill_route": "image"}``)."""
        ...


@runtime_checkable
class ExplainedBatchPolicy(Protocol):
    """A policy that explains a per-batch lookup (observers receive the `Decision`)."""

    def decision(
        self,
        mode: ForwardMode,
        eager: bool = False,
        planted: bool = True,
        facts: Mapping[str, object] | None = None,
    ) -> Any:
        """The full decision behind ``lookup(mode, eager, planted, facts)``."""
        ...


@attrs.frozen(eq=False)
class BatchPlan:
    """What one cell (mode, eager, planted) does per batch, resolved once.

    ``rule``: the cell's rule; ``tokens``: whether it reads ``num_qo_tokens``; ``reported``:
    the non-action facts taken from the model adapter; ``actions``: the actions performed,
    each at most once per batch; ``eager`` / ``planted``: the cell.
    """

    mode: ForwardMode
    eager: bool
    planted: bool
    rule: FactRule = attrs.field(repr=False)
    tokens: bool
    reported: tuple[str, ...]
    actions: tuple[str, ...]

    def later(self, release: BucketRelease) -> dict[WarReadDonePolicy, BucketRelease]:
        """The releases a batch of ``release``'s bucket may publish instead of it: the later
        ones (``post_replay``, ``none``), built once per bucket."""
        out: dict[WarReadDonePolicy, BucketRelease] = {}
        for policy in (POST_REPLAY, NONE):
            if policy > release.policy:
                out[policy] = BucketRelease(
                    release.source,
                    release.bucket,
                    policy,
                    reason=f"per batch: this batch's facts give {policy.label}",
                )
        return out


@attrs.frozen
class CellPlans:
    """The plans of a mode's three cells (None: that cell reads no per-batch fact)."""

    planted: BatchPlan | None = None
    unplanted: BatchPlan | None = None
    eager: BatchPlan | None = None

    def any(self) -> bool:
        return not (self.planted is None and self.unplanted is None and self.eager is None)


NO_PLANS = CellPlans()


def plan_cell(
    policy: object, mode: ForwardMode, eager: bool, planted: bool, reporter: Reporter
) -> BatchPlan | None:
    """The cell's `BatchPlan`, or None (no rule, or a policy that is not a `BatchPolicy`). A
    rule that cannot be read (raises, or is malformed) is None: the cell then keeps the answer
    of a batch that reports nothing (later), and never the earliest."""
    if not isinstance(policy, BatchPolicy):
        return None
    try:
        rule = policy.rule(mode, eager, planted)
        if rule is None:
            return None
        facts = tuple(str(f) for f in rule.facts)
        actions = tuple(str(a) for a in rule.actions)
        policy_answer(rule.earliest)
        policy_answer(rule.unknown)
        if not callable(rule):
            raise TypeError(f"the rule {rule!r} is not callable")
    except Exception as exc:  # noqa: BLE001 - no plan: the later answer stays
        reporter.fallback(
            "batch_rule", exc, f"reading the per-batch rule of {mode.label} failed ({exc!r})"
        )
        return None
    reported = tuple(f for f in facts if f != NUM_QO_TOKENS and f not in actions)
    return BatchPlan(mode, eager, planted, rule, NUM_QO_TOKENS in facts, reported, actions)


def cell_plans(policy: object, mode: ForwardMode, reporter: Reporter) -> CellPlans:
    """The plans of ``mode``'s three cells (graph with a confirmed node, without, eager)."""
    if not isinstance(policy, BatchPolicy):
        return NO_PLANS
    return CellPlans(
        plan_cell(policy, mode, False, True, reporter),
        plan_cell(policy, mode, False, False, reporter),
        plan_cell(policy, mode, True, False, reporter),
    )


def lower_policies(policies: ModePolicies, plans: CellPlans) -> ModePolicies:
    """The answers a capture decides buckets by: each cell with a plan at the earliest policy
    any batch can get (through `sound`), so a batch whose facts allow it can publish that early;
    each batch is then held to its own answer (`effective_policy`). A failed lookup stays
    coarse."""
    if policies.failure is not None or not plans.any():
        return policies

    def low(answer: WarReadDonePolicy, plan: BatchPlan | None) -> WarReadDonePolicy:
        if plan is None:
            return answer
        return min(answer, sound(policy_answer(plan.rule.earliest), plan.eager, plan.planted))

    return attrs.evolve(
        policies,
        planted=low(policies.planted, plans.planted),
        unplanted=low(policies.unplanted, plans.unplanted),
        eager=low(policies.eager, plans.eager),
    )


# -- per batch ----------------------------------------------------------------------------------


def perform_action(
    calls: tuple[ObserverCall, ...],
    action: str,
    runner: str,
    mode: ForwardMode,
    bucket: int | None,
    batch: object,
    reporter: Reporter,
) -> bool:
    """Ask every implementation of ``warpolicy_batch_action`` to perform ``action``; whether it
    succeeded: at least one answer exactly ``True``, none other than ``True`` / ``None`` and no
    exception (independent of call order; every implementation is asked). An ``Exception`` is
    reported (``warpolicy_on_fallback``); a ``BaseException`` propagates (the caller makes the
    step coarse first)."""
    done = False
    failed = False
    for call in calls:
        try:
            result = call.call(action, runner, mode, bucket, batch)
        except Exception as exc:  # noqa: BLE001 - not performed: the later policy
            failed = True
            reporter.fallback(
                "batch_action",
                exc,
                f"the per-batch action {action!r} of {call.plugin!r} raised ({exc!r}); this "
                "batch gets the later policy",
            )
            continue
        for answer in result if call.whole and isinstance(result, list) else (result,):
            if answer is True:
                done = True
            elif answer is not None:
                failed = True
                if answer is not False:
                    reporter.warn(
                        f"batch_action:{action}:{call.plugin}",
                        f"the per-batch action {action!r} of {call.plugin!r} answered "
                        f"{answer!r}, not True/False/None; taken as not performed",
                    )
    return done and not failed


def measured_facts(
    plan: BatchPlan,
    size: int,
    bucket: int | None,
    batch: object,
    model: object,
    reporter: Reporter,
) -> dict[str, object]:
    """The facts of one batch the runner measures or the model reports (no action yet)."""
    facts: dict[str, object] = {}
    if plan.tokens:
        facts[NUM_QO_TOKENS] = bucket if bucket is not None else size
    if plan.reported:
        if isinstance(model, BatchFactsAdapter):
            try:
                given = model.batch_facts(plan.mode, batch)
                for name in plan.reported:
                    if name in given:
                        facts[name] = given[name]
            except Exception as exc:  # noqa: BLE001 - unreported: the later policy
                for name in plan.reported:
                    facts.pop(name, None)
                reporter.fallback(
                    "batch_facts",
                    exc,
                    f"the model's batch_facts raised ({exc!r}); its facts are unreported",
                )
        else:
            reporter.warn(
                "batch-facts-unsupported",
                f"the cell reads {', '.join(plan.reported)} but the model "
                f"({type(model).__name__}) has no batch_facts (BatchFactsAdapter): unreported, "
                "so those batches get the later policy",
            )
    return facts


def effective_policy(
    release: BucketRelease, plan: BatchPlan, facts: Mapping[str, object], reporter: Reporter
) -> WarReadDonePolicy:
    """``max(release.policy, rule(facts))`` through `sound`; an in_graph answer for a bucket
    whose release hands out no event is post_replay; a rule that raises is ``none``."""
    try:
        answer = sound(policy_answer(plan.rule(facts)), plan.eager, plan.planted)
    except Exception as exc:  # noqa: BLE001 - the coarse barrier for this batch
        reporter.fallback("batch_rule", exc, f"the per-batch lookup raised ({exc!r})")
        return NONE
    policy = release.policy
    if answer <= policy:
        return policy
    if answer is IN_GRAPH and release.event is None:
        return POST_REPLAY
    return answer


@attrs.frozen(eq=False)
class BucketBatch:
    """A bucket's (or the eager path's) per-batch plan bound to its release: the later
    releases a batch may publish instead (`BatchPlan.later`), built once."""

    plan: BatchPlan
    release: BucketRelease
    later: Mapping[WarReadDonePolicy, BucketRelease] = attrs.field(repr=False)

    @classmethod
    def bind(cls, plan: BatchPlan | None, release: BucketRelease) -> BucketBatch | None:
        """None when there is nothing to do per batch (no plan, or a release of ``none``)."""
        if plan is None or release.policy is NONE:
            return None
        return cls(plan, release, plan.later(release))

    def step(
        self,
        size: int,
        bucket: int | None,
        batch: object,
        runner: str,
        model: object,
        calls: tuple[ObserverCall, ...],
        reporter: Reporter,
    ) -> tuple[BucketRelease, dict[str, object]]:
        """This batch's release (the bucket's, or a later one) and the facts it reported.

        The actions run only when the batch would otherwise publish later than its bucket (an
        action cannot make it earlier than the bucket's release, and a batch whose facts
        already allow the bucket's needs none); each once, through the action hook."""
        plan, release = self.plan, self.release
        facts = measured_facts(plan, size, bucket, batch, model, reporter)
        policy = effective_policy(release, plan, facts, reporter)
        if calls and plan.actions and policy is not release.policy:
            performed = False
            for action in plan.actions:
                if perform_action(calls, action, runner, plan.mode, bucket, batch, reporter):
                    facts[action] = True
                    performed = True
            if performed:
                policy = effective_policy(release, plan, facts, reporter)
        elif plan.actions and policy is not release.policy:
            reporter.warn(
                "batch-action-missing",
                f"no warpolicy_batch_action implementation performs {', '.join(plan.actions)} "
                "(register one on the plugin manager whose observers the runner was built "
                "with): those batches publish later",
            )
        if policy is release.policy:
            return release, facts
        return self.later[policy], facts


__all__ = [
    "DRAFT_EXTEND_STAGED",
    "NO_PLANS",
    "NUM_QO_TOKENS",
    "BatchFactsAdapter",
    "BatchPlan",
    "BatchPolicy",
    "BucketBatch",
    "CellPlans",
    "ExplainedBatchPolicy",
    "FactRule",
    "measured_facts",
    "cell_plans",
    "effective_policy",
    "lower_policies",
    "perform_action",
    "plan_cell",
]
