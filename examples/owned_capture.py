"""An engine that captures its own CUDA graphs, adopting warpolicy's read-done fence.

The runner below mirrors SGLang's ``CudaGraphRunner`` (``model_executor/cuda_graph_runner.py``)
and never uses a warpolicy runner: it captures one graph per batch size with the attention
backend's metadata prep inside the graph, lets warpolicy check the marker or derive the
read-done node (`warpolicy.runtime.owned_capture`), instantiates, replays, publishes the
read-done event to the scheduler's mailbox (the fence), and the scheduler's overlap loop waits
through the `SchedulerBarrier` before it rewrites the next batch's request-to-token rows. Every
step's logits are compared with a sequential run (no overlap). The walk-through is
``docs/integrating.md``.

    PYTHONPATH=. python examples/owned_capture.py                        # CUDA if present, else sim
    PYTHONPATH=. python examples/owned_capture.py --device cuda --placement derived
    PYTHONPATH=. python examples/owned_capture.py --device sim --steps 40

Exit code 0 when every step equals the sequential run, 1 otherwise (``--no-barrier`` is the
unsafe control: on a GPU some steps differ).
"""

from __future__ import annotations

import argparse
import functools
import sys
from collections.abc import Callable, Sequence
from typing import Any

import torch

from warpolicy.registry.engine import PolicyEngine
from warpolicy.registry.vocabulary import ForwardMode
from warpolicy.runtime.manager import Runtime, collect_fragments, open_runtime
from warpolicy.runtime.owned_capture import (
    BucketOutcome,
    CellPolicy,
    ReadDoneCapture,
    ReadDoneFence,
    SchedulerBarrier,
    capturing,
    resolve_cell,
    shutdown,
    warm_up,
)

HIDDEN, LAYERS, VOCAB = 64, 4, 32
REQUESTS, CONTEXT = 16, 32  # request-to-token table: rows x positions (row 0: padding)
SLOTS = REQUESTS * CONTEXT + 1  # KV slots (slot 0: the sink padded tokens read)


class SharedState:
    """What the scheduler shares with the forward: SGLang's ``req_to_token_pool``."""

    def __init__(self, device: torch.device) -> None:
        g = torch.Generator().manual_seed(0)
        self.req_to_token = torch.randint(1, SLOTS, (REQUESTS + 1, CONTEXT), generator=g).to(device)
        self.req_to_token[0].zero_()
        self.kv = torch.randn(SLOTS, HIDDEN, generator=g).to(device)  # one "KV" row per slot


class TritonLikeBackend:
    """An attention backend in SGLang's shape: CUDA-graph state per batch size, the metadata
    prep (``init_forward_metadata_replay_cuda_graph``) that reads the shared table, and the
    attention that reads only the backend's own buffers."""

    def __init__(self, state: SharedState, device: torch.device) -> None:
        self.state = state
        self.device = device
        self.kv_indices: dict[int, torch.Tensor] = {}

    def init_cuda_graph_state(self, bs: int) -> None:
        self.kv_indices[bs] = torch.zeros(bs, CONTEXT, dtype=torch.long, device=self.device)

    def init_forward_metadata(self, bs: int, req_pool_indices: torch.Tensor) -> None:
        """In the graph: gather the requests' table rows (the shared read)."""
        torch.index_select(self.state.req_to_token, 0, req_pool_indices, out=self.kv_indices[bs])

    def attention(self, bs: int, q: torch.Tensor, seq_lens: torch.Tensor) -> torch.Tensor:
        keys = self.state.kv[self.kv_indices[bs]]  # [bs, CONTEXT, HIDDEN]
        mask = torch.arange(CONTEXT, device=self.device)[None, :] < seq_lens[:, None]
        scores = torch.einsum("bh,bsh->bs", q, keys).masked_fill(~mask, float("-inf"))
        return torch.einsum("bs,bsh->bh", scores.softmax(-1), keys)


class Model:
    def __init__(self, backend: TritonLikeBackend, device: torch.device) -> None:
        g = torch.Generator().manual_seed(1)
        self.backend = backend
        self.embed = torch.randn(VOCAB, HIDDEN, generator=g).to(device)
        self.layers = [
            (torch.randn(HIDDEN, HIDDEN, generator=g) / HIDDEN**0.5).to(device)
            for _ in range(LAYERS)
        ]
        self.head = (torch.randn(HIDDEN, VOCAB, generator=g) / HIDDEN**0.5).to(device)

    def forward(self, bs: int, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        h = self.embed[inputs["input_ids"]]
        for w in self.layers:
            h = h + self.backend.attention(bs, torch.tanh(h @ w), inputs["seq_lens"])
        return h @ self.head


class CudaGraphRunner:
    """SGLang's CudaGraphRunner flow, with warpolicy's read-done point."""

    def __init__(
        self, model: Model, runtime: Runtime, cell: CellPolicy, capture_bs: Sequence[int]
    ) -> None:
        self.model, self.backend = model, model.backend
        self.platform = runtime.platform
        self.observers = runtime.observers
        self.cell = cell
        self.capture_bs = sorted(capture_bs)
        device = model.embed.device
        largest = self.capture_bs[-1]
        # static inputs, sliced per batch size (SGLang: self.input_ids, self.seq_lens, ...)
        self.inputs = {
            "input_ids": torch.zeros(largest, dtype=torch.long, device=device),
            "req_pool_indices": torch.zeros(largest, dtype=torch.long, device=device),
            "seq_lens": torch.ones(largest, dtype=torch.long, device=device),
        }
        # the scheduler's mailbox: this runner's fence publishes, the scheduler takes
        self.fence = ReadDoneFence(self.platform, name="decode", observers=self.observers)
        self.graphs: dict[int, Any] = {}
        self.outcomes: dict[int, BucketOutcome] = {}
        self.outputs: dict[int, torch.Tensor] = {}

    def _inputs(self, bs: int) -> dict[str, torch.Tensor]:
        return {name: t[:bs] for name, t in self.inputs.items()}

    def _body(self, bs: int, mark: Callable[[], Any] | None) -> None:
        inputs = self._inputs(bs)
        self.backend.init_forward_metadata(bs, inputs["req_pool_indices"])  # in-graph prep
        if mark is not None:
            mark()  # the marker, right after the prep (nothing under derived placement)
        self.outputs[bs] = self.model.forward(bs, inputs)

    def capture(self) -> None:
        """The first capture, or a re-capture: the same code (the old graphs serve until the
        new set is complete)."""
        p = self.platform
        for bs in self.capture_bs:
            self.backend.init_cuda_graph_state(bs)
        graphs: dict[int, Any] = {}
        outcomes: dict[int, BucketOutcome] = {}
        # the host waits before and after (also if anything below raises): in-flight steps,
        # what the captures enqueue
        with capturing(p):
            # warm up eagerly on a side stream first (cuBLAS, the allocator), as torch asks;
            # joined and synchronized on any exit, so no warm-up read outlives a failure
            with warm_up(p, observers=self.observers):
                for bs in self.capture_bs:
                    self._body(bs, None)
            # one ReadDoneCapture per capture of every batch size (it probes the walk once)
            capture = ReadDoneCapture(p, self.cell, self.fence, observers=self.observers)
            pool = p.graph_pool()
            for bs in reversed(self.capture_bs):  # largest first: smaller graphs share its pool
                bucket = capture.begin(bs)
                graph = p.new_graph(keep_graph=True)  # torch.cuda.CUDAGraph(keep_graph=True)
                # torch.cuda.graph(graph, pool=pool) on CUDA; the simulated platform replays it
                p.capture_callable(graph, functools.partial(self._body, bs, bucket.mark), pool=pool)
                shared = {"req_to_token": self.backend.state.req_to_token}
                outcomes[bs] = bucket.finish(graph, shared)  # check/derive, instantiate, decide
                graphs[bs] = graph
        self.graphs, self.outcomes = graphs, outcomes  # complete: swap the new set in

    def shutdown(self) -> None:
        """Before the graphs, their events and the shared buffers go: nothing in flight."""
        shutdown(self.platform, self.fence)

    def replay(self, input_ids: torch.Tensor, rows: torch.Tensor, lens: torch.Tensor) -> Any:
        """SGLang's ``replay_prepare`` + ``replay``, publishing the bucket's read-done."""
        n = int(input_ids.numel())
        bs = next(b for b in self.capture_bs if b >= n)
        self.inputs["input_ids"][:n].copy_(input_ids)
        self.inputs["req_pool_indices"][:n].copy_(rows)
        self.inputs["seq_lens"][:n].copy_(lens)
        self.inputs["req_pool_indices"][n:bs].zero_()  # padding: row 0, length 1
        self.inputs["seq_lens"][n:bs].fill_(1)
        # canary: due = session.step() first; the release is session.release_for(bs, ...)
        release = self.outcomes[bs].release  # decided once, at capture
        # canary: if due, sample = session.begin(bs, step, release, spec, shared, rerun)
        # begin, replay, publish: a replay that raises publishes nothing (the coarse barrier)
        self.fence.launch(release, self.platform.replay, self.graphs[bs])
        # canary: if sampled, session.observe(sample, self.outputs[bs])
        return self.outputs[bs][:n]


class Schedule:
    """Decode steps of growing batches; before step ``k`` the scheduler rewrites the table rows
    of its requests (half of them shared with step ``k - 1``) with fresh slots."""

    def __init__(self, steps: int, sizes: Sequence[int], device: torch.device) -> None:
        g = torch.Generator().manual_seed(2)
        self.steps = []
        for k in range(steps):
            n = sizes[k % len(sizes)]
            rows = (torch.arange(n) + k * max(n // 2, 1)) % REQUESTS + 1
            lens = torch.randint(1, CONTEXT + 1, (n,), generator=g)
            table = torch.randint(1, SLOTS, (n, CONTEXT), generator=g)
            ids = torch.randint(0, VOCAB, (n,), generator=g)
            self.steps.append(tuple(t.to(device) for t in (ids, rows, lens, table)))

    def write(self, state: SharedState, k: int) -> None:
        """The scheduler's device writes for step ``k`` (on the current stream)."""
        _, rows, _, table = self.steps[k]
        state.req_to_token.index_copy_(0, rows, table)


def run(
    runner: CudaGraphRunner,
    state: SharedState,
    schedule: Schedule,
    overlap: bool,
    *,
    barrier_on: bool = True,
) -> list[torch.Tensor]:
    p = runner.platform
    forward = p.current_stream()
    schedule_stream = p.new_stream()
    barrier = SchedulerBarrier(p, observers=runner.observers)
    outs: list[torch.Tensor] = []
    schedule.write(state, 0)
    for k, (ids, rows, lens, _) in enumerate(schedule.steps):
        if not overlap:
            if k:
                schedule.write(state, k)
            outs.append(runner.replay(ids, rows, lens).clone())  # nobody takes: nobody waits
            continue
        p.wait_stream(forward, schedule_stream)  # step k reads what the scheduler wrote for it
        outs.append(runner.replay(ids, rows, lens).clone())
        read_done = runner.fence.take()  # the mailbox, right after the launch (consume once)
        if barrier_on:
            barrier.apply(schedule_stream, forward, read_done)  # event, or coarse without one
        elif read_done is not None:
            read_done.discard()  # the unsafe control: nothing waits
        if k + 1 < len(schedule.steps):
            with p.stream(schedule_stream):
                schedule.write(state, k + 1)  # overlaps step k's forward
                # canary: session.check() here, after the writes
    p.synchronize()
    return [o.cpu() for o in outs]


def build(
    runtime: Runtime, backend: str = "triton", placement: str | None = None
) -> tuple[CudaGraphRunner, SharedState]:
    """The engine: state, backend, model, and the runner (not captured yet) with the
    registry's policy for (``backend``, decode, no speculative algorithm), resolved once."""
    platform = runtime.platform
    device = torch.device("cuda") if platform.name == "cuda" else torch.device("cpu")
    state = SharedState(device)
    model = Model(TritonLikeBackend(state, device), device)
    engine = PolicyEngine.load(fragments=collect_fragments(runtime.pm))  # plugins' fragments too
    cell = resolve_cell(engine, backend, ForwardMode.DECODE, "none", platform=platform,
                        placement=placement)  # fmt: skip
    return CudaGraphRunner(model, runtime, cell, capture_bs=(1, 2, 4, 8)), state


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default=None, help="cuda or sim (default: CUDA if present)")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--backend", default="triton", help="registry backend (default triton)")
    ap.add_argument("--placement", choices=("marker", "derived"), default=None,
                    help="where the read-done node goes (default: the registry's)")  # fmt: skip
    ap.add_argument("--no-barrier", action="store_true",
                    help="the unsafe control: the scheduler writes without waiting")  # fmt: skip
    args = ap.parse_args(argv)
    device = args.device or ("cuda" if torch.cuda.is_available() else "sim")
    runtime = open_runtime(device)  # plugin manager, platform, observers: built once
    runner, state = build(runtime, args.backend, args.placement)
    runner.capture()
    print(f"platform {runtime.platform.name}, {args.steps} steps, backend {args.backend}")
    for bs, outcome in sorted(runner.outcomes.items()):
        print(f"  batch {bs}: publishes {outcome.policy.label}: {outcome.report.detail}")
    schedule = Schedule(args.steps, (1, 3, 8, 6), state.req_to_token.device)
    reference = run(runner, state, schedule, overlap=False)
    overlapped = run(runner, state, schedule, overlap=True, barrier_on=not args.no_barrier)
    runner.shutdown()
    bad = [k for k, (a, b) in enumerate(zip(overlapped, reference)) if not torch.equal(a, b)]
    print(f"  steps differing from the sequential run: {len(bad)} of {len(schedule.steps)}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
