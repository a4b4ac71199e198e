"""WAR canary benchmark: what the canary costs per step, what one sample holds, and the release
lead it measures, side by side in one run.

The model is the overlap benchmark's (the audit's synthetic decode model in a wide bf16
configuration, through the real `DecodeRunner`, fence and `OverlapLoop`, the scheduler
rewriting the next step's table rows with `warpolicy.bench.overlap.SchedulePlan`), or, with
``factory="MODULE:CALLABLE"``, the model of each audit subject an audit factory returns (e.g.
``warpolicy.bench.llama:decode``, a Llama-shaped decode on SGLang's kernels): its ``make_batch``
is the scheduler's writes (`warpolicy.bench.overlap_factory.SubjectSchedule`, as ``bench overlap
--factory``) and its ``extra_outputs`` (the KV the step writes) are the state the canary saves,
puts back and compares (`SubjectCanaryModel`). After its writes the scheduler does the overlap
benchmark's GPU bookkeeping (``sched_kind``, ``sched_us``).

Cost rows (the ``in_graph`` policy, the release that overlaps most): the canary off, then
sampling one step in 1000, one in 100, and every step. All times come from CUDA timing events
at each step's launch (`warpolicy.bench.timing.CudaProbe`); the **mean** step (launch to the
last launch over the steady-state steps) is what counts, because the median hides the few
sampled steps. The every-step row measures what one check costs (``cost per sample`` = its
mean step minus the off row's, over thousands of samples); ``predicted`` overhead at a rate is
``rate x cost per sample / off step``; ``measured`` is the row's own mean against the off row
(at 1/1000 a run of a few thousand steps holds a handful of samples: noisy, shown beside the
prediction). The target: at 1/1000 the predicted overhead is at most 1% of the step.

Memory: what one sample held at most (`Canary.max_sample_bytes`: the snapshots of the shared
buffers and the KV rows the step writes, the observed output and the check's live copies) and
the byte budget (``max_bytes``) past which a sample is skipped.

Release lead rows (``coarse``, ``post_replay``, ``in_graph``): the canary's live measurement
(sampled timing events, read later: `warpolicy.runtime.canary.ReleaseLeadProbe`), next to the
probe's own estimate (forward end minus release, from the launch-point events) and the forward
time.

With ``device="sim"`` it runs a tiny configuration on the simulated platform (host times,
meaningless; for tests). The CLI runs it as ``warpolicy bench canary`` (`BENCHMARK`).
"""

from __future__ import annotations

import argparse
import time
import warnings
from collections.abc import Callable, Mapping
from typing import Any

from warpolicy.audit.api import call_factory, resolve_factory
from warpolicy.audit.subject import AuditSubject
from warpolicy.bench.command import Benchmark, Report, device_option, option, targets_line
from warpolicy.bench.overlap import Schedule, SchedulePlan, median
from warpolicy.bench.overlap_factory import SubjectSchedule
from warpolicy.bench.rig import (
    Rig,
    check_sched_kind,
    device_name,
    open_rig,
    synthetic_config,
    torch_version,
)
from warpolicy.bench.timing import SCHED_KINDS
from warpolicy.errors import InputError
from warpolicy.progress import NO_PROGRESS, Progress
from warpolicy.registry.inputs import positive_int_argument
from warpolicy.registry.vocabulary import (
    IN_GRAPH,
    NONE,
    POST_REPLAY,
    ForwardMode,
    WarReadDonePolicy,
)
from warpolicy.runtime.canary import Canary, CanaryConfig, CanarySpec, Tolerance
from warpolicy.runtime.platforms import Platform
from warpolicy.runtime.policy import fixed_policy
from warpolicy.runtime.runners import DecodeRunner, GraphRunner, OverlapLoop
from warpolicy.runtime.runners.adapters import ModelView

#: The cost rows: (name, sampling rate).
COST_ROWS: tuple[tuple[str, float], ...] = (
    ("off", 0.0),
    ("1/1000", 1e-3),
    ("1/100", 1e-2),
    ("every step", 1.0),
)
#: The release-lead rows: (name, policy).
LEAD_ROWS: tuple[tuple[str, WarReadDonePolicy], ...] = (
    ("coarse", NONE),
    ("post_replay", POST_REPLAY),
    ("in_graph", IN_GRAPH),
)
#: Steps of the every-step row and of each release-lead row (at most the bench's steps).
SHORT_STEPS = 600
#: The rate whose overhead the target bounds, and the bound (share of the step).
TARGET_RATE = 1e-3
TARGET_OVERHEAD = 0.01


class SubjectCanaryModel(ModelView):
    """An audit subject's model as a `warpolicy.runtime.runners.CanaryAdapter`: the shared
    buffers are the inputs and the subject's ``extra_outputs`` the state the step writes (the
    canary saves, puts back and compares them as the audit does); ``tolerance`` None compares
    bitwise. Every `ModelAdapter` member is the model's own."""

    def __init__(self, subject: AuditSubject, tolerance: Tolerance | None = None) -> None:
        super().__init__(subject.model)
        self.extra_outputs: Mapping[str, Any] = dict(subject.extra_outputs)
        self.tolerance = tolerance

    def canary_spec(self, mode: ForwardMode, bucket: int, batch: Any) -> CanarySpec:
        return CanarySpec(state=self.extra_outputs, tolerance=self.tolerance)


class _Bench:
    """One model under the canary: runs a row, measures it."""

    def __init__(
        self,
        platform: Platform,
        model: Any,
        schedule: Schedule,
        bookkeeping: Callable[[], None],
        steps: int,
        warmup: int,
        probe_factory: Callable[[], Any],
    ) -> None:
        self.platform, self.model, self.schedule = platform, model, schedule
        self.bookkeeping = bookkeeping
        self.steps, self.warmup, self.probe_factory = steps, warmup, probe_factory

    def runner(self, policy: WarReadDonePolicy, name: str, canary: Canary | None) -> GraphRunner:
        runner = DecodeRunner(
            self.model, fixed_policy(policy), self.platform, name=name, canary=canary
        )
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            runner.capture()
        return runner

    def run(
        self,
        policy: WarReadDonePolicy,
        name: str,
        config: CanaryConfig,
        steps: int | None = None,
    ) -> dict:
        """One overlapped run of ``steps`` (default: the bench's) with a canary of ``config``."""
        p, schedule = self.platform, self.schedule
        count = min(steps or self.steps, self.steps)
        canary = Canary(p, config)
        runner = self.runner(policy, name, canary)
        schedule.reset()
        schedule.write_step(0)
        p.synchronize()
        probe = self.probe_factory()
        loop = OverlapLoop(runner, probe=probe)
        started = time.perf_counter()
        for k in range(count):

            def write_next(k: int = k) -> None:
                if k + 1 < count:
                    schedule.write_step(k + 1)
                self.bookkeeping()

            loop.step(schedule.batch(k), write_next)
        loop.drain()
        host_s = time.perf_counter() - started
        t = probe.times_us()
        first = min(self.warmup, max(count - 2, 0))
        launch, launched, released = t["launch"], t["launched"], t["released"]
        span = range(first, count - 1)
        leads = canary.leads
        return {
            "name": name,
            "policy": policy.label,
            "rate": config.rate,
            "mean_step_us": (launch[count - 1] - launch[first]) / max(count - 1 - first, 1),
            "median_step_us": median([launch[k + 1] - launch[k] for k in span]),
            "host_us_per_step": host_s * 1e6 / count,
            "hold_us": median([max(0.0, released[k] - launch[k]) for k in span]),
            "forward_us": median([max(0.0, launched[k] - launch[k]) for k in span]),
            "probe_lead_us": median([max(0.0, launched[k] - released[k]) for k in span]),
            "checked": canary.stats["checked"],
            "violations": canary.stats["violations"],
            "failures": canary.stats["failures"],
            "skipped": canary.stats["skipped"],
            "max_sample_bytes": canary.max_sample_bytes,
            "max_bytes": config.max_bytes,
            "lead": {k.label(): s.to_json() for k, s in leads.items()},
        }


def _cost_rows(bench: _Bench, repeats: int) -> list[dict]:
    """Every cost row ``repeats`` times, interleaved (drift hits every row alike); per row the
    median of its runs' mean steps."""
    runs: dict[str, list[dict]] = {name: [] for name, _ in COST_ROWS}
    for r in range(repeats):
        for name, rate in COST_ROWS:
            config = CanaryConfig(rate=rate, seed=r)
            steps = SHORT_STEPS if rate == 1.0 else None  # every step: many samples already
            runs[name].append(bench.run(IN_GRAPH, name, config, steps))
    rows = []
    for name, _rate in COST_ROWS:
        row = dict(runs[name][0])
        for key in ("mean_step_us", "median_step_us", "host_us_per_step", "hold_us"):
            row[key] = median([run[key] for run in runs[name]])
        for key in ("checked", "violations", "failures", "skipped"):
            row[key] = sum(run[key] for run in runs[name])
        row["max_sample_bytes"] = max(run["max_sample_bytes"] for run in runs[name])
        row["runs"] = len(runs[name])
        rows.append(row)
    off = rows[0]["mean_step_us"]
    every = rows[-1]
    per_sample = every["mean_step_us"] - off  # every step of that row is checked
    for row in rows:
        row["measured_overhead"] = (row["mean_step_us"] - off) / off if off > 0 else None
        row["predicted_overhead"] = row["rate"] * per_sample / off if off > 0 else None
        row["cost_per_sample_us"] = per_sample
    return rows


def _lead_rows(bench: _Bench, lead_rate: float) -> list[dict]:
    rows = []
    for name, policy in LEAD_ROWS:
        row = bench.run(policy, name, CanaryConfig(lead_rate=lead_rate, seed=0), SHORT_STEPS)
        summaries = list(row["lead"].values())
        row["lead_median_us"] = median([s["median_us"] for s in summaries])
        row["lead_samples"] = sum(s["count"] for s in summaries)
        rows.append(row)
    return rows


def _targets(cost: list[dict]) -> dict[str, bool]:
    target = next(r for r in cost if r["rate"] == TARGET_RATE)
    predicted = target["predicted_overhead"]
    return {
        "canary_1_in_1000_within_1pct_of_step": predicted is not None
        and predicted <= TARGET_OVERHEAD,
        "no_violation_on_the_safe_model": all(r["violations"] == 0 for r in cost),
        "no_canary_failure": all(r["failures"] == 0 for r in cost),
    }


def run_canary_bench(
    steps: int = 3000,
    layers: int = 16,
    batch: int = 64,
    device: Any = None,
    *,
    factory: str | None = None,
    repeats: int = 2,
    layer_us: float = 100.0,
    hidden: int = 2048,
    warmup: int = 20,
    lead_rate: float = 0.1,
    tolerance: float | None = None,
    sched_kind: str = "copy",
    sched_us: float = 300.0,
    pm: Any = None,
    progress: Progress = NO_PROGRESS,
) -> dict:
    """Run the cost and release-lead rows; return the result dict (`format_canary`).
    ``progress`` hears of the factory's set-up and of each model's cost and lead rows.

    ``factory``: ``MODULE:CALLABLE`` of an audit factory (each subject it returns is a model
    of its own, its ``make_batch`` the scheduler: `warpolicy.bench.overlap_factory.
    SubjectSchedule`; ``tolerance``, an absolute tolerance for its comparisons, default
    bitwise); otherwise the synthetic model (``layers`` of about ``layer_us``, ``batch``,
    ``hidden``; `SchedulePlan`). After its writes the scheduler does ``sched_us`` of GPU
    bookkeeping of ``sched_kind`` (`warpolicy.bench.timing.scheduler_work`), as in ``bench
    overlap``.
    """

    if min(steps, layers, batch, repeats) <= 0 or warmup < 0:
        raise InputError("canary bench: steps, layers, batch and repeats must be positive")
    if not 0 < lead_rate <= 1:
        raise InputError(f"canary bench: lead_rate must be in (0, 1], not {lead_rate}")
    check_sched_kind(sched_kind)
    rig = open_rig(device, "the canary benchmark", pm=pm)
    if rig.simulated:  # tiny and host-timed: exercises the code path, numbers meaningless
        steps, layers, batch, hidden, repeats = min(steps, 30), min(layers, 2), min(batch, 4), 16, 1
        warmup = min(warmup, 2)
    warmup = min(warmup, max(steps - 2, 0))
    platform = rig.platform
    models: list[tuple[str, Any, Any]] = []
    if factory is not None:
        tol = Tolerance(atol=tolerance) if tolerance else None
        progress.note(f"building the subjects of {factory} (kernels may compile)")
        for subject in call_factory(resolve_factory(factory), factory, platform):
            mode = ForwardMode.DECODE
            if mode not in subject.runners:
                raise InputError(f"canary bench: subject {subject.name!r} has no decode runner")
            models.append(
                (subject.name, SubjectCanaryModel(subject, tol), SubjectSchedule(subject, mode))
            )
    else:
        models.append(_synthetic(rig, steps, layers, batch, hidden, layer_us))
    bookkeeping = rig.bookkeeping(sched_kind, sched_us, hidden)
    results = []
    progress.planned(2 * len(models))
    for name, model, schedule in models:
        bench = _Bench(platform, model, schedule, bookkeeping, steps, warmup, rig.probe)
        progress.started(f"{name} cost")
        cost = _cost_rows(bench, repeats)
        progress.finished(f"{name} cost", f"{len(cost)} rates, {repeats} run(s) each")
        progress.started(f"{name} release lead")
        lead = _lead_rows(bench, lead_rate)
        progress.finished(f"{name} release lead", f"{len(lead)} policies")
        results.append(
            {
                "model": name,
                "cost": cost,
                "lead": lead,
                "targets": _targets(cost),
            }
        )
    return {
        "config": {
            "steps": steps,
            "warmup": warmup,
            "repeats": repeats,
            "layers": layers,
            "batch": batch,
            "hidden": hidden,
            "layer_us_target": layer_us,
            "lead_rate": lead_rate,
            "sched_kind": sched_kind,
            "sched_us_target": sched_us,
            "factory": factory,
            "platform": platform.name,
            "device": device_name(platform),
            "torch": torch_version(),
        },
        "models": results,
    }


def _synthetic(
    rig: Rig, steps: int, layers: int, batch: int, hidden: int, layer_us: float
) -> tuple[str, Any, Any]:
    # deferred: the synthetic model imports torch
    from warpolicy.audit.synthetic_model import Layout, SyntheticModel  # noqa: PLC0415

    layer_rows = rig.layer_rows(layer_us, hidden)
    cfg = synthetic_config(
        rig.device, batch=batch, hidden=hidden, layers=layers, layer_rows=layer_rows
    )
    model = SyntheticModel(Layout(), cfg, rig.device)
    model.canary_state = "rows"  # as in production: only the KV rows the step writes
    return "synthetic decode", model, SchedulePlan(model, steps, batch)


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:+.3f}%"


def format_canary(result: dict) -> str:
    """The result as tables (`warpolicy.bench.command.render` gives JSON too)."""
    c = result["config"]
    lines = [
        f"WAR canary benchmark on {c['device']} (torch {c['torch']}): {c['steps']} steps x "
        f"{c['repeats']} runs per row, policy in_graph, scheduler ~{c['sched_us_target']:g} us "
        f"({c['sched_kind']})"
        + (
            f", factory {c['factory']}"
            if c["factory"]
            else f", {c['layers']} layers, batch {c['batch']}"
        )
    ]
    for m in result["models"]:
        cost = m["cost"]
        lines += [
            "",
            f"model {m['model']}: cost",
            f"{'canary':12s} {'mean step us':>13s} {'median us':>10s} {'checked':>8s} "
            f"{'violations':>10s} {'measured':>10s} {'predicted':>10s}",
        ]
        for r in cost:
            lines.append(
                f"{r['name']:12s} {r['mean_step_us']:13.1f} {r['median_step_us']:10.1f} "
                f"{r['checked']:8d} {r['violations']:10d} {_pct(r['measured_overhead']):>10s} "
                f"{_pct(r['predicted_overhead']):>10s}"
            )
        every = cost[-1]
        off = cost[0]["mean_step_us"]
        steps = every["cost_per_sample_us"] / off if off > 0 else float("nan")
        lines.append(
            f"cost per sample: {every['cost_per_sample_us']:.1f} us ({steps:.2f} steps); one "
            f"sample held at most {every['max_sample_bytes'] / 2**20:.2f} MiB (budget "
            f"{every['max_bytes'] / 2**20:.0f} MiB)"
        )
        lines += [
            "",
            f"model {m['model']}: release lead (the scheduler released this long before the "
            "forward's end)",
            f"{'policy':12s} {'canary lead us':>15s} {'probe lead us':>14s} {'forward us':>11s} "
            f"{'hold us':>9s} {'samples':>8s}",
        ]
        for r in m["lead"]:
            lines.append(
                f"{r['name']:12s} {r['lead_median_us']:15.1f} {r['probe_lead_us']:14.1f} "
                f"{r['forward_us']:11.1f} {r['hold_us']:9.1f} {r['lead_samples']:8d}"
            )
        lines.append(targets_line(m["targets"]))
    if c["platform"] != "cuda":
        lines.append("(simulated platform: host timestamps, numbers are meaningless)")
    return "\n".join(lines)


def _measure(args: argparse.Namespace) -> Report:
    result = run_canary_bench(
        steps=args.steps,
        layers=args.layers,
        batch=args.batch,
        device=args.device,
        factory=args.factory,
        repeats=args.repeats,
        lead_rate=args.lead_rate,
        tolerance=args.tolerance,
        sched_kind=args.sched_kind,
        sched_us=args.sched_us,
        progress=args.progress,
    )
    return Report(result, format_canary)


#: ``warpolicy bench canary``.
BENCHMARK = Benchmark(
    "canary",
    "WAR canary: cost per step at 1/1000 and 1/100, release lead (GPU)",
    (
        option("--steps", default=3000, type=positive_int_argument),
        option("--layers", default=16, type=positive_int_argument),
        option("--batch", default=64, type=positive_int_argument),
        option("--repeats", default=2, type=positive_int_argument),
        option(
            "--lead-rate",
            default=0.1,
            type=float,
            metavar="R",
            help="share of steps timed for the lead",
        ),
        option(
            "--factory",
            metavar="MODULE:CALLABLE",
            help="the models of an audit factory (e.g. warpolicy.bench.llama:decode) instead "
            "of the synthetic decode",
        ),
        option(
            "--tolerance",
            type=float,
            metavar="ATOL",
            help="with --factory: compare within this absolute tolerance (default bitwise)",
        ),
        option(
            "--sched-kind",
            default="copy",
            choices=SCHED_KINDS,
            help="scheduler GPU bookkeeping after its writes, as in bench overlap",
        ),
        option("--sched-us", default=300.0, type=float, metavar="US"),
        device_option("cuda (default) or sim"),
    ),
    _measure,
)


__all__ = [
    "BENCHMARK",
    "COST_ROWS",
    "LEAD_ROWS",
    "SubjectCanaryModel",
    "format_canary",
    "run_canary_bench",
]
