"""Per-class rows of ``bench overlap --factory``: one read-done per buffer class.

A factory whose subject declares its mode per buffer class (`AuditSubject.declared_classes`)
and whose model writes per class (`ClassScheduled`: the scheduler's writes of one class for
one step) gets three more kinds of row beside the single-GPU variants:

* ``classes``: the runner publishes one read-done per class (classes whose reads end together
  share one) and the scheduler applies, per class, the barrier on that class's read-done
  before that class's writes (`OverlapLoop.step`'s ``class_writes``), its bookkeeping right
  after the first class's writes;
* ``single_event``: the same declaration as one read-done, the latest class (what an engine
  with one barrier gets): every write after it;
* ``omit:CLASS``, for each class whose reads end last: the declaration without it (what
  keeping a base declaration says), one read-done, run with the marker self-check off and
  flagged unsound: its corrupted count shows the race the class's declaration prevents (with
  the self-check on, a walk that sees the class's late reads demotes it first).

Rows use the same columns as every other variant (hold: launch to the *first* barrier's
release; gap closed against the ``coarse`` and ``no_barrier`` rows of the same run).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from typing import (
    Any,
    Protocol,
    runtime_checkable,
)

from warpolicy.bench.overlap import median, same, step_metrics
from warpolicy.registry.vocabulary import WarReadDonePolicy
from warpolicy.runtime.lifetimes import LifetimeStats
from warpolicy.runtime.release import ReadDone, class_policy_fns


@runtime_checkable
class ClassScheduled(Protocol):
    """A model whose scheduler writes per buffer class: ``make_batch(mode, step)`` must be
    `write_class` of every class of `write_classes` in order, then `batch_of` ``step``."""

    def write_classes(self) -> Sequence[str]:
        """The classes the scheduler writes, earliest read end first."""
        ...

    def write_class(self, buffer_class: str, step: int, read_done: ReadDone | None = None) -> None:
        """The scheduler's writes of ``buffer_class`` for ``step``, on the current stream;
        ``read_done``: the latest read-done of the step in flight (what deferred frees of the
        resources it reads wait for), None when unknown."""
        ...

    def batch_of(self, step: int) -> Any:
        """The batch of ``step`` (after its writes)."""
        ...


@runtime_checkable
class ReportsLifetimes(Protocol):
    """A model whose scheduler defers frees (`warpolicy.runtime.lifetimes`): what they held."""

    def lifetime_stats(self) -> Mapping[str, LifetimeStats]:
        """Per kind of resource, what its deferred frees held (now and at most) and did."""
        ...


def lifetime_notes(model: Any) -> list[str]:
    """One line per kind of deferred free a `ReportsLifetimes` model reports (none else)."""
    if not isinstance(model, ReportsLifetimes):
        return []
    return [
        f"deferred frees ({kind}): peak {s.peak_items} items of {s.peak_steps} steps held "
        f"(steps in flight: 2), {s.waits} event waits, {s.coarse} coarse, {s.unknown} held "
        "to a coarse point"
        for kind, s in model.lifetime_stats().items()
    ]


#: (row name, per-class policies, one read-done per class, sound)
ClassVariant = tuple[str, Mapping[str, WarReadDonePolicy], bool, bool]


def class_variants(declared: Mapping[str, WarReadDonePolicy]) -> list[ClassVariant]:
    """The rows of a per-class declaration: ``classes``, ``single_event`` and one ``omit:``
    row per class whose reads end last (when another class ends earlier)."""
    if not declared:
        return []
    latest = max(declared.values())
    rows: list[ClassVariant] = [
        ("classes", dict(declared), True, True),
        ("single_event", dict(declared), False, True),
    ]
    for name, policy in declared.items():
        rest = {c: p for c, p in declared.items() if c != name}
        if policy == latest and rest and max(rest.values()) < latest:
            rows.append((f"omit:{name}", rest, False, False))
    return rows


def measure_classes(
    bench: Any,
    schedule: Any,
    model: ClassScheduled,
    declared: Mapping[str, WarReadDonePolicy],
    repeats: int,
    tokens: float | None,
) -> list[dict]:
    """Every `class_variants` row of ``declared`` on ``bench`` (an `OverlapBench`), in the
    row format of `OverlapBench.measure`."""
    rows = []
    order = list(model.write_classes())

    def writes(
        step: int, in_flight: Callable[[], ReadDone | None]
    ) -> Sequence[tuple[str, Callable[[], Any]]]:
        return [(c, _writer(schedule, c, step, in_flight)) for c in order]

    for name, classes, per_class, is_sound in class_variants(declared):
        cell, per = class_policy_fns(classes)
        runner = bench.runner(
            cell,
            name,
            class_policies=per if per_class else None,
            self_check="warn" if is_sound else "off",  # an unsound row shows its race
        )
        per_run, corrupted = [], 0
        for _ in range(repeats):
            ref = bench.reference(runner)
            outs, t = bench.overlapped(runner, False, class_writes=writes if per_class else None)
            corrupted += sum(not same(a, b) for a, b in zip(outs, ref))
            per_run.append(step_metrics(t, bench.warmup))
        row: dict[str, Any] = {k: median([m[k] for m in per_run]) for k in per_run[0]}
        step_s = row["step_us"] * 1e-6
        latest = max(classes.values())
        row.update(
            name=name,
            policy=latest.label,
            resolved=runner.policy_for(runner.buckets[-1]).label,
            classes={c: p.label for c, p in classes.items()},
            events="per class" if per_class else "one",
            sound=is_sound,
            barrier=True,
            corrupted=corrupted,
            checked=bench.steps * repeats,
            tokens_per_step=tokens,
            tokens_per_s=tokens / step_s if tokens and step_s > 0 else None,
        )
        rows.append(row)
    return rows


def _writer(
    schedule: Any, buffer_class: str, step: int, in_flight: Callable[[], ReadDone | None]
) -> Callable[[], Any]:
    return lambda: schedule.write_class(step, buffer_class, in_flight())


def class_targets(rows: Sequence[dict], written: Collection[str]) -> dict[str, bool]:
    """The bar of the per-class rows: ``classes`` closes at least 90% of the gap with 0
    corrupted steps, and every ``omit:`` row of a class the scheduler writes (``written``, its
    `ClassScheduled.write_classes`) corrupts: the class's declaration matters. A class whose
    writes the scheduler orders otherwise (deferred frees reclaimed a step later: the page-reuse
    decode's ``kv_pages``) has its ``omit:`` row shown, not judged."""
    by = {r["name"]: r for r in rows}
    out: dict[str, bool] = {}
    if "classes" in by:
        row = by["classes"]
        out["classes_closes_90pct"] = row["gap_closed"] is not None and row["gap_closed"] >= 0.9
        out["classes_zero_corrupted"] = row["corrupted"] == 0
    omitted = [r for r in rows if r["name"].startswith("omit:") and r["name"][5:] in written]
    if omitted:
        out["omitted_class_corrupts"] = all(r["corrupted"] > 0 for r in omitted)
    return out


__all__ = [
    "ClassScheduled",
    "ClassVariant",
    "ReportsLifetimes",
    "class_targets",
    "class_variants",
    "lifetime_notes",
    "measure_classes",
]
