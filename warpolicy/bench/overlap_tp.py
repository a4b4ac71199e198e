"""Tensor-parallel overlap benchmark: the overlap benchmark with one rank per GPU and an
all-reduce ending every layer of the captured forward.

Each rank runs what a tensor-parallel serving engine runs: its own synthetic model
(`warpolicy.audit.synthetic_model.SyntheticModel` with a scheduler-shared batch index: an
in-graph prep that reads the index and translates it through the shared request-to-token table,
then ``layers`` matmul layers, each ending in a ``torch.distributed`` all-reduce captured in the
CUDA graph),
its own `DecodeRunner` and fence, and its own scheduler (`OverlapLoop`) writing its own shared
tables on its own schedule stream. Before capturing, every rank compiles its policy from the
registry and its environment and runs the cross-rank consistency check
(`warpolicy.runtime.distributed.compile_consistent`); every variant's policy follows the verdict, so a
mismatch on any rank runs every variant under the coarse barrier on every rank.

Variants, in one run: ``coarse`` (policy none), ``post_replay``, ``in_graph`` and ``no_barrier``
(the unsafe upper bound). Per rank: hold (launch to the scheduler's release: the release
time), step time, the share of the coarse-to-no-barrier gap each variant closes, the release
minus the ideal point (the end of the in-graph prep, timed on a prep-only graph), and corrupted
steps (bitwise against a sequential reference run; an all-reduce carries one rank's corruption
to every rank). Ranks' reports are gathered, so every rank returns the same combined result.

Launch: ``run_overlap_tp(tp=N)`` runs one rank in this process (N = 1) or spawns N processes
over 127.0.0.1; under ``torchrun`` (``RANK``/``WORLD_SIZE``/``LOCAL_RANK`` set) it runs this
process's rank. NCCL on CUDA (rank r on ``cuda:LOCAL_RANK``); gloo on the simulated device
(``device="sim"``, alias ``fake``: tiny, host-timed, numbers meaningless, the code path
exercised on CPU). The CLI runs it as ``warpolicy bench overlap --tp N``.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import socket
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import attrs

from warpolicy import environment
from warpolicy.bench.command import Report, Variant, option, targets_line
from warpolicy.bench.overlap import ROWS as OVERLAP_ROWS
from warpolicy.bench.overlap import (
    OverlapBench,
    SchedulePlan,
    gap_closed,
    median,
    step_metrics,
)
from warpolicy.bench.rig import device_name, synthetic_config
from warpolicy.bench.timing import (
    SCHED_KINDS,
    CudaProbe,
    HostProbe,
    calibrate_rows,
    copy_work,
    matmul_work,
    spin_work,
)
from warpolicy.errors import CudaUnavailableError, InputError, WarpolicyError
from warpolicy.registry.engine import PolicyEngine
from warpolicy.registry.inputs import positive_int_argument
from warpolicy.registry.vocabulary import (
    ForwardMode,
    WarReadDonePolicy,
)
from warpolicy.runtime.distributed import all_gather_json, compile_consistent, guard_policy
from warpolicy.runtime.manager import open_runtime
from warpolicy.runtime.platforms import SIM_DEVICE_TYPES
from warpolicy.runtime.policy import fixed_policy

#: The single-GPU benchmark's rows (name, policy, sound for this model, skip the barrier
#: entirely) but ``derived`` and ``pre_replay``: the marker's in_graph, post_replay, and the
#: coarse and unsafe bounds.
ROWS: tuple[tuple[str, WarReadDonePolicy, bool, bool], ...] = tuple(
    row for row in OVERLAP_ROWS if row[0] in ("coarse", "post_replay", "in_graph", "no_barrier")
)
SIM_DEVICES = SIM_DEVICE_TYPES  # the one alias list
TORCHRUN_VARS = (environment.RANK, environment.WORLD_SIZE)


def _positive(instance: Any, attribute: Any, value: Any) -> None:
    if value <= 0:
        raise InputError(f"overlap --tp: {attribute.name} must be positive, not {value!r}")


def _sched_kind(instance: Any, attribute: Any, value: str) -> None:
    if value not in SCHED_KINDS:
        raise InputError(
            f"overlap --tp: sched_kind must be one of {', '.join(SCHED_KINDS)}, not {value!r}"
        )


def _env_assignment(instance: Any, attribute: Any, value: str) -> None:
    if "=" not in value or not value.split("=", 1)[0].strip():
        raise InputError(f"overlap --tp: mismatch_env must be NAME=VALUE, not {value!r}")


@attrs.frozen
class TpConfig:
    """One benchmark configuration; every rank runs the same one."""

    layers: int = attrs.field(default=32, validator=_positive)
    batch: int = attrs.field(default=32, validator=_positive)
    steps: int = attrs.field(default=150, validator=_positive)
    repeats: int = attrs.field(default=3, validator=_positive)
    layer_us: float = 100.0
    sched_us: float = 300.0
    hidden: int = attrs.field(default=2048, validator=_positive)
    warmup: int = 10
    sched_kind: str = attrs.field(default="copy", validator=_sched_kind)
    backend: str = "fa3"  # the registry backend whose compiled policy the check compares
    spec: str = "none"
    device: str = "cuda"  # "cuda" (NCCL) or "sim"/"fake" (the simulated platform, gloo)
    mismatch_rank: int | None = None  # this rank gets ``mismatch_env`` on top of its env
    mismatch_env: str = attrs.field(default="WARPOLICY_FORCE_COARSE=1", validator=_env_assignment)
    strict: bool = False  # a mismatch raises on every rank instead of falling back

    @property
    def simulated(self) -> bool:
        return self.device in SIM_DEVICES

    def to_json(self) -> dict:
        return attrs.asdict(self)


# -- the model ------------------------------------------------------------------------------


def tensor_parallel_model(cfg: Any, device: Any, group: Any = None) -> Any:
    """The synthetic model with a shared batch index and every layer ending in an all-reduce
    (the partial outputs of a row-parallel layer, summed over the ranks)."""
    import torch.distributed as dist  # noqa: PLC0415 - deferred: importing the benchmarks does not need torch

    # deferred: the synthetic model imports torch
    from warpolicy.audit.synthetic_model import Layout, SyntheticModel  # noqa: PLC0415

    model = SyntheticModel(Layout(), attrs.evolve(cfg, shared_index=True), device)
    model.after_layer = lambda h: dist.all_reduce(h, group=group)
    return model


# -- measurements (pure; the CPU tests feed them hand-made marks; `step_metrics` and
#    `gap_closed` are the single-GPU benchmark's) -------------------------------------------------


def combine_ranks(config: dict, reports: list[dict]) -> dict:
    """Every rank's report (index = rank) and the targets over all of them."""
    mismatch = config.get("mismatch_rank") is not None and len(reports) > 1
    rows = [(rep["rank"], r) for rep in reports for r in rep["rows"]]
    sound_clean = all(r["corrupted"] == 0 for _, r in rows if r["sound"])
    # the forward ends in an all-reduce, so every rank's reference output is the same
    agree = len({rep["output_checksum"] for rep in reports}) == 1
    if mismatch:
        targets = {
            "mismatch_coarse_on_every_rank": all(
                rep["consistency"]["coarse"]
                and all(r["resolved"] == "none" for r in rep["rows"] if r["barrier"])
                for rep in reports
            ),
            "sound_policies_zero_corrupted_every_rank": sound_clean,
            "outputs_agree_across_ranks": agree,
        }
    else:
        in_graph = [next(r for r in rep["rows"] if r["name"] == "in_graph") for rep in reports]
        targets = {
            "consistency_ok_every_rank": all(rep["consistency"]["ok"] for rep in reports),
            "in_graph_closes_95pct_every_rank": all(
                r["gap_closed"] is not None and r["gap_closed"] >= 0.95 for r in in_graph
            ),
            "in_graph_release_within_5pct_of_step_every_rank": all(
                abs(r["release_minus_ideal_us"]) <= 0.05 * r["step_us"] for r in in_graph
            ),
            "sound_policies_zero_corrupted_every_rank": sound_clean,
            "outputs_agree_across_ranks": agree,
        }
    return {"config": config, "world_size": len(reports), "ranks": reports, "targets": targets}


# -- one rank ------------------------------------------------------------------------------------


def _lookup(policy: Any, mode: ForwardMode) -> WarReadDonePolicy:
    """A policy's answer for a captured graph with the node planted."""
    return WarReadDonePolicy(getattr(policy, "lookup", policy)(mode, False, True))


def _rank_environ(rank: int, config: TpConfig) -> dict[str, str]:
    env = dict(environment.PROCESS)
    if config.mismatch_rank == rank:
        name, value = config.mismatch_env.split("=", 1)
        env[name.strip()] = value
    return env


def rank_report(rank: int, world_size: int, config: TpConfig, device: Any) -> dict:
    """Run every variant on this rank (inside an initialised process group); its report."""
    import torch  # noqa: PLC0415 - deferred: importing the benchmarks does not need torch

    fake = config.simulated
    runtime = open_runtime("sim" if fake else device)
    platform = runtime.platform
    gather_dev = None if fake else device
    sched_rows = 0
    if fake:  # tiny and host-timed: exercises the code path, numbers meaningless
        layers, batch, steps, repeats, hidden = (
            min(config.layers, 2),
            min(config.batch, 4),
            min(config.steps, 8),
            1,
            16,
        )
        config = attrs.evolve(
            config, layers=layers, batch=batch, steps=steps, repeats=repeats, hidden=hidden
        )
        layer_rows = 8
        probe_factory: Callable[[], Any] = HostProbe
        bookkeeping: Callable[[], None] = matmul_work(8, hidden, device)
    else:
        # every rank must all-reduce the same shape: rank 0's calibration decides
        mine = calibrate_rows(config.layer_us, config.hidden, device, tanh=True)
        layer_rows = int(all_gather_json(mine, None, gather_dev)[0])
        probe_factory = CudaProbe
        if config.sched_kind == "matmul":
            sched_rows = calibrate_rows(config.sched_us, config.hidden, device)
            bookkeeping = matmul_work(
                int(all_gather_json(sched_rows, None, gather_dev)[0]), config.hidden, device
            )
        elif config.sched_kind == "latency":
            bookkeeping = spin_work(config.sched_us, device)
        else:
            bookkeeping = copy_work(config.sched_us, device)
    warmup = min(config.warmup, max(config.steps - 2, 0))

    engine = PolicyEngine.load(environ=_rank_environ(rank, config))
    compiled, consistency = compile_consistent(
        engine,
        config.backend,
        config.spec,
        platform=platform.name,
        external_events=platform.external_events_supported(),
        strict=config.strict,
        device=gather_dev,
        observers=runtime.observers,
    )

    cfg = synthetic_config(
        device,
        batch=config.batch,
        hidden=config.hidden,
        layers=config.layers,
        layer_rows=layer_rows,
        seed=rank,
    )
    model = tensor_parallel_model(cfg, device)
    plan = SchedulePlan(model, config.steps, config.batch, seed=1 + rank)
    bench = OverlapBench(platform, model, plan, bookkeeping, config.steps, warmup, probe_factory)
    ideal = bench.ideal_us()
    rows: list[dict[str, Any]] = []
    checksum: float | None = None
    for name, policy, is_sound, skip in ROWS:
        runner = bench.runner(guard_policy(fixed_policy(policy), consistency), name)
        per_run, corrupted = [], 0
        for _ in range(config.repeats):
            ref = bench.reference(runner)
            if checksum is None:  # the last all-reduce leaves the same output on every rank
                checksum = float(ref[-1].double().sum())
            outs, marks = bench.overlapped(runner, skip)
            corrupted += sum(not torch.equal(a, b) for a, b in zip(outs, ref, strict=True))
            per_run.append(step_metrics(marks, warmup))
        row: dict[str, Any] = {k: median([m[k] for m in per_run]) for k in per_run[0]}
        row.update(
            name=name,
            policy=policy.label,
            resolved=runner.policy_for(config.batch).label,
            sound=is_sound,
            barrier=not skip,
            corrupted=corrupted,
            checked=config.steps * config.repeats,
        )
        rows.append(row)
    gap_closed(rows)
    in_graph = next(r for r in rows if r["name"] == "in_graph")
    in_graph["release_minus_ideal_us"] = in_graph["hold_us"] - ideal
    return {
        "rank": rank,
        "world_size": world_size,
        "platform": platform.name,
        "device": device_name(platform),
        "mismatch": config.mismatch_rank == rank,
        "consistency": consistency.to_json(),
        "engine_decode_policy": _lookup(compiled, ForwardMode.DECODE).label,
        "ideal_release_us": ideal,
        "layer_rows": layer_rows,
        "output_checksum": checksum,
        "rows": rows,
        "effective": {
            "layers": config.layers,
            "batch": config.batch,
            "steps": config.steps,
            "repeats": config.repeats,
            "hidden": config.hidden,
        },
    }


def run_rank(
    rank: int,
    world_size: int,
    config: TpConfig,
    *,
    init_method: str = "env://",
    local_rank: int | None = None,
    timeout_s: float = 300.0,
) -> dict:
    """Run this process's rank and return the combined result (the same on every rank).

    Initialises the process group (NCCL on ``cuda:local_rank``, gloo on the simulated device)
    unless one is already initialised, and destroys only one it created.
    """
    if config.mismatch_rank is not None and not 0 <= config.mismatch_rank < world_size:
        raise InputError(
            f"overlap --tp: mismatch rank {config.mismatch_rank} is not one of {world_size} rank(s)"
        )
    if config.mismatch_rank is not None and world_size < 2:
        raise InputError("overlap --tp: a mismatch needs at least two ranks to disagree")
    import torch  # noqa: PLC0415 - deferred: importing the benchmarks does not need torch
    import torch.distributed as dist  # noqa: PLC0415 - deferred with torch

    if config.simulated:
        device, backend = torch.device("cpu"), "gloo"
    else:
        if not torch.cuda.is_available():
            raise CudaUnavailableError(
                "the tensor-parallel overlap benchmark needs CUDA (or device 'sim')"
            )
        local = rank if local_rank is None else local_rank
        if local >= torch.cuda.device_count():
            raise CudaUnavailableError(
                f"rank {rank} needs cuda:{local}, but only "
                f"{torch.cuda.device_count()} device(s) are visible"
            )
        device, backend = torch.device("cuda", local), "nccl"
        torch.cuda.set_device(device)
    own = not dist.is_initialized()
    if own:
        kwargs: dict[str, Any] = {}
        if backend == "nccl":
            kwargs["device_id"] = device  # binds the rank's GPU; NCCL comes up eagerly
        dist.init_process_group(
            backend,
            init_method=init_method,
            rank=rank,
            world_size=world_size,
            timeout=datetime.timedelta(seconds=timeout_s),
            **kwargs,
        )
    threads = torch.get_num_threads()
    if config.simulated:  # tiny CPU ops: more threads only spin against each other
        torch.set_num_threads(1)
    try:
        rank, world_size = dist.get_rank(), dist.get_world_size()
        report = rank_report(rank, world_size, config, device)
        reports = all_gather_json(report, None, None if config.simulated else device)
        out = combine_ranks(config.to_json(), reports)
        out["backend"] = backend
        return out
    finally:
        torch.set_num_threads(threads)
        if own:
            dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


#: What a spawned rank's interpreter ignores from the start: torch's import-time warning where
#: NumPy is absent, which the parent silences (`warpolicy.cli.common.quiet_torch`) but each
#: rank would print again while it imports torch.
WORKER_WARNINGS = "ignore:Failed to initialize NumPy:UserWarning"


@contextlib.contextmanager
def _quiet_workers() -> Iterator[None]:
    """``PYTHONWARNINGS`` for the ranks' interpreters (they inherit this environment)."""
    before = environment.PYTHONWARNINGS.get()
    with environment.PYTHONWARNINGS.overridden(",".join(filter(None, [before, WORKER_WARNINGS]))):
        yield


def _spawned(rank: int, world_size: int, config: dict, init_method: str, outdir: str) -> None:
    try:
        result = run_rank(rank, world_size, TpConfig(**config), init_method=init_method)
    except WarpolicyError as exc:  # e.g. strict and a mismatch: the parent says it in one line
        Path(outdir, f"error{rank}.txt").write_text(f"rank {rank}: {exc}", encoding="utf-8")
        return
    if rank == 0:
        Path(outdir, "result.json").write_text(json.dumps(result), encoding="utf-8")


def run_overlap_tp(tp: int = 1, *, init_method: str | None = None, **config: Any) -> dict | None:
    """Run the benchmark on ``tp`` ranks; the combined result (None on torchrun ranks > 0).

    Under torchrun this process runs its own rank (``tp`` must match ``WORLD_SIZE``); else
    ``tp == 1`` runs in this process and ``tp > 1`` spawns ``tp`` processes. ``config`` holds
    `TpConfig` fields.
    """
    cfg = TpConfig(**config)
    if all(v.is_set() for v in TORCHRUN_VARS):
        world, rank = int(environment.WORLD_SIZE.get()), int(environment.RANK.get())
        if tp not in (1, world):
            raise InputError(f"overlap --tp {tp}: torchrun started {world} ranks")
        result = run_rank(
            rank,
            world,
            cfg,
            init_method="env://",
            local_rank=int(environment.LOCAL_RANK.get() or rank),
        )
        return result if rank == 0 else None
    if tp <= 0:
        raise InputError(f"overlap --tp must be positive, not {tp}")
    init = init_method or f"tcp://127.0.0.1:{_free_port()}"
    if tp == 1:
        return run_rank(0, 1, cfg, init_method=init)
    if not cfg.simulated:
        import torch  # noqa: PLC0415 - deferred: importing the benchmarks does not need torch

        if torch.cuda.device_count() < tp:
            raise CudaUnavailableError(
                f"overlap --tp {tp} needs {tp} GPUs, {torch.cuda.device_count()} visible"
            )
    import torch.multiprocessing as mp  # noqa: PLC0415 - deferred: importing the benchmarks does not need torch

    with tempfile.TemporaryDirectory(prefix="warpolicy-tp-") as outdir, _quiet_workers():
        mp.spawn(_spawned, args=(tp, cfg.to_json(), init, outdir), nprocs=tp)
        errors = sorted(Path(outdir).glob("error*.txt"))
        if errors:
            raise WarpolicyError(errors[0].read_text(encoding="utf-8"))
        return json.loads(Path(outdir, "result.json").read_text(encoding="utf-8"))


# -- output --------------------------------------------------------------------------------------


def format_overlap_tp(result: dict) -> str:
    """The result as a per-rank table (`warpolicy.bench.command.render` gives JSON too)."""
    c, ranks = result["config"], result["ranks"]
    eff = ranks[0].get("effective", c)
    lines = [
        f"tensor-parallel overlap benchmark: {result['world_size']} rank(s) "
        f"({result.get('backend', '?')}) on {ranks[0]['device']}; {eff['layers']} layers x "
        f"~{c['layer_us']:g} us, each ending in an all-reduce; batch {eff['batch']}; scheduler "
        f"~{c['sched_us']:g} us ({c['sched_kind']}); {eff['steps']} steps x {eff['repeats']} runs",
    ]
    if c.get("mismatch_rank") is not None:
        lines.append(f"rank {c['mismatch_rank']} given {c['mismatch_env']}")
    verdicts = {(r["consistency"]["ok"], r["consistency"]["message"]) for r in ranks}
    for rank in ranks:
        cons = rank["consistency"]
        state = "ok" if cons["ok"] else "MISMATCH -> coarse"
        if len(verdicts) > 1 or rank is ranks[0]:
            lines.append(f"consistency (rank {rank['rank']}): {state}: {cons['message']}")
    lines.append(
        "ideal release (end of in-graph prep): "
        + ", ".join(f"rank {r['rank']} {r['ideal_release_us']:.1f} us" for r in ranks)
    )
    lines.append("")
    lines.append(
        f"{'rank':>4s} {'variant':12s} {'resolved':12s} {'release us':>10s} "
        f"{'step us':>9s} {'gap closed':>10s} {'corrupted':>10s}  note"
    )
    for rank in ranks:
        for r in rank["rows"]:
            gap = "-" if r["gap_closed"] is None else f"{100 * r['gap_closed']:.1f}%"
            note = "" if r["sound"] else "unsafe bound"
            if "release_minus_ideal_us" in r:
                note = f"release - ideal = {r['release_minus_ideal_us']:+.1f} us"
            lines.append(
                f"{rank['rank']:>4d} {r['name']:12s} {r['resolved']:12s} "
                f"{r['hold_us']:10.1f} {r['step_us']:9.1f} {gap:>10s} "
                f"{r['corrupted']:>4d}/{r['checked']:<5d}  {note}"
            )
    lines.append("")
    lines.append(targets_line(result["targets"]))
    if ranks[0]["platform"] != "cuda":
        lines.append("(simulated platform: host timestamps, numbers are meaningless)")
    return "\n".join(lines)


# -- the command line ------------------------------------------------------------------------------


def _measure(args: argparse.Namespace) -> Report | None:
    extra = {} if args.mismatch_env is None else {"mismatch_env": args.mismatch_env}
    result = run_overlap_tp(
        args.tp,
        layers=args.layers,
        batch=args.batch,
        steps=args.steps,
        sched_kind=args.sched_kind,
        device=args.device or "cuda",
        mismatch_rank=args.mismatch_rank,
        strict=args.strict,
        **extra,
    )
    # under torchrun, ranks other than 0 print nothing
    return None if result is None else Report(result, format_overlap_tp)


#: ``warpolicy bench overlap --tp N``.
VARIANT = Variant(
    selector="--tp",
    title="tensor parallel",
    options=(
        option(
            "--tp",
            type=positive_int_argument,
            metavar="N",
            help="tensor parallel: N ranks (one GPU each), every layer ending in an "
            "all-reduce, with the cross-rank consistency check",
        ),
        option(
            "--mismatch-rank",
            type=int,
            metavar="R",
            help="with --tp: give rank R --mismatch-env (every rank must end coarse)",
        ),
        option(
            "--mismatch-env",
            metavar="NAME=VALUE",
            help="with --tp: the environment change of --mismatch-rank "
            "(default WARPOLICY_FORCE_COARSE=1)",
        ),
        option(
            "--strict",
            default=False,
            action="store_true",
            help="with --tp: a cross-rank mismatch raises on every rank",
        ),
    ),
    reads=frozenset({"steps", "device", "sched_kind", "layers", "batch"}),
    measure=_measure,
)
