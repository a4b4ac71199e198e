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

import statistics
from typing import Any, Callable, Sequence

from warpolicy.bench.overlap import SchedulePlan, fixed
from warpolicy.bench.timing import CudaProbe, HostProbe, calibrate_rows, copy_work, matmul_work
from warpolicy.errors import CudaUnavailableError, InputError
from warpolicy.registry.report import json_document
from warpolicy.registry.vocabulary import ForwardMode
from warpolicy.runtime.manager import open_runtime
from warpolicy.runtime.platforms import is_simulated
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
        self.shape, self.platform = shape, platform
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
            policy = fixed("none" if run == "coarse" else choice[name])
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
) -> dict:
    """Run every shape and run kind once; return the result dict (see `format_overlap_spec`)."""
    import torch  # noqa: PLC0415 - deferred: importing the benchmarks does not need torch

    # deferred: the synthetic model imports torch
    from warpolicy.audit.synthetic_model import (  # noqa: PLC0415
        Layout,
        SyntheticConfig,
        SyntheticModel,
    )

    if min(layers, draft_layers, batch, steps) <= 0:
        raise InputError(
            "overlap spec bench: layers, draft_layers, batch and steps must be positive"
        )
    fake = device is not None and is_simulated(device)
    if not fake and not torch.cuda.is_available():
        raise CudaUnavailableError(
            "the speculative-step overlap benchmark needs a CUDA device "
            "(torch.cuda.is_available() is False)"
        )
    platform = open_runtime("sim" if fake else (device or "cuda"), pm=pm).platform
    probe_factory: Callable[[], Any]
    if fake:
        layers, draft_layers, batch, steps, hidden, warmup = 2, 1, 4, 8, 16, 2
        tdev, layer_rows, probe_factory = torch.device("cpu"), 8, HostProbe
        bookkeeping = matmul_work(8, hidden, tdev)
    else:
        tdev = torch.device(device or "cuda")
        layer_rows = calibrate_rows(layer_us, hidden, tdev, tanh=True)
        probe_factory = CudaProbe
        bookkeeping = copy_work(sched_us, tdev)
    warmup = min(warmup, max(steps - 2, 0))

    modes = (ForwardMode.DECODE, ForwardMode.TARGET_VERIFY, ForwardMode.DRAFT_EXTEND)

    def make_model(n: int) -> Any:  # one seed: every phase starts from the same tables
        cfg = SyntheticConfig(
            reqs=2 * batch,
            ctx=64,
            swa_slots=1024,
            hidden=hidden,
            layers=n,
            buckets={m: (batch,) for m in modes},
            layer_rows=layer_rows,
            shared_index=True,
            dtype=torch.bfloat16 if tdev.type == "cuda" else torch.float32,
        )
        return SyntheticModel(Layout(), cfg, tdev)

    rows = []
    for shape_name in SHAPES:
        shape = _Shape(shape_name, platform, make_model, layers, draft_layers, steps, batch)
        reference = None
        by_run = {}
        for run in RUNS:
            step = shape.step(run)
            if reference is None:  # sequential: writes, then the step, on one stream
                reference = []
                for k in range(steps):
                    shape.write(k)
                    bookkeeping()
                    reference.append([o.clone() for o in step.run(shape.batch(k))])
                platform.synchronize()
            shape.write(0)
            platform.synchronize()
            probe = probe_factory()
            loop = OverlapLoop(
                platform=platform, probe=probe, unsafe_skip_barrier=run == "no_barrier"
            )
            outs = []
            for k in range(steps):

                def write_next(k: int = k, shape: Any = shape) -> None:
                    if k + 1 < steps:
                        shape.write(k + 1)
                    bookkeeping()

                outs.append([o.clone() for o in loop.step(shape.batch(k), write_next, runner=step)])
            loop.drain()
            corrupted = sum(
                any(not torch.equal(a, b) for a, b in zip(o, r)) for o, r in zip(outs, reference)
            )
            by_run[run] = {
                "shape": shape_name,
                "run": run,
                "reader": step.reader.name,
                "step_us": _step_times(probe.times_us(), warmup),
                "corrupted": corrupted,
                "checked": steps,
                "sound": run != "no_barrier",
            }
        coarse, bound = by_run["coarse"]["step_us"], by_run["no_barrier"]["step_us"]
        gap = coarse - bound
        for row in by_run.values():
            row["gap_closed"] = (coarse - row["step_us"]) / gap if gap > 0.005 * coarse else None
            rows.append(row)
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
            "platform": platform.name,
            "torch": torch.__version__,
        },
        "rows": rows,
        "targets": {
            "sound_runs_zero_corrupted": all(r["corrupted"] == 0 for r in rows if r["sound"])
        },
    }


def format_overlap_spec(result: dict, fmt: str = "text") -> str:
    """The result as a table (``text``) or JSON (``json``)."""
    if fmt == "json":
        return json_document(result)  # schema_version first, like every JSON output
    if fmt != "text":
        raise InputError(f"unknown format {fmt!r}; use text or json")
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
    lines.append(
        "targets: " + ", ".join(f"{k}={'yes' if v else 'NO'}" for k, v in result["targets"].items())
    )
    if c["platform"] != "cuda":
        lines.append("(simulated platform: host timestamps, numbers are meaningless)")
    return "\n".join(lines)


__all__: Sequence[str] = ("run_overlap_spec_bench", "format_overlap_spec")
