"""Overlap benchmark, speculative-step variant: how much of the coarse-to-unsafe gap a
`SpecStep` closes when the scheduler waits on its last shared reader's event.

Two step shapes, each phase the synthetic model
(`warpolicy.audit.synthetic_model.SyntheticModel` with a scheduler-shared batch index: an in-graph
prep that reads the index and translates it through the shared request-to-token table, then
matmul layers) behind its own runner, with the scheduler's next-step writes (`SchedulePlan`:
index and table rows) and copy-engine bookkeeping on the schedule stream (`OverlapLoop`):

* ``eagle``: draft (``draft_layers``), target verify (``layers``), draft extend
  (``draft_layers``); the draft extend is the last reader and, having no marker, publishes
  after its replay (a draft backend declaring ``post_replay``);
* ``dflash``: draft, target verify; verify is the last reader and releases from inside its
  graph right after its metadata prep.

Per shape, three runs: ``coarse`` (every phase ``none``), ``step`` (the phase step's choice) and
``no_barrier`` (the unsafe upper bound). Reported per row: steady-state step time, the share of
the coarse-to-no-barrier gap closed, and corrupted steps against a sequential reference. The
EAGLE shape closes little by construction: its last reader ends the step.

With ``device="sim"`` (alias ``fake``) it runs tiny on the simulated platform (host times,
meaningless). The CLI runs it as ``warpolicy bench overlap --spec-step``.
"""

from __future__ import annotations

import argparse
import statistics
from typing import Any, Callable, Sequence

from warpolicy.bench.command import Report, Variant, option, targets_line
from warpolicy.bench.overlap import SchedulePlan, same, snapshot
from warpolicy.bench.rig import device_name, open_rig, synthetic_config, torch_version
from warpolicy.errors import InputError
from warpolicy.registry.vocabulary import ForwardMode
from warpolicy.runtime.policy import fixed_policy
from warpolicy.runtime.runners import (
    DecodeRunner,
    DraftExtendRunner,
    GraphRunner,
    OverlapLoop,
    SpecStep,
    VerifyRunner,
)

SHAPES = ("eagle", "dflash")
RUNS = ("coarse", "step", "no_barrier")


def _step_times(t: dict[str, list[float]], warmup: int) -> float:
    launch = t["launch"]
    ks = range(min(warmup, max(len(launch) - 2, 0)), len(launch) - 1)
    diffs = [launch[k + 1] - launch[k] for k in ks]
    return float(statistics.median(diffs)) if diffs else float("nan")


class _Shape:
    """One step shape: its phase models, and `SpecStep` builders per run."""

    def __init__(
        self,
        shape: str,
        platform: Any,
        make_model: Callable[[int], Any],
        layers: int,
        draft_layers: int,
        steps: int,
        batch: int,
    ) -> None:
        self.shape, self.platform, self.steps = shape, platform, steps
        plan = [
            ("draft", ForwardMode.DECODE, draft_layers),
            ("verify", ForwardMode.TARGET_VERIFY, layers),
        ]
        if shape == "eagle":
            plan.append(("draft_extend", ForwardMode.DRAFT_EXTEND, draft_layers))
        self.plan = [(name, mode, make_model(n)) for name, mode, n in plan]
        # one seed: every phase's scheduler writes the same batches (and its own table)
        self.schedules = [SchedulePlan(model, steps, batch) for _, _, model in self.plan]

    def step(self, run: str) -> Any:

        choice = {
            "draft": "in_graph",
            "verify": "none" if self.shape == "eagle" else "in_graph",
            "draft_extend": "post_replay",
        }
        runners: list[GraphRunner] = []
        for name, mode, model in self.plan:
            policy = fixed_policy("none" if run == "coarse" else choice[name])
            adapter = model
            runner: GraphRunner
            if mode == ForwardMode.TARGET_VERIFY:
                runner = VerifyRunner(adapter, policy, self.platform, name=name, draft_tokens=1)
            elif mode == ForwardMode.DRAFT_EXTEND:
                runner = DraftExtendRunner(adapter, policy, self.platform, name=name)
            else:
                runner = DecodeRunner(adapter, policy, self.platform, name=name)
            runners.append(runner)
        last = ForwardMode.DRAFT_EXTEND if self.shape == "eagle" else ForwardMode.TARGET_VERIFY
        step = SpecStep(runners, last_reader=last, name=f"{self.shape}_{run}")
        step.capture()
        return step

    def write(self, k: int) -> None:
        for schedule in self.schedules:
            schedule.write_step(k)

    def batch(self, k: int) -> Any:
        return self.schedules[0].batch(k)


def _measure_shape(
    shape: _Shape, bookkeeping: Callable[[], None], probe_factory: Callable[[], Any], warmup: int
) -> list[dict]:
    """One shape's rows: every run overlapped, checked against one sequential reference, and
    the share of the coarse-to-no-barrier gap each closes."""
    platform, steps = shape.platform, shape.steps
    reference: list[Any] = []
    by_run = {}
    for run in RUNS:
        step = shape.step(run)
        if not reference:  # sequential: writes, then the step, on one stream
            for k in range(steps):
                shape.write(k)
                bookkeeping()
                reference.append(snapshot(step.run(shape.batch(k))))
            platform.synchronize()
        shape.write(0)
        platform.synchronize()
        probe = probe_factory()
        loop = OverlapLoop(platform=platform, probe=probe, unsafe_skip_barrier=run == "no_barrier")
        outs = []
        for k in range(steps):

            def write_next(k: int = k) -> None:
                if k + 1 < steps:
                    shape.write(k + 1)
                bookkeeping()

            outs.append(snapshot(loop.step(shape.batch(k), write_next, runner=step)))
        loop.drain()
        by_run[run] = {
            "shape": shape.shape,
            "run": run,
            "reader": step.reader.name,
            "step_us": _step_times(probe.times_us(), warmup),
            "corrupted": sum(not same(o, r) for o, r in zip(outs, reference)),
            "checked": steps,
            "sound": run != "no_barrier",
        }
    coarse, bound = by_run["coarse"]["step_us"], by_run["no_barrier"]["step_us"]
    gap = coarse - bound
    for row in by_run.values():
        row["gap_closed"] = (coarse - row["step_us"]) / gap if gap > 0.005 * coarse else None
    return list(by_run.values())


def run_overlap_spec_bench(
    layers: int = 32,
    draft_layers: int = 4,
    batch: int = 64,
    steps: int = 120,
    device: Any = None,
    *,
    layer_us: float = 100.0,
    sched_us: float = 300.0,
    hidden: int = 2048,
    warmup: int = 10,
    pm: Any = None,
    sched_kind: str = "copy",
) -> dict:
    """Run every shape and run kind once; return the result dict (see `format_overlap_spec`).
    After its writes the scheduler does about ``sched_us`` of GPU bookkeeping of
    ``sched_kind`` (`warpolicy.bench.timing.SCHED_KINDS`), as in the synthetic run."""
    # deferred: the synthetic model imports torch
    from warpolicy.audit.synthetic_model import Layout, SyntheticModel  # noqa: PLC0415

    if min(layers, draft_layers, batch, steps) <= 0:
        raise InputError(
            "overlap spec bench: layers, draft_layers, batch and steps must be positive"
        )
    rig = open_rig(device, "the speculative-step overlap benchmark", pm=pm)
    platform = rig.platform
    if rig.simulated:
        layers, draft_layers, batch, steps, hidden, warmup = 2, 1, 4, 8, 16, 2
    bookkeeping = rig.bookkeeping(sched_kind, sched_us, hidden)
    layer_rows = rig.layer_rows(layer_us, hidden)
    warmup = min(warmup, max(steps - 2, 0))

    modes = (ForwardMode.DECODE, ForwardMode.TARGET_VERIFY, ForwardMode.DRAFT_EXTEND)

    def make_model(n: int) -> Any:  # one seed: every phase starts from the same tables
        cfg = synthetic_config(
            rig.device, batch=batch, hidden=hidden, layers=n, layer_rows=layer_rows, modes=modes,
            shared_index=True,
        )  # fmt: skip
        return SyntheticModel(Layout(), cfg, rig.device)

    rows = []
    for shape_name in SHAPES:
        shape = _Shape(shape_name, platform, make_model, layers, draft_layers, steps, batch)
        rows += _measure_shape(shape, bookkeeping, rig.probe, warmup)
    return {
        "config": {
            "layers": layers,
            "draft_layers": draft_layers,
            "batch": batch,
            "steps": steps,
            "hidden": hidden,
            "layer_rows": layer_rows,
            "layer_us_target": layer_us,
            "sched_us_target": sched_us,
            "sched_kind": sched_kind,
            "platform": platform.name,
            "device": device_name(platform),
            "torch": torch_version(),
        },
        "rows": rows,
        "targets": {
            "sound_runs_zero_corrupted": all(r["corrupted"] == 0 for r in rows if r["sound"])
        },
    }


def format_overlap_spec(result: dict) -> str:
    """The result as a table (`warpolicy.bench.command.render` gives JSON too)."""
    c = result["config"]
    lines = [
        f"speculative-step overlap on {c['platform']} (torch {c['torch']}): verify "
        f"{c['layers']} layers, draft {c['draft_layers']}, batch {c['batch']}, "
        f"{c['steps']} steps",
        "",
        f"{'shape':7s} {'run':11s} {'released by':13s} {'step us':>9s} {'gap closed':>10s} "
        f"{'corrupted':>10s}",
    ]
    for r in result["rows"]:
        gap = "-" if r["gap_closed"] is None else f"{100 * r['gap_closed']:.1f}%"
        reader = r["reader"] if r["run"] == "step" else ("-" if r["run"] == "coarse" else "unsafe")
        lines.append(
            f"{r['shape']:7s} {r['run']:11s} {reader:13s} {r['step_us']:9.1f} "
            f"{gap:>10s} {r['corrupted']:>4d}/{r['checked']:<5d}"
        )
    lines.append("")
    lines.append(targets_line(result["targets"]))
    if c["platform"] != "cuda":
        lines.append("(simulated platform: host timestamps, numbers are meaningless)")
    return "\n".join(lines)


def _measure(args: argparse.Namespace) -> Report:
    result = run_overlap_spec_bench(
        layers=args.layers,
        batch=args.batch,
        steps=args.steps,
        device=args.device,
        sched_kind=args.sched_kind,
    )
    return Report(result, format_overlap_spec)


#: ``warpolicy bench overlap --spec-step``.
VARIANT = Variant(
    selector="--spec-step",
    options=(
        option(
            "--spec-step",
            default=False,
            action="store_true",
            help="the speculative-step variant (EAGLE-like and DFlash-like phase steps)",
        ),
    ),
    reads=frozenset({"steps", "device", "sched_kind", "layers", "batch"}),
    measure=_measure,
)

__all__: Sequence[str] = ("VARIANT", "format_overlap_spec", "run_overlap_spec_bench")
