"""Overlap benchmark on your own model: ``warpolicy bench overlap --factory MODULE:CALLABLE``.

The factory is the one ``warpolicy audit --factory`` takes: a callable that gets the `Platform`
and returns an `warpolicy.audit.AuditSubject` (or a list of them). Of each subject the benchmark
uses only what the audit does: its ``model`` (a `ModelAdapter`), ``make_batch(mode, step)``,
its ``extra_outputs`` and the mode of its runners (decode when it has one, else its first).

The scheduler (`SubjectSchedule`) is the subject's own ``make_batch``: step ``k``'s batch is
``make_batch(mode, k)``, called by the scheduler before step ``k`` runs, on the schedule stream
in the overlapped run (right after step ``k - 1``'s barrier), followed by the bookkeeping work
(``sched_kind``, about ``sched_us``). Whatever ``make_batch`` writes to the model's shared
buffers (request-to-token rows, page tables, ...) is the write that races an early release, so
a factory whose ``make_batch`` writes nothing shared measures the overlap but cannot show a
race: the result says so. Before every run the shared buffers and ``extra_outputs`` are put
back as they were when the subject was built, so the overlapped run and its sequential
reference start from the same state.

The variants are the single-GPU benchmark's minus ``pre_replay``: ``coarse``, ``post_replay``,
``in_graph`` (the marker after ``graph_prep``, self-checked at capture), ``derived`` and
``no_barrier`` (the unsafe bound), each run through the model in runners of the subject's mode.
Per variant: hold, step time, idle gap, tokens/s, the share of the coarse-to-unsafe gap
closed, and corrupted steps against a sequential reference; the ideal release (the end of
``graph_prep``) is measured by replaying a graph of ``graph_prep`` alone (`PrepOnly`).

`warpolicy.bench.llama` ships such a factory: a Llama-shaped decode on SGLang's Triton
attention (``--factory warpolicy.bench.llama:decode``).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from typing import Any

from warpolicy.audit.api import call_factory, resolve_factory
from warpolicy.audit.subject import AuditSubject
from warpolicy.bench.command import Report, Variant, option
from warpolicy.bench.overlap import ROWS as OVERLAP_ROWS
from warpolicy.bench.overlap import OverlapBench, format_measurement, gap_closed, write_trace
from warpolicy.bench.overlap_classes import (
    ClassScheduled,
    class_targets,
    lifetime_notes,
    measure_classes,
)
from warpolicy.bench.restored import ROWS as RESTORED_ROWS
from warpolicy.bench.rig import check_sched_kind, device_name, open_rig, rig_of, torch_version
from warpolicy.errors import InputError
from warpolicy.progress import NO_PROGRESS, Progress
from warpolicy.registry.inputs import parse_positive_int
from warpolicy.registry.vocabulary import PRE_REPLAY, ForwardMode, WarReadDonePolicy
from warpolicy.runtime.platforms import Platform

#: The synthetic benchmark's variants but pre_replay (a declaration, not a placement: it says
#: nothing about a model the bench does not know) and the restored rows (the synthetic
#: model's). Each is sound whatever the model but the unsafe bound: the self-check demotes a
#: refuted marker.
ROWS: tuple[tuple[str, WarReadDonePolicy, bool, bool], ...] = tuple(
    variant
    for variant in OVERLAP_ROWS
    if variant[1] is not PRE_REPLAY and variant[0] not in RESTORED_ROWS
)

#: The bookkeeping matmul's width when ``sched_kind="matmul"`` (as the synthetic benchmark).
SCHED_HIDDEN = 2048


class SubjectSchedule:
    """The scheduler of an audit subject: step ``k``'s writes and batch are
    ``make_batch(mode, k)`` on the current stream (see the module docstring)."""

    def __init__(self, subject: AuditSubject, mode: ForwardMode) -> None:
        self.subject = subject
        self.mode = mode
        self._shared = _tensors(subject.model.shared_buffers)
        self._extra = _tensors(subject.extra_outputs)
        self._initial = {name: t.clone() for name, t in self._shared.items()}
        self._extra_initial = {name: t.clone() for name, t in self._extra.items()}
        self._batches: dict[int, Any] = {}

    def reset(self) -> None:
        for name, saved in self._initial.items():
            self._shared[name].copy_(saved)
        for name, saved in self._extra_initial.items():
            self._extra[name].copy_(saved)
        self._batches.clear()  # the device is idle here: every run ends with a synchronize

    def write_step(self, step: int) -> None:
        self._batches[step] = self.subject.make_batch(self.mode, step)

    def write_class(self, step: int, buffer_class: str, read_done: Any = None) -> None:
        """The writes of one buffer class for ``step`` (a `ClassScheduled` model's; ``read_done``
        the step in flight's latest); the batch of ``step`` is known once a class is written."""
        model = self.subject.model
        if not isinstance(model, ClassScheduled):
            raise InputError(f"subject {self.subject.name!r}: its model writes no class")
        model.write_class(buffer_class, step, read_done)
        self._batches[step] = model.batch_of(step)

    def batch(self, step: int) -> Any:
        return self._batches[step]

    def writes_shared(self) -> bool:
        """Whether the steps since the last `reset` changed a shared buffer (call it after a
        run, with the device idle)."""
        import torch  # noqa: PLC0415 - deferred: importing the benchmarks does not need torch

        return any(not torch.equal(t, self._initial[n]) for n, t in self._shared.items())


def _tensors(buffers: Any) -> dict[str, Any]:
    """The tensors of a name -> tensor mapping (anything else, e.g. address ranges, is skipped:
    it cannot be put back)."""
    if not hasattr(buffers, "items"):
        return {}
    return {str(n): t for n, t in buffers.items() if hasattr(t, "copy_") and hasattr(t, "clone")}


def subject_mode(subject: AuditSubject) -> ForwardMode:
    """Decode when the subject has a runner for it, else its first mode."""
    modes = list(subject.runners)
    if not modes:
        raise InputError(f"subject {subject.name!r} has no runner, so no mode to benchmark")
    return ForwardMode.DECODE if ForwardMode.DECODE in modes else modes[0]


def run_factory_overlap(
    factory: str,
    *,
    steps: int = 150,
    repeats: int = 3,
    device: Any = None,
    sched_kind: str = "copy",
    sched_us: float = 300.0,
    warmup: int = 10,
    trace: str | None = None,
    platform: Platform | None = None,
    pm: Any = None,
    progress: Progress = NO_PROGRESS,
) -> dict:
    """Benchmark every subject the factory returns; the result dict (`format_factory_overlap`).
    ``progress`` hears of the factory's set-up and of each (subject, variant) as it runs.

    ``device``: ``cuda`` (default) or ``sim`` (the simulated platform: host times, numbers
    meaningless, for tests and demos). ``platform`` (tests) is handed to the factory as is.
    Raises `CudaUnavailableError` without CUDA (unless simulated), `InputError` for a bad
    factory, and whatever `WarpolicyError` the factory raises (e.g. missing kernel files).
    """
    steps = parse_positive_int(steps, "--steps")
    repeats = parse_positive_int(repeats, "repeats")
    check_sched_kind(sched_kind)
    make = resolve_factory(factory)  # one line for a bad MODULE:CALLABLE, before any device work
    rig = (
        open_rig(device, "bench overlap --factory", pm=pm) if platform is None else rig_of(platform)
    )
    platform = rig.platform
    progress.note(f"building the subjects of {factory} (kernels may compile)")
    subjects = call_factory(make, factory, platform)
    progress.planned(len(subjects) * len(ROWS))
    warmup = min(warmup, max(steps - 2, 0))
    bookkeeping = rig.bookkeeping(sched_kind, sched_us, SCHED_HIDDEN)
    measured, traces = [], {}
    for subject in subjects:
        one, marks = _measure_subject(
            subject, platform, bookkeeping, steps, repeats, warmup, rig.probe, progress
        )
        measured.append(one)
        traces.update({f"{subject.name}:{name}": t for name, t in marks.items()})
    result: dict[str, Any] = {
        "config": {
            "factory": factory,
            "steps": steps,
            "repeats": repeats,
            "warmup": warmup,
            "sched_kind": sched_kind,
            "sched_us_target": sched_us,
            "platform": platform.name,
            "device": device_name(platform),
            "torch": torch_version(),
        },
        "subjects": measured,
    }
    if trace:
        write_trace(trace, traces)
        result["trace"] = str(trace)
    return result


def _measure_subject(
    subject: AuditSubject,
    platform: Platform,
    bookkeeping: Callable[[], None],
    steps: int,
    repeats: int,
    warmup: int,
    probe_factory: Callable[[], Any],
    progress: Progress = NO_PROGRESS,
) -> tuple[dict, dict]:
    mode = subject_mode(subject)
    buckets = [int(b) for b in subject.model.bucket_sizes(mode)]
    if not buckets:
        raise InputError(
            f"subject {subject.name!r}: the model has no capture bucket for {mode.label}, so "
            "there is no graph to overlap"
        )
    schedule = SubjectSchedule(subject, mode)
    bench = OverlapBench(
        platform, subject.model, schedule, bookkeeping, steps, warmup, probe_factory, mode
    )
    ideal = bench.ideal_us()
    rows, traces, captures = bench.measure(ROWS, repeats, progress, subject.name)
    declared = subject.declared_classes.get(mode, {})
    bar = targets(rows)
    if declared and isinstance(subject.model, ClassScheduled):
        tokens = rows[0].get("tokens_per_step") if rows else None
        rows += measure_classes(bench, schedule, subject.model, declared, repeats, tokens)
        gap_closed(rows)
        # the single-event rows' bar is not this shape's: a class that reads later demotes them
        bar = {"sound_policies_zero_corrupted": targets(rows)["sound_policies_zero_corrupted"]}
        bar.update(class_targets(rows, subject.model.write_classes()))
    writes_shared = schedule.writes_shared()  # after the last run's steps (the device is idle)
    by = {r["name"]: r for r in rows}
    for name in ("in_graph", "derived"):
        by[name]["release_minus_ideal_us"] = by[name]["hold_us"] - ideal
    notes = lifetime_notes(subject.model)
    if not writes_shared:
        notes.append(
            "make_batch wrote no shared buffer: the scheduler's writes race nothing here, so the "
            "corrupted counts cannot show an early release (the audit can: warpolicy audit "
            "--factory)"
        )
    result = {
        "name": subject.name,
        "mode": mode.label,
        "buckets": sorted(buckets),
        "spec": subject.spec,
        "ideal_release_us": ideal,
        "rows": rows,
        "capture": captures,
        "targets": bar,
        "writes_shared": writes_shared,
        "notes": notes,
    }
    return result, traces


def _closes(row: dict, share: float) -> bool:
    return row["gap_closed"] is not None and row["gap_closed"] >= share


def targets(rows: Sequence[dict]) -> dict[str, bool]:
    """The bar: ``in_graph`` and ``derived`` close at least 95% of the coarse-to-unsafe gap,
    and no variant with a barrier corrupts a step."""
    by = {r["name"]: r for r in rows}
    return {
        "in_graph_closes_95pct": _closes(by["in_graph"], 0.95),
        "derived_closes_95pct": _closes(by["derived"], 0.95),
        "sound_policies_zero_corrupted": all(r["corrupted"] == 0 for r in rows if r["sound"]),
    }


def format_factory_overlap(result: dict) -> str:
    """The result as tables, one per subject (`warpolicy.bench.command.render` gives JSON too)."""
    c = result["config"]
    lines = [
        f"overlap benchmark of {c['factory']} on {c['device']} (torch {c['torch']}): scheduler "
        f"= make_batch + ~{c['sched_us_target']:g} us ({c['sched_kind']}), {c['steps']} steps "
        f"x {c['repeats']} runs"
    ]
    for one in result["subjects"]:
        lines += [
            "",
            f"{one['name']} ({one['mode']}, spec {one['spec']}, buckets {one['buckets']}):",
            *format_measurement(one),
            *(f"note: {note}" for note in one["notes"]),
        ]
    if c["platform"] != "cuda":
        lines.append("(simulated platform: host timestamps, numbers are meaningless)")
    if "trace" in result:
        lines.append(f"trace written to {result['trace']}")
    return "\n".join(lines)


def _measure(args: argparse.Namespace) -> Report:
    result = run_factory_overlap(
        args.factory,
        steps=args.steps,
        device=args.device,
        sched_kind=args.sched_kind,
        trace=args.trace,
        progress=args.progress,
    )
    return Report(result, format_factory_overlap)


#: ``warpolicy bench overlap --factory MODULE:CALLABLE``.
VARIANT = Variant(
    selector="--factory",
    title="your own model",
    options=(
        option(
            "--factory",
            metavar="MODULE:CALLABLE",
            help="benchmark your own model: the callable `audit --factory` takes (called with "
            "the platform, returns an AuditSubject or a list); e.g. warpolicy.bench.llama:decode",
        ),
    ),
    reads=frozenset({"steps", "device", "sched_kind", "trace"}),
    measure=_measure,
    refusal="describe the synthetic model; the factory's model has its own",
)

__all__ = [
    "ROWS",
    "VARIANT",
    "SubjectSchedule",
    "format_factory_overlap",
    "run_factory_overlap",
    "subject_mode",
    "targets",
]
