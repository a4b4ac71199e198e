"""Shared by the canary's CPU tests: a model the canary can check and a named fixed policy.
Races are seeded by `warpolicy.testing.SimRace` (shipped: users test their adapter's spec
with it, docs/canary.md)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch

from warpolicy.registry.vocabulary import ForwardMode, WarReadDonePolicy
from warpolicy.runtime.canary import CanarySpec, Rows, Tolerance
from warpolicy.testing import SimRace

ROWS = 16
SLOTS = 64


class NamedFixed:
    """A `PolicyTable` that answers one policy for every mode and names a backend and spec
    (a `NamedPolicy`, so the canary's cell has a backend)."""

    def __init__(self, policy: str, backend: str = "synthetic", spec: str = "none") -> None:
        self.policy = WarReadDonePolicy.parse(policy)
        self.backend = backend
        self.spec = spec

    def lookup(self, mode: ForwardMode, eager: bool = False, planted: bool = True) -> Any:
        return self.policy


class TableModel:
    """A `ModelAdapter` and `CanaryAdapter` on CPU tensors.

    Shared state the scheduler writes: ``table`` (int64, one value per request row). State the
    step reads and writes: ``kv`` (float), accumulated in place at slots ``table[i] % SLOTS``.
    Per bucket: static input ``x``, in-graph metadata ``idx`` (``graph_prep`` copies
    ``table[:bucket]`` into it: the in-graph prep's shared read), output ``out = 2 x + idx``.

    ``late=True``: the forward reads the live ``table`` again after the prep (a late reader,
    after the marker). ``noise``: the forward adds up to that much random noise (a forward that
    is not deterministic). ``counter=True``: the forward also bumps ``steps`` in place, state
    the canary spec does not list unless ``list_counter``. ``spec``: what ``canary_spec``
    returns (``"default"``: the KV pool as state; ``"none"``: None; ``"raise"``: raises;
    ``"interrupt"``: raises KeyboardInterrupt; ``"rows"``: the KV slots this step touches).
    """

    def __init__(
        self,
        buckets: tuple[int, ...] = (2, 4),
        *,
        late: bool = False,
        noise: float = 0.0,
        counter: bool = False,
        list_counter: bool = False,
        spec: str = "default",
        tolerance: Tolerance | None = None,
        compare_output: bool = True,
    ) -> None:
        self.buckets = buckets
        self.late = late
        self.noise = noise
        self.counter = counter
        self.list_counter = list_counter
        self.spec = spec
        self.tolerance = tolerance
        self.compare_output = compare_output
        self.table = torch.arange(ROWS, dtype=torch.int64)
        self.kv = torch.zeros(SLOTS)
        self.steps = torch.zeros(1)
        self.shared_buffers = {"table": self.table}
        self.x: dict[int, torch.Tensor] = {}
        self.idx: dict[int, torch.Tensor] = {}
        self.out: dict[int, torch.Tensor] = {}
        self.spec_calls = 0

    # -- ModelAdapter -------------------------------------------------------------------------

    def bucket_sizes(self, mode: ForwardMode) -> tuple[int, ...]:
        return self.buckets

    def prepare_bucket(self, bucket: int) -> None:
        self.x.setdefault(bucket, torch.zeros(bucket))
        self.idx.setdefault(bucket, torch.zeros(bucket, dtype=torch.int64))
        self.out.setdefault(bucket, torch.zeros(bucket))

    def host_prep(self, batch: list[float], bucket: int) -> None:
        x = self.x[bucket]
        x[: len(batch)] = torch.tensor(batch, dtype=x.dtype)
        x[len(batch) :] = 0.0

    def graph_prep(self, bucket: int) -> None:
        self.idx[bucket].copy_(self.table[:bucket])

    def forward(self, bucket: int) -> torch.Tensor:
        reads = self.table[:bucket] if self.late else self.idx[bucket]
        out = self.out[bucket]
        torch.add(self.x[bucket] * 2, reads.to(out.dtype), out=out)
        if self.noise:
            out += torch.rand(bucket) * self.noise
        self.kv.index_add_(0, reads % SLOTS, out)
        if self.counter:  # the output depends on a counter the step bumps in place
            out += self.steps
            self.steps += 1
        return out

    # -- CanaryAdapter ------------------------------------------------------------------------

    def canary_spec(self, mode: ForwardMode, bucket: int, batch: Any) -> CanarySpec | None:
        self.spec_calls += 1
        if self.spec == "none":
            return None
        if self.spec == "raise":
            raise RuntimeError("canary_spec failed")
        if self.spec == "interrupt":
            raise KeyboardInterrupt
        state: dict[str, Any] = {"kv": self.kv}
        if self.spec == "rows":
            state = {"kv": Rows(self.kv, self.table[:bucket] % SLOTS)}
        if self.list_counter:
            state["steps"] = self.steps
        return CanarySpec(state=state, tolerance=self.tolerance, compare_output=self.compare_output)

    # -- the scheduler ------------------------------------------------------------------------

    def write_rows(self, step: int) -> None:
        """The scheduler's writes for ``step``: every request row gets a fresh value."""
        self.table.copy_(torch.arange(ROWS, dtype=torch.int64) * 3 + 7 * step)


# -- the audit's synthetic shapes under the canary (CPU on the sim, and the GPU tests) ----------

SAFE_SHAPES = ("in_graph", "pre_replay_snapshot")
UNSAFE_SHAPES = (
    "late_swa_read",
    "late_kv_write",
    "pre_replay_reads_graph",
    "plant_before_prep",
    "composite_late_child",
    "reread_after_replay",
    "first_layer_rebuild",
)


class RacePlan:
    """The scheduler's schedule for a synthetic model: step ``k`` runs requests
    ``(k * batch/2 + i) mod reqs`` at random positions; before it, the scheduler gives those
    requests' table rows fresh KV slots and remaps every full slot to a fresh SWA slot, so a
    late read of either table sees the next step's values."""

    def __init__(self, model: Any, steps: int, batch: int, seed: int = 1) -> None:
        cfg = model.cfg
        g = torch.Generator().manual_seed(seed)
        k = torch.arange(steps + 1)[:, None]
        rows = (k * max(batch // 2, 1) + torch.arange(batch)[None]) % cfg.reqs
        pos = torch.randint(0, cfg.ctx, (steps + 1, batch), generator=g)
        dev = model.device
        self.model = model
        self.rows = rows.to(dev)
        self.pos = pos.to(dev)
        self.batches = torch.stack([rows, pos], dim=2).to(dev)
        self.table_rows = torch.randint(
            0, model.slots, (steps + 1, batch, cfg.ctx), generator=g
        ).to(dev)
        self.swa = torch.randint(0, cfg.swa_slots, (steps + 1, model.slots), generator=g).to(dev)

    def batch(self, step: int) -> Any:
        return self.batches[step]

    def write_step(self, step: int) -> None:
        self.model.req_to_token.index_copy_(0, self.rows[step], self.table_rows[step])
        self.model.full_to_swa.copy_(self.swa[step])

    def slots(self, step: int) -> Any:
        """The KV slots step ``step`` writes (read from the table as it is now)."""
        cfg = self.model.cfg
        return self.model.req_to_token.view(-1).index_select(
            0, self.rows[step] * cfg.ctx + self.pos[step]
        )


def synthetic_policy(name: str, platform: Any) -> Any:
    """The compiled policy of synthetic backend ``name`` (a `NamedPolicy`: the canary's cell
    names the backend)."""
    from warpolicy.audit.synthetic import synthetic_backend
    from warpolicy.registry.engine import PolicyEngine

    backend = synthetic_backend(name)
    engine = PolicyEngine(backend.registry(), environ={})
    return engine.compile(
        backend.name,
        "none",
        platform=platform.name,
        external_events=platform.external_events_supported(),
        strict=True,
    )


def synthetic_model(name: str, platform: Any, cfg: Any = None) -> Any:
    """The audit's synthetic model in the layout of backend ``name``, on ``platform``'s device."""
    from warpolicy.audit.synthetic import synthetic_backend
    from warpolicy.audit.synthetic_model import SyntheticConfig, SyntheticModel

    device = platform.device if platform.name == "cuda" else torch.device("cpu")
    return SyntheticModel(synthetic_backend(name).layout, cfg or SyntheticConfig(), device)


class PostStepRunner:
    """An engine's step that is a graph runner's step plus eager work after the replay (the
    ``reread_after_replay`` shape's ``post_step``), checked by the canary through the session
    API: the rerun replays the graph *and* the eager work, and a violation demotes the inner
    runner's bucket (`GraphRunner.demote`). A `Runner` and a `CanaryHost`."""

    def __init__(self, inner: Any, post_step: Callable[[Any, Any, Any], Any], canary: Any) -> None:
        self.inner = inner
        self.post_step = post_step
        self.canary = canary
        self.session = canary.session(
            inner.name,
            inner.mode,
            backend=str(getattr(inner._policy, "backend", "")),
            spec=str(getattr(inner._policy, "spec", "")),
            on_demote=inner.demote,
        )
        self._step = 0

    def __getattr__(self, name: str) -> Any:  # name, mode, platform, fence, captured, ...
        return getattr(self.inner, name)

    def capture(self) -> None:
        self.inner.capture()

    def run(self, batch: Any) -> Any:
        inner, p = self.inner, self.inner.platform
        due = self.session.step()
        bucket = inner.bucket_for(inner.size_of(batch))
        sample = None
        held: dict[str, Any] = {}
        if due and bucket is not None:
            graph = inner.captured[bucket].graph

            def rerun() -> Any:
                p.replay(graph)
                return self.post_step(inner.mode, batch, held["out"])

            sample = self.session.begin(
                bucket,
                self._step,
                inner.release_of(bucket),
                lambda: inner.model.canary_spec(inner.mode, bucket, batch),
                inner.model.shared_buffers,
                rerun,
            )
        held["out"] = out = inner.run(batch)
        result = self.post_step(inner.mode, batch, out)
        if sample is not None:
            self.session.observe(sample, result)
        self._step += 1
        return result

    def check_canary(self) -> None:
        self.session.check()


class HeadStall:
    """A `StepProbe` that holds the forward stream at each launch (the host enqueues the whole
    step and the scheduler's writes before the GPU starts it), and optionally lands the writes
    at the release on the simulated platform (`SimRace`)."""

    def __init__(self, stall: Callable[[], None] | None, race: SimRace | None = None) -> None:
        self.stall = stall
        self.race = race

    def mark(self, point: str, stream: Any) -> None:
        if point == "launch" and self.stall is not None:
            self.stall()
        if self.race is not None:
            self.race.mark(point, stream)


def fingerprint(out: Any, model: Any, slots: Any) -> tuple[Any, Any]:
    """What a step produced: its output and the KV rows at the slots it should have written."""
    return out.detach().clone(), model.kv_pool.index_select(0, slots)


ModelFactory = Callable[[Any, Any], Any]  # (platform, cfg) -> a synthetic-like model


def reference_run(
    name: str,
    platform: Any,
    steps: int,
    batch: int,
    cfg: Any = None,
    model_factory: ModelFactory | None = None,
) -> tuple[list, list]:
    """The independent reference: each step eagerly, sequentially (writes, then the step, on
    one stream: nothing can race), no graph and no canary. Returns each step's fingerprint
    and the KV slots it wrote."""
    model = (model_factory or functools.partial(synthetic_model, name))(platform, cfg)
    plan = RacePlan(model, steps, batch)
    bucket = min(b for b in model.bucket_sizes(ForwardMode.DECODE) if b >= batch)  # the runner's
    model.prepare_bucket(bucket)
    prints, slots = [], []
    for k in range(steps):
        plan.write_step(k)
        b = plan.batch(k)
        model.host_prep(b, bucket)
        model.graph_prep(bucket)
        out = model.forward(bucket)
        if model.layout.reread_after_replay:
            out = model.reread(ForwardMode.DECODE, b, out)
        out = out[: b.shape[0]]
        slots.append(plan.slots(k))
        prints.append(fingerprint(out, model, slots[-1]))
    platform.synchronize()
    return prints, slots


def same(a: tuple[Any, Any], b: tuple[Any, Any], exact: bool) -> bool:
    """Whether two fingerprints agree: bitwise, or (a graph against an eager run on a GPU)
    within the rounding of their dtype; a race moves whole rows, far beyond either."""
    if exact:
        return all(torch.equal(x, y) for x, y in zip(a, b))
    for x, y in zip(a, b):
        tol = 1e-4 if x.dtype in (torch.float32, torch.float64) else 3e-2
        if not torch.allclose(x.float(), y.float(), rtol=tol, atol=tol):
            return False
    return True


class ShapeTrial:
    """One run of a synthetic shape with the canary checking every step (rate 1), overlapped,
    the scheduler's writes racing it: what each step produced (its output and the KV rows at
    the slots the reference step wrote, ``slots``) and which steps the canary flagged."""

    def __init__(
        self,
        name: str,
        platform: Any,
        slots: list,
        batch: int,
        *,
        cfg: Any = None,
        observers: Any = None,
        sim_race: bool = False,
        stall: Callable[[], None] | None = None,
        head_stall: Callable[[], None] | None = None,
        canary_state: str = "whole",
        tolerance: Tolerance | None = None,
        model_factory: ModelFactory | None = None,
        policy: Any = None,
    ) -> None:
        from warpolicy.audit.subject import stalled_model
        from warpolicy.runtime.canary import Canary, CanaryConfig
        from warpolicy.runtime.observers import NO_OBSERVERS
        from warpolicy.runtime.runners import DecodeRunner, OverlapLoop

        steps = len(slots)
        observers = observers if observers is not None else NO_OBSERVERS
        self.model = model = (model_factory or functools.partial(synthetic_model, name))(
            platform, cfg
        )
        model.canary_state = canary_state
        model.canary_tolerance = tolerance
        self.plan = plan = RacePlan(model, steps, batch)
        self.canary = Canary(platform, CanaryConfig(rate=1.0, seed=0), observers=observers)
        adapter = stalled_model(model, stall) if stall is not None else model
        post = model.layout.reread_after_replay
        runner = DecodeRunner(
            adapter,
            policy if policy is not None else synthetic_policy(name, platform),
            platform,
            name=name,
            observers=observers,
            canary=None if post else self.canary,
            self_check="off",
            placement="marker",
        )
        self.graph_runner = runner
        self.runner: Any = PostStepRunner(runner, model.reread, self.canary) if post else runner
        self.runner.capture()
        race = SimRace(platform, self.runner) if sim_race else None
        self.loop = OverlapLoop(self.runner, probe=HeadStall(head_stall, race))
        self.prints: list = []
        plan.write_step(0)
        platform.synchronize()
        for k in range(steps):

            def write(k: int = k) -> None:
                plan.write_step(k + 1)

            b = plan.batch(k)
            write_next = race.writes(write, b.shape[0]) if race is not None else write
            out = self.loop.step(b, write_next)[: b.shape[0]]
            self.prints.append(fingerprint(out, model, slots[k]))
        self.loop.drain()
        #: the steps the canary flagged (each cell once: it runs coarse afterwards)
        self.flagged = sorted(v.step for v in self.canary.violations)
        self.policy_after = self.graph_runner.policy_for(batch)

    def judge(self, reference: list, exact: bool) -> tuple[list[int], list[int]]:
        """(steps where the race fired, steps corrupted after the first flag)."""
        fired = [k for k, (a, b) in enumerate(zip(self.prints, reference)) if not same(a, b, exact)]
        first = self.flagged[0] if self.flagged else len(self.prints)
        return fired, [k for k in fired if k > first]


def synthetic_factory(platform: Any) -> Any:
    """An audit factory (``canary_support:synthetic_factory``): the in-graph synthetic subject."""
    from warpolicy.audit.synthetic import make_synthetic

    return make_synthetic("in_graph", platform=platform)
