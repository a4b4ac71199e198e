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
* ``eagle_staged``: the EAGLE shape with the draft extend's shared reads (the request-to-token
  table, the SWA mapping and the batch index) staged (`warpolicy.runtime.runners.staging`): a
  `Stager` registered on the plugin manager copies them during target verify's per-batch action
  ``draft_extend_staged`` into the draft extend's own buffers, the draft extend's graph reads
  only those, and verify publishes its in-graph event per the default registry (trtllm_mha +
  EAGLE: ``target_verify_read_done`` after ``draft_extend_staged``), which ends the step;
* ``dflash``: draft, target verify; verify is the last reader and releases from inside its
  graph right after its metadata prep.

Per shape, three runs: ``coarse`` (every phase ``none``), ``step`` (the phase step's choice) and
``no_barrier`` (the unsafe upper bound); ``eagle_staged`` adds ``lying_stager`` (a positive
control: the stager copies one buffer fewer, the batch index, which the draft extend then reads
live after verify's release: it must corrupt steps). Reported per row: steady-state step time,
the share of the coarse-to-no-barrier gap closed, corrupted steps against a sequential
reference, and for staged runs the bytes the staging copies per step and the GPU time those
copies take (measured alone on the forward stream, same process). The unstaged EAGLE shape
closes little by construction: its last reader ends the step.

With ``device="sim"`` (alias ``fake``) it runs tiny on the simulated platform (host times,
meaningless). The CLI runs it as ``warpolicy bench overlap --spec-step``.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

from warpolicy.bench.command import Report, Variant, option, targets_line
from warpolicy.bench.overlap import SchedulePlan, same, snapshot
from warpolicy.bench.rig import device_name, open_rig, synthetic_config, torch_version
from warpolicy.errors import InputError
from warpolicy.registry.engine import PolicyEngine
from warpolicy.registry.vocabulary import ForwardMode
from warpolicy.runtime.manager import new_plugin_manager
from warpolicy.runtime.policy import fixed_policy
from warpolicy.runtime.runners import (
    DecodeRunner,
    DraftExtendRunner,
    GraphRunner,
    OverlapLoop,
    SpecStep,
    VerifyRunner,
)
from warpolicy.runtime.runners.staging import Stager, TensorCopy

SHAPES = ("eagle", "eagle_staged", "dflash")
RUNS = ("coarse", "step", "no_barrier")
#: the staged shape's extra run: the positive control
LYING = "lying_stager"
#: the shared buffer the lying stager does not copy
LYING_SKIPS = "batch_index"


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
        pm: Any,
        make_model: Callable[[int], Any],
        layers: int,
        draft_layers: int,
        steps: int,
        batch: int,
    ) -> None:
        self.shape, self.platform, self.pm, self.steps = shape, platform, pm, steps
        plan = [
            ("draft", ForwardMode.DECODE, draft_layers),
            ("verify", ForwardMode.TARGET_VERIFY, layers),
        ]
        if shape.startswith("eagle"):
            plan.append(("draft_extend", ForwardMode.DRAFT_EXTEND, draft_layers))
        self.plan = [(name, mode, make_model(n)) for name, mode, n in plan]
        # one seed: every phase's scheduler writes the same batches (and its own table)
        self.schedules = [SchedulePlan(model, steps, batch) for _, _, model in self.plan]
        self.runs = RUNS[:2] + (LYING,) + RUNS[2:] if shape == "eagle_staged" else RUNS
        self.stagers: dict[str, Stager] = {}
        self.consumers: dict[str, Any] = {}
        if shape == "eagle_staged":
            live = self.plan[-1][2]
            for run, skip in (("step", ()), (LYING, (LYING_SKIPS,))):
                # the draft extend's own model (same seed: the same weights and tables), whose
                # tables are the staged copies of the live model's; the scheduler never writes it
                own = make_model(draft_layers)
                reads = [
                    TensorCopy(n, live.shared_buffers[n], own.shared_buffers[n])
                    for n in live.shared_buffers
                    if n not in skip
                ]
                for n in skip:  # what the lying stager leaves out, the draft extend reads live
                    setattr(own, n, live.shared_buffers[n])
                own.shared_buffers = {n: live.shared_buffers[n] for n in skip}
                stager = Stager(reads, name=f"stager_{run}")
                self.stagers[run] = stager
                self.consumers[run] = stager.consumer(own, state={"kv_pool": own.kv_pool})
            self.staged_policy = PolicyEngine.load(environ={}).compile(
                "trtllm_mha",
                "eagle",
                platform=self.platform.name,
                external_events=self.platform.external_events_supported(),
                strict=True,
            )

    def step(self, run: str) -> Any:
        choice = {
            "draft": "in_graph",
            "verify": "none" if self.shape == "eagle" else "in_graph",
            "draft_extend": "post_replay",
        }
        pm = self.pm
        for other in self.stagers.values():  # only this run's stager stages
            if pm.is_registered(other):
                pm.unregister(other)
        stager = self.stagers.get(run)
        if stager is not None:
            pm.register(stager, name=stager.name)
        observers = pm.observers
        runners: list[GraphRunner] = []
        for name, mode, model in self.plan:
            policy: Any = fixed_policy("none" if run == "coarse" else choice[name])
            adapter = model
            runner: GraphRunner
            if mode == ForwardMode.TARGET_VERIFY:
                if stager is not None:  # the registry: in_graph only for a staged batch
                    policy = self.staged_policy
                runner = VerifyRunner(
                    adapter, policy, self.platform, name=name, draft_tokens=1, observers=observers
                )
            elif mode == ForwardMode.DRAFT_EXTEND:
                adapter = self.consumers.get(run, model)
                runner = DraftExtendRunner(
                    adapter, policy, self.platform, name=name, observers=observers
                )
            else:
                runner = DecodeRunner(
                    adapter, policy, self.platform, name=name, observers=observers
                )
            runners.append(runner)
        last = (
            ForwardMode.DRAFT_EXTEND
            if self.shape.startswith("eagle")
            else ForwardMode.TARGET_VERIFY
        )
        step = SpecStep(runners, last_reader=last, name=f"{self.shape}_{run}")
        step.capture()
        return step

    def write(self, k: int) -> None:
        for schedule in self.schedules:
            schedule.write_step(k)

    def batch(self, k: int) -> Any:
        return self.schedules[0].batch(k)

    def close(self) -> None:
        """Unregister this shape's stagers (the plugin manager may be the caller's)."""
        for stager in self.stagers.values():
            if self.pm.is_registered(stager):
                self.pm.unregister(stager)


def staging_cost_us(stager: Stager, batch: Any, fake: bool, reps: int = 50) -> float:
    """The GPU time one staging takes, alone on the current stream (host time on the sim)."""
    import torch  # noqa: PLC0415 - deferred: importing the benchmarks does not need torch

    for _ in range(3):
        stager.copy_all(batch)
    if fake:
        start = time.perf_counter()
        for _ in range(reps):
            stager.copy_all(batch)
        return (time.perf_counter() - start) * 1e6 / reps
    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    begin.record()
    for _ in range(reps):
        stager.copy_all(batch)
    end.record()
    torch.cuda.synchronize()
    return begin.elapsed_time(end) * 1000.0 / reps


def _measure_shape(
    shape: _Shape, bookkeeping: Callable[[], None], probe_factory: Callable[[], Any], warmup: int
) -> list[dict]:
    """One shape's rows: every run overlapped, checked against one sequential reference, and
    the share of the coarse-to-no-barrier gap each closes; staged runs with what the staging
    copied and how long that takes on the GPU."""
    platform, steps = shape.platform, shape.steps
    reference: list[Any] = []
    by_run: dict[str, dict[str, Any]] = {}
    for run in shape.runs:
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
        staged = 0
        for k in range(steps):

            def write_next(k: int = k) -> None:
                if k + 1 < steps:
                    shape.write(k + 1)
                bookkeeping()

            outs.append(snapshot(loop.step(shape.batch(k), write_next, runner=step)))
            staged += step.staged
        loop.drain()
        stager = shape.stagers.get(run)
        by_run[run] = {
            "shape": shape.shape,
            "run": run,
            "reader": f"{step.phases[1].name} (staged)" if staged else step.reader.name,
            "step_us": _step_times(probe.times_us(), warmup),
            "corrupted": sum(not same(o, r) for o, r in zip(outs, reference)),
            "checked": steps,
            "sound": run not in ("no_barrier", LYING),
            "staged_steps": staged,
            "staging_bytes": stager.nbytes if stager is not None else 0,
            "staging_us": (
                staging_cost_us(stager, shape.batch(0), platform.name != "cuda")
                if stager is not None
                else 0.0
            ),
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
    # the staged shape registers its stagers on the plugin manager the runners observe
    pm = pm if pm is not None else new_plugin_manager()
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
        shape = _Shape(shape_name, platform, pm, make_model, layers, draft_layers, steps, batch)
        try:
            rows += _measure_shape(shape, bookkeeping, rig.probe, warmup)
        finally:
            shape.close()
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
            "sound_runs_zero_corrupted": all(r["corrupted"] == 0 for r in rows if r["sound"]),
            # the simulated platform runs in program order: nothing races there
            **(
                {}
                if rig.simulated
                else {
                    "lying_stager_corrupts": all(
                        r["corrupted"] > 0 for r in rows if r["run"] == LYING
                    )
                }
            ),
            "staged_steps_all_staged": all(
                r["staged_steps"] == r["checked"]
                for r in rows
                if r["shape"] == "eagle_staged" and r["run"] == "step"
            ),
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
        f"{'shape':12s} {'run':12s} {'released by':22s} {'step us':>9s} {'gap closed':>10s} "
        f"{'corrupted':>10s} {'staged':>7s} {'staging B':>10s} {'staging us':>10s}",
    ]
    for r in result["rows"]:
        gap = "-" if r["gap_closed"] is None else f"{100 * r['gap_closed']:.1f}%"
        reader = (
            r["reader"]
            if r["run"] in ("step", LYING)
            else ("-" if r["run"] == "coarse" else "unsafe")
        )
        staging = r["staging_bytes"] > 0
        lines.append(
            f"{r['shape']:12s} {r['run']:12s} {reader:22s} {r['step_us']:9.1f} "
            f"{gap:>10s} {r['corrupted']:>4d}/{r['checked']:<5d} "
            f"{r['staged_steps']:>7d} "
            f"{(str(r['staging_bytes']) if staging else '-'):>10s} "
            f"{(format(r['staging_us'], '.1f') if staging else '-'):>10s}"
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
    title="speculative steps",
    options=(
        option(
            "--spec-step",
            default=False,
            action="store_true",
            help="the speculative-step variant (EAGLE-like, EAGLE staged and DFlash-like steps)",
        ),
    ),
    reads=frozenset({"steps", "device", "sched_kind", "layers", "batch"}),
    measure=_measure,
)

__all__: Sequence[str] = ("VARIANT", "format_overlap_spec", "run_overlap_spec_bench")
