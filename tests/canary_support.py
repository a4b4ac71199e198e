"""Shared by the canary's CPU tests: a model the canary can check, a named fixed policy, and a
race on the simulated platform.

The simulated platform runs everything in program order, so the scheduler's writes never race
a forward by themselves. `SimRace` seeds the race the way the audit's simulated trials do: it
lands the scheduler's next-step writes at the instant the step's published release point fires
(the in-graph node's record, or the fence's host record), which is the widest window a real GPU
could give. A reader after that point (a late reader) then reads the next step's values.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

import torch

from warpolicy.registry.vocabulary import IN_GRAPH, NONE, ForwardMode, WarReadDonePolicy
from warpolicy.runtime.canary import CanarySpec, Rows, Tolerance
from warpolicy.testing import sim_impl

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
        tolerance: Optional[Tolerance] = None,
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

    def canary_spec(self, mode: ForwardMode, bucket: int, batch: Any) -> Optional[CanarySpec]:
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


class SimRace:
    """A `StepProbe` that makes the scheduler's next writes race the step being launched: they
    land at the step's release point (see the module docstring). Use ``writes`` to wrap the
    step's ``write_next``."""

    def __init__(self, platform: Any, runner: Any) -> None:
        self.impl = sim_impl(platform)
        self.runner = runner
        self._next: Optional[tuple[Callable[[], None], int]] = None
        self._armed: Optional[tuple[Callable[[], None], Optional[int], int]] = None
        self._done = False
        self.fired = 0
        self.impl.listeners.append(self._on_entry)

    def writes(self, fn: Callable[[], None], size: int) -> Callable[[], None]:
        """The step's ``write_next``: ``fn`` runs at the release (or here, if it has not)."""
        self._next = (fn, size)
        self._done = False

        def write_next() -> None:
            if not self._done:
                self._done = True
                fn()

        return write_next

    def mark(self, point: str, stream: Any) -> None:
        if point == "launch" and self._next is not None:
            fn, size = self._next
            self._next = None
            bucket = self.runner.bucket_for(size)
            release = self.runner.release_of(bucket)
            if release.policy is NONE:
                return  # the scheduler waits for the whole forward: nothing can race
            event = release.event.id if release.policy is IN_GRAPH else None
            self._armed = (fn, event, stream.id)
        elif point == "launched":
            self._armed = None

    def _on_entry(self, entry: tuple) -> None:
        armed = self._armed
        if armed is None or entry[0] != "record":
            return
        fn, event, stream = armed
        if (event is not None and entry[1] == event and entry[3] == "in_graph") or (
            event is None and entry[2] == stream and entry[3] is False
        ):
            self._armed = None
            self._done = True
            self.fired += 1
            fn()
