"""A minimal serving-engine loop on the three warpolicy runners.

The model is `warpolicy.testing.tiny_model.TinyPagedModel`: a request-to-token table (the page
table), an in-graph gather of each token's row, a KV write at ``out_cache_loc`` and attention
over the gathered KV. The scheduler is a deterministic simulation: requests arrive, are
prefilled, decoded (or verified with ``draft_tokens`` teacher-forced draft tokens per step),
finish, and their table rows and KV slots are reused at once (LIFO). That reuse is the race:
the scheduler rewrites a freed row for step N+1 while step N, which still reads it, runs.

Each step goes through `OverlapLoop.step`: launch on the forward stream, barrier on the
schedule stream right after the launch, then the next step's table writes on the schedule
stream. Every step's logits are compared with a sequential reference (no overlap). The runners
and the loop share the runtime's observers, so an observer plugin (warpolicy-metrics:
``warpolicy_read_done_publishes_total``, ``warpolicy_barriers_total``) sees every publish and
every barrier, per runner.

    PYTHONPATH=. python examples/tiny_engine.py                   # CUDA if present, else fake
    PYTHONPATH=. python examples/tiny_engine.py --device fake --steps 40
    PYTHONPATH=. python examples/tiny_engine.py --policy post_replay
"""

from __future__ import annotations

import argparse
import random
import sys
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

import attrs
import torch

from warpolicy.registry.engine import PolicyEngine
from warpolicy.registry.vocabulary import ForwardMode, WarReadDonePolicy
from warpolicy.runtime.manager import open_runtime
from warpolicy.runtime.observers import NO_OBSERVERS, Observers
from warpolicy.runtime.platforms import Platform
from warpolicy.runtime.policy import fixed_policy
from warpolicy.runtime.runners import (
    DecodeRunner,
    GraphRunner,
    OverlapLoop,
    PrefillRunner,
    VerifyRunner,
)
from warpolicy.testing.tiny_model import (
    TinyConfig,
    TinyPagedModel,
    TinyState,
    TinyWeights,
    TokenBatch,
)

# A small config with buckets that leave room for eager fallback in every mode.
EXAMPLE_CONFIG = TinyConfig(
    decode_buckets=(1, 2, 4, 6), prefill_buckets=(16, 32), verify_buckets=(2, 4, 8, 12)
)


@attrs.frozen
class Step:
    """One scheduled step: its tokens, and the table writes that must land before it runs."""

    mode: ForwardMode
    batch: TokenBatch
    write_rows: tuple[int, ...]
    write_cols: tuple[int, ...]
    write_slots: tuple[int, ...]


@attrs.define
class _Req:
    rid: int
    prompt: int
    max_new: int
    row: int = 0
    seq_len: int = 0
    generated: int = 0
    slots: list[int] = attrs.field(factory=list)


def token_id(rid: int, pos: int, vocab: int) -> int:
    """Teacher-forced tokens: the schedule never depends on outputs (no host sync per step)."""
    return (rid * 7919 + pos * 31 + 3) % vocab


def build_schedule(cfg: TinyConfig, steps: int, *, seed: int = 0, spec: bool = True) -> list[Step]:
    """Simulate the scheduler: prefill when rows are free (every third step), else decode, or
    verify on odd steps when ``spec``. Finished requests free their row and slots (LIFO)."""
    rng = random.Random(seed)
    free_rows = list(range(cfg.max_reqs, 0, -1))  # row 0 is padding
    free_slots = list(range(cfg.kv_slots, 0, -1))  # slot 0 is padding
    waiting: list[_Req] = []
    running: list[_Req] = []
    prefill_cap = cfg.prefill_buckets[-1] + 16 if cfg.prefill_buckets else 32  # some eager
    d = cfg.draft_tokens
    out: list[Step] = []
    next_rid = 0
    for k in range(steps):
        while len(waiting) < 6:
            waiting.append(_Req(next_rid, rng.randint(3, 14), rng.randint(2, 10)))
            next_rid += 1
        tokens: list[tuple[int, int, int, int]] = []  # (id, pos, row, slot)
        writes: list[tuple[int, int, int]] = []
        if waiting and free_rows and (k % 3 == 0 or not running):
            mode, batch_reqs, n_tok = ForwardMode.EXTEND, [], 0
            while waiting and free_rows and n_tok + waiting[0].prompt <= prefill_cap:
                req = waiting.pop(0)
                req.row = free_rows.pop()
                n_tok += req.prompt
                batch_reqs.append(req)
            for req in batch_reqs:
                for pos in range(req.prompt):
                    _alloc(req, pos, free_slots, tokens, writes, cfg.vocab)
                req.seq_len = req.prompt
            running.extend(batch_reqs)
        else:
            verify = spec and k % 2 == 1 and all(r.seq_len + d <= cfg.max_ctx for r in running)
            mode = ForwardMode.TARGET_VERIFY if verify else ForwardMode.DECODE
            width = d if verify else 1
            for req in running:
                for pos in range(req.seq_len, req.seq_len + width):
                    _alloc(req, pos, free_slots, tokens, writes, cfg.vocab)
                req.seq_len += width
                req.generated += width
        ids, positions, rows, locs = zip(*tokens)
        rws, cols, slots = zip(*writes)
        out.append(Step(mode, TokenBatch.of(ids, positions, rows, locs), rws, cols, slots))
        for req in [r for r in running if r.generated >= r.max_new or r.seq_len + d > cfg.max_ctx]:
            running.remove(req)  # freed now: the next step's writes may reuse them at once
            free_rows.append(req.row)
            free_slots.extend(reversed(req.slots))
    return out


def _alloc(
    req: _Req, pos: int, free_slots: list[int], tokens: list, writes: list, vocab: int
) -> None:
    slot = free_slots.pop()
    req.slots.append(slot)
    tokens.append((token_id(req.rid, pos, vocab), pos, req.row, slot))
    writes.append((req.row, pos, slot))


class TinyEngine:
    """The three runners over one tiny model, one shared table and KV pool."""

    def __init__(
        self,
        policy: Any,
        cfg: TinyConfig = EXAMPLE_CONFIG,
        *,
        device: Any = None,
        platform: Platform | None = None,
        observers: Observers = NO_OBSERVERS,
        late_shared_read: bool = False,
    ) -> None:
        if platform is None:  # the engine is its own composition root: built once, here
            runtime = open_runtime(device)
            platform, observers = runtime.platform, runtime.observers
        self.cfg = cfg
        self.platform = platform
        self.observers = observers  # the runners' and the overlap loop's: metrics see both
        self.device = _tensor_device(self.platform, device)
        weights = TinyWeights(cfg, self.device)
        self.state = TinyState(cfg, self.device)

        def model(mode: ForwardMode) -> TinyPagedModel:
            return TinyPagedModel(cfg, weights, self.state, mode, late_shared_read=late_shared_read)

        p, obs = self.platform, observers
        self.runners: dict[ForwardMode, GraphRunner] = {
            ForwardMode.DECODE: DecodeRunner(model(ForwardMode.DECODE), policy, p, observers=obs),
            ForwardMode.EXTEND: PrefillRunner(model(ForwardMode.EXTEND), policy, p, observers=obs),
            ForwardMode.TARGET_VERIFY: VerifyRunner(
                model(ForwardMode.TARGET_VERIFY),
                policy,
                p,
                draft_tokens=cfg.draft_tokens,
                observers=obs,
            ),
        }

    def capture(self) -> None:
        for runner in self.runners.values():
            runner.capture()

    def apply_writes(self, step: Step) -> None:
        """The scheduler's table writes for ``step``, on the current stream."""
        t = lambda xs: torch.tensor(xs, dtype=torch.long, device=self.device)  # noqa: E731
        self.state.req_to_token.index_put_(
            (t(step.write_rows), t(step.write_cols)), t(step.write_slots)
        )

    def run(
        self,
        schedule: Sequence[Step],
        *,
        overlap: bool = True,
        force_coarse: bool = False,
        unsafe_skip_barrier: bool = False,
        on_step: Callable[[int, GraphRunner], None] | None = None,
    ) -> list[torch.Tensor]:
        """Run the schedule from a clean state; returns each step's logits (on the CPU).

        ``overlap=False`` is the sequential reference: writes, then the step, on one stream.
        """
        p = self.platform
        self.state.reset()
        p.synchronize()
        outs: list[torch.Tensor] = []
        if not overlap:
            for k, step in enumerate(schedule):
                self.apply_writes(step)
                runner = self.runners[step.mode]
                out = runner.run(step.batch)  # nobody takes the read-done: nobody waits
                outs.append(out[: len(step.batch)].clone())
                if on_step is not None:
                    on_step(k, runner)
        else:
            loop = OverlapLoop(
                None,
                p,
                force_coarse,
                observers=self.observers,  # barriers reach the metrics (warpolicy_barriers_total)
                unsafe_skip_barrier=unsafe_skip_barrier,
            )
            if schedule:
                self.apply_writes(schedule[0])  # the first step's writes, before the loop
            for k, step in enumerate(schedule):
                nxt = schedule[k + 1] if k + 1 < len(schedule) else None
                write_next = (lambda s=nxt: self.apply_writes(s)) if nxt is not None else None
                runner = self.runners[step.mode]
                out = loop.step(step.batch, write_next, runner=runner)
                outs.append(out[: len(step.batch)].clone())  # forward stream, before next replay
                if on_step is not None:
                    on_step(k, runner)
        p.synchronize()
        return [o.cpu() for o in outs]


def _tensor_device(platform: Any, device: Any) -> torch.device:
    """Tensors live on the CUDA device for the CUDA platform, else on the CPU (fake)."""
    if platform.name == "cuda":
        return torch.device(device) if device not in (None, "cuda") else torch.device("cuda")
    return torch.device("cpu")


def compare(outs: Sequence[torch.Tensor], ref: Sequence[torch.Tensor]) -> list[int]:
    """Indices of the steps whose logits differ from the reference (bitwise)."""
    return [k for k, (a, b) in enumerate(zip(outs, ref)) if not torch.equal(a, b)]


def resolve_policy(name: str, platform: Any, backend: str, spec: str) -> Any:
    """``engine``: compile from the default registry; otherwise one fixed policy for all modes."""
    if name != "engine":
        return fixed_policy(WarReadDonePolicy.parse(name))
    return PolicyEngine.load().compile(
        backend,
        spec=spec,
        platform=platform.name,
        external_events=platform.external_events_supported(),
    )


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--device", default=None, help="cuda, cuda:N or fake (default: CUDA if present)"
    )
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--policy",
        default="engine",
        help="engine (from the registry) or a fixed policy: in_graph, post_replay, "
        "none, pre_replay (unsound for this model)",
    )
    ap.add_argument("--backend", default="fa3")
    ap.add_argument("--spec", default="dflash", help="speculative algorithm (engine policy)")
    ap.add_argument("--no-spec", action="store_true", help="no verify steps")
    args = ap.parse_args(argv)

    runtime = open_runtime(args.device)  # plugin manager, platform, observers: built once
    platform = runtime.platform
    cfg = EXAMPLE_CONFIG
    if platform.name != "cuda":  # numbers meaningless on the fake platform: keep it short
        args.steps = min(args.steps, 60)
    policy = resolve_policy(args.policy, platform, args.backend, args.spec)
    engine = TinyEngine(policy, cfg, platform=platform, observers=runtime.observers)
    engine.capture()
    schedule = build_schedule(cfg, args.steps, seed=args.seed, spec=not args.no_spec)

    print(f"platform {platform.name}, {len(schedule)} steps, policy {args.policy}")
    for mode, runner in engine.runners.items():
        per_bucket = ", ".join(f"{b}:{runner.policy_for(b).label}" for b in runner.buckets)
        print(f"  {mode.label:14s} buckets {per_bucket}; eager: {runner.policy_for(None).label}")
    kinds: Counter = Counter()
    ref = engine.run(schedule, overlap=False)
    outs = engine.run(
        schedule,
        on_step=lambda k, r: kinds.update(
            [
                (
                    r.mode.label,
                    "eager" if r.last_step is None or r.last_step.bucket is None else "graph",
                )
            ]
        ),
    )
    print("  steps: " + ", ".join(f"{m}/{how} {n}" for (m, how), n in sorted(kinds.items())))
    bad = compare(outs, ref)
    print(f"  steps differing from the sequential reference: {len(bad)} of {len(schedule)}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
