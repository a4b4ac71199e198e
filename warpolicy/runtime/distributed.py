"""Policies that agree across ranks: one digest per rank, compared once per compile or capture.

In a tensor- or pipeline-parallel engine every rank runs its own scheduler and its own runners,
and each resolves its read-done policies from its own registry files, environment and platform.
A stale registry or a different environment on one node makes the ranks disagree, which nobody
notices on one GPU. Before capture (or when compiling) each rank condenses what decides its
policies into `PolicyFingerprint` cells:

* the platform facts (platform name, external events);
* the runner's backend and speculative algorithm, when the policy knows them;
* the placement per mode (``marker`` / ``derived``: the policy's, or the runner's own choice),
  since ranks differing only in placement would publish ``in_graph`` on some and
  ``post_replay`` on others;
* the resolved flags and the registry's entries (one short hash per flag, algorithm, backend
  and gate, without origins or docs, so the same content installed elsewhere agrees);
* the policy table: every forward mode x (graph or eager) x (planted or not).

`check_consistency` all-gathers the sha256 of those cells (32 bytes per rank). When every rank
holds the same digest the check passes. Otherwise the ranks gather each other's cells, and since
every rank then holds the same data, every rank reaches the same verdict: the coarse barrier on
all ranks (`CoarsePolicy` answers ``NONE`` for every cell), one warning naming the ranks that
differ from the majority and the first differing cell, or, with ``strict=True``, a
`RankMismatchError` on every rank. A world of one rank, or no initialised process group, is
trivially consistent and runs no collective.

The gather moves bytes in uint8 tensors rather than through ``all_gather_object``: that one
unpickles what peers send and needs numpy on torch's CPU wheels. With NCCL the tensors live on
the rank's GPU (``device``, else the group's bound device, else the current CUDA device);
with gloo on the CPU. A peer announcing more than `MAX_GATHER_BYTES` ends the check coarse on
every rank before anything that large is allocated.
"""

from __future__ import annotations

import enum
import hashlib
import json
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import attrs

from warpolicy.errors import WarpolicyError
from warpolicy.registry.decision import Context, Decision, Reason
from warpolicy.registry.engine import PolicyEngine
from warpolicy.registry.model import Registry
from warpolicy.registry.vocabulary import NONE, ForwardMode, Placement, WarReadDonePolicy
from warpolicy.runtime.observers import NO_OBSERVERS, Observers, Reporter
from warpolicy.runtime.policy import NamedPolicy, PlacedPolicy, RunnerPolicy, policy_function

#: What the cross-rank check accepts (what a runner accepts).
PolicyLike = RunnerPolicy

#: The most bytes a peer may announce in the exchange (a fingerprint of a large registry is a
#: few hundred KiB); a larger announcement ends the check coarse without allocating it.
MAX_GATHER_BYTES = 16 * 1024 * 1024

MISMATCH_ID = "rank-mismatch"
_ORIGIN = "built-in (warpolicy.runtime.distributed)"
#: attrs fields that say where or why something was declared, not what it decides
_NOT_DECIDING = frozenset({"origin", "reads_end_origins", "doc", "because", "sources"})
_DIGEST_BYTES = 32  # sha256


class RankMismatchError(WarpolicyError):
    """Ranks resolved their policies from different inputs (raised with ``strict=True``)."""

    def __init__(self, result: ConsistencyResult) -> None:
        self.result = result
        super().__init__(result.message)


# -- fingerprint ---------------------------------------------------------------------------------


def _str_cells(cells: Iterable[tuple[object, object]]) -> tuple[tuple[str, str], ...]:
    return tuple((str(k), str(v)) for k, v in cells)


@attrs.frozen
class PolicyFingerprint:
    """What decides one rank's policies, as ordered ``(key, value)`` cells."""

    cells: tuple[tuple[str, str], ...] = attrs.field(converter=_str_cells)

    @property
    def digest(self) -> str:
        """sha256 (hex) of the cells' canonical JSON."""
        return hashlib.sha256(self.to_bytes()).hexdigest()

    def to_bytes(self) -> bytes:
        return json.dumps(
            [list(c) for c in self.cells], separators=(",", ":"), ensure_ascii=True
        ).encode("ascii")

    @classmethod
    def from_bytes(cls, data: bytes) -> PolicyFingerprint:
        return cls(tuple((k, v) for k, v in json.loads(data.decode("ascii"))))


def policy_fingerprint(
    policy: PolicyLike,
    *,
    engine: PolicyEngine | None = None,
    platform: str = "cuda",
    external_events: bool = True,
    flags: Mapping[str, bool] | None = None,
    placements: Mapping[ForwardMode, Placement] | None = None,
) -> PolicyFingerprint:
    """The cells of ``policy`` (a `CompiledPolicy` or a ``(mode, eager, planted)`` callable).

    With ``engine`` the registry's entries and the resolved flags (``flags`` are the overrides
    the policy was compiled with) join the cells; without it only the platform facts, the
    placements and the table are compared, which still catches every difference that changes
    a decision of this policy. ``placements`` are a runner's own choices (``placement=``),
    which override the policy's for those modes.
    """
    cells: list[tuple[str, str]] = [
        ("platform", platform),
        ("platform.external_events", _bool(external_events)),
    ]
    if isinstance(policy, NamedPolicy):
        cells.append(("policy.backend", str(policy.backend)))
        cells.append(("policy.spec", str(policy.spec)))
    if engine is not None:
        cells.extend((f"flag.{f.name}", _bool(f.value)) for f in engine.flag_values(flags))
    cells.extend(_placement_cells(policy, placements or {}))
    lookup = policy_function(policy)
    for mode in ForwardMode:
        for eager in (False, True):
            for planted in (True, False):
                cells.append(
                    (_table_key(mode, eager, planted), _policy_label(lookup, mode, eager, planted))
                )
    if engine is not None:
        cells.extend(registry_cells(engine.registry))
    return PolicyFingerprint(tuple(cells))


def _placement_cells(
    policy: PolicyLike, given: Mapping[ForwardMode, Placement]
) -> list[tuple[str, str]]:
    """One cell per mode: where its read-done node is planted on this rank."""
    cells = []
    for mode in ForwardMode:
        if mode in given:
            value = Placement(given[mode]).value
        elif isinstance(policy, PlacedPolicy):
            try:
                value = Placement(policy.placement(mode)).value
            except Exception as exc:  # noqa: BLE001 - a failing cell is a fact to compare
                value = f"error:{type(exc).__name__}"
        else:
            value = Placement.MARKER.value
        cells.append((f"placement.{mode.value}", value))
    return cells


def registry_cells(registry: Registry) -> list[tuple[str, str]]:
    """One cell per flag, spec algorithm, backend and gate: a short hash of its content."""
    cells: list[tuple[str, str]] = []
    for kind, entries in (
        ("flag", registry.flags),
        ("spec", registry.spec_algorithms),
        ("backend", registry.backends),
    ):
        for name in sorted(entries):
            cells.append((f"registry.{kind}.{name}", _short_hash(entries[name])))
    seen: Counter[str] = Counter()
    for gate in sorted(registry.gates, key=lambda g: (g.id, _short_hash(g))):
        seen[gate.id] += 1
        suffix = "" if seen[gate.id] == 1 else f"#{seen[gate.id]}"
        cells.append((f"registry.gate.{gate.id}{suffix}", _short_hash(gate)))
    return cells


def _table_key(mode: ForwardMode, eager: bool, planted: bool) -> str:
    return (
        f"table.{mode.value}.{'eager' if eager else 'graph'}."
        f"{'planted' if planted else 'unplanted'}"
    )


def _policy_label(lookup: Callable[..., Any], mode: ForwardMode, eager: bool, planted: bool) -> str:
    try:
        return WarReadDonePolicy(lookup(mode, eager, planted)).label
    except Exception as exc:  # noqa: BLE001 - a failing cell is a fact to compare, not a crash
        return f"error:{type(exc).__name__}"


def _bool(value: bool) -> str:
    return "true" if value else "false"


def _short_hash(entry: Any) -> str:
    text = json.dumps(_canonical(entry), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def _canonical(value: Any) -> Any:
    """A JSON-able form of a registry value that is the same wherever it was loaded from."""
    if attrs.has(type(value)):
        return {
            f.name: _canonical(getattr(value, f.name))
            for f in attrs.fields(type(value))
            if f.name not in _NOT_DECIDING
        }
    if isinstance(value, enum.Enum):
        return value.name.lower()
    if isinstance(value, Mapping):
        return sorted([json.dumps(_canonical(k)), _canonical(v)] for k, v in value.items())
    if isinstance(value, (set, frozenset)):
        return sorted(json.dumps(_canonical(v)) for v in value)
    if isinstance(value, (list, tuple)):
        return [_canonical(v) for v in value]
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return repr(value)


# -- result --------------------------------------------------------------------------------------


@attrs.frozen
class CellDifference:
    """The first cell on which the ranks disagree; ``values[r]`` is None where rank r lacks it."""

    key: str
    values: tuple[str | None, ...]

    def describe(self) -> str:
        by_value: dict[str | None, list[int]] = {}
        for rank, value in enumerate(self.values):
            by_value.setdefault(value, []).append(rank)
        parts = [
            f"{'absent' if v is None else repr(v)} on {_ranks(rs)}" for v, rs in by_value.items()
        ]
        return f"{self.key}: " + ", ".join(parts)


@attrs.frozen
class ConsistencyResult:
    """The verdict every rank of the group reaches from the same gathered data."""

    ok: bool
    rank: int
    world_size: int
    digest: str
    where: str = "policy"
    checked: bool = False  # whether a collective ran (False: one rank, or no process group)
    digests: tuple[str, ...] = ()  # per rank, when gathered
    differing_ranks: tuple[int, ...] = ()  # ranks whose digest differs from the majority's
    first_difference: CellDifference | None = None
    error: str | None = None  # the check itself failed (fails closed: coarse)

    @property
    def coarse(self) -> bool:
        """Whether this rank must use the coarse barrier (every rank does, when not ok)."""
        return not self.ok

    @property
    def message(self) -> str:
        if self.ok:
            how = "checked" if self.checked else "nothing to compare"
            return (
                f"warpolicy {self.where}: policies consistent on {self.world_size} rank(s) "
                f"({how}, digest {self.digest[:12]})"
            )
        if self.error is not None:
            return f"warpolicy {self.where}: {self.error}; using the coarse barrier"
        cell = self.first_difference.describe() if self.first_difference else "(none found)"
        return (
            f"warpolicy {self.where}: ranks disagree on what decides the read-done policy: "
            f"{_ranks(self.differing_ranks)} (of {self.world_size}) "
            f"{'differs' if len(self.differing_ranks) == 1 else 'differ'} from the majority; "
            f"first differing cell {cell}; every rank uses the coarse barrier"
        )

    def to_json(self) -> dict:
        diff = self.first_difference
        return {
            "ok": self.ok,
            "coarse": self.coarse,
            "rank": self.rank,
            "world_size": self.world_size,
            "digest": self.digest,
            "where": self.where,
            "checked": self.checked,
            "digests": list(self.digests),
            "differing_ranks": list(self.differing_ranks),
            "first_difference": None
            if diff is None
            else {"key": diff.key, "values": list(diff.values)},
            "error": self.error,
            "message": self.message,
        }


def _ranks(ranks: Sequence[int]) -> str:
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(str(r) for r in ranks)


def compare_fingerprints(
    fingerprints: Sequence[PolicyFingerprint], rank: int, *, where: str = "policy"
) -> ConsistencyResult:
    """The verdict from every rank's fingerprint (index = rank); the same on every rank.

    The majority digest is the reference (ties: the one the lowest rank holds); the first
    differing cell is the first key, in the reference rank's order and then the others', whose
    value is not the same on every rank.
    """
    digests = tuple(fp.digest for fp in fingerprints)
    base = dict(
        ok=True,
        rank=rank,
        world_size=len(fingerprints),
        digest=digests[rank],
        where=where,
        checked=len(fingerprints) > 1,
        digests=digests,
    )
    if len(set(digests)) <= 1:
        return ConsistencyResult(**base)  # type: ignore[arg-type]
    reference = _majority(digests)
    differing = tuple(r for r, d in enumerate(digests) if d != reference)
    first_rank = digests.index(reference)
    order = [fingerprints[first_rank]] + [
        fp for r, fp in enumerate(fingerprints) if r != first_rank
    ]
    maps = [dict(fp.cells) for fp in fingerprints]
    diff = None
    for key in _ordered_keys(order):
        values = tuple(m.get(key) for m in maps)
        if len(set(values)) > 1:
            diff = CellDifference(key, values)
            break
    base.update(ok=False, differing_ranks=differing, first_difference=diff)
    return ConsistencyResult(**base)  # type: ignore[arg-type]


def _majority(digests: Sequence[str]) -> str:
    counts = Counter(digests)
    top = max(counts.values())
    return next(d for d in digests if counts[d] == top)


def _ordered_keys(fingerprints: Iterable[PolicyFingerprint]) -> list[str]:
    seen: dict[str, None] = {}
    for fp in fingerprints:
        for key, _ in fp.cells:
            seen.setdefault(key, None)
    return list(seen)


# -- the check -----------------------------------------------------------------------------------


def check_consistency(
    fingerprint: PolicyFingerprint,
    group: Any = None,
    *,
    strict: bool = False,
    device: Any = None,
    where: str = "policy",
    observers: Observers = NO_OBSERVERS,
) -> ConsistencyResult:
    """Compare ``fingerprint`` across the ranks of ``group`` (None: the default group).

    A collective: call it on every rank of the group, the same number of times, outside any
    graph capture, once per compile or capture. Without an initialised process group, or with
    one rank, it returns ``ok`` and runs no collective. On a mismatch (or a failure of the
    check itself) every rank gets ``ok=False`` and one warning, the ``warpolicy_on_fallback``
    ``observers`` are told (``where="<where>:consistency"``), and with ``strict=True`` every
    rank raises `RankMismatchError` instead.
    """
    result = _verdict(fingerprint, group, device, where)
    if not result.ok:
        _report(result, strict, observers)
    return result


def _verdict(
    fingerprint: PolicyFingerprint, group: Any, device: Any, where: str
) -> ConsistencyResult:
    """The check without reporting: gather, compare, fail closed on any error."""
    dist = _distributed()
    digest = fingerprint.digest
    if dist is None or (group is None and not dist.is_initialized()):
        return ConsistencyResult(True, 0, 1, digest, where)
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    if world <= 1 or rank < 0:  # rank -1: this process is not a member of ``group``
        return ConsistencyResult(True, max(rank, 0), 1, digest, where)
    try:
        return _gather_and_compare(dist, fingerprint, group, device, rank, where)
    except Exception as exc:  # noqa: BLE001 - a failed check is a mismatch: fail closed
        return ConsistencyResult(
            False,
            rank,
            world,
            digest,
            where,
            checked=True,
            error=f"the cross-rank policy check failed ({type(exc).__name__}: {exc})",
        )


def _gather_and_compare(
    dist: Any, fingerprint: PolicyFingerprint, group: Any, device: Any, rank: int, where: str
) -> ConsistencyResult:
    dev = _collective_device(dist, group, device)
    digests = all_gather_bytes(bytes.fromhex(fingerprint.digest), group, dev, fixed=True)
    if len(set(digests)) == 1:
        hexes = tuple(d.hex() for d in digests)
        return ConsistencyResult(
            True, rank, len(digests), fingerprint.digest, where, checked=True, digests=hexes
        )
    # every rank saw the same digests, so every rank takes this second round
    payloads = all_gather_bytes(fingerprint.to_bytes(), group, dev)
    return compare_fingerprints(
        [PolicyFingerprint.from_bytes(p) for p in payloads], rank, where=where
    )


def _report(result: ConsistencyResult, strict: bool, observers: Observers) -> None:
    error = RankMismatchError(result)
    reporter = Reporter(observers, result.where)
    if strict:
        reporter.counts["fallback:consistency"] += 1
        raise error
    text = result.message.removeprefix(f"warpolicy {result.where}: ")
    reporter.fallback("consistency", error, text)


def all_gather_bytes(
    payload: bytes, group: Any = None, device: Any = None, *, fixed: bool = False
) -> list[bytes]:
    """Every rank's ``payload``, by rank, through tensor all-gathers (gloo or NCCL).

    ``fixed=True`` promises equal lengths on every rank (one collective instead of two).
    Otherwise the lengths are exchanged first, and a length above `MAX_GATHER_BYTES` (or below
    zero) raises `ValueError` on every rank before the payloads are allocated.
    ``device`` is where the tensors live: a CUDA device for NCCL, the CPU for gloo.
    """
    import torch  # noqa: PLC0415 - deferred: the registry and engine import without torch
    import torch.distributed as dist  # noqa: PLC0415 - deferred with torch

    world = dist.get_world_size(group)
    dev = torch.device("cpu") if device is None else torch.device(device)
    length = len(payload)
    if fixed:
        lengths = [length] * world
    else:
        mine = torch.tensor([length], dtype=torch.int64, device=dev)
        gathered = [torch.zeros_like(mine) for _ in range(world)]
        dist.all_gather(gathered, mine, group=group)
        lengths = [int(t.item()) for t in gathered]
        # every rank saw the same lengths, so every rank refuses together (no hang)
        huge = [(rank, n) for rank, n in enumerate(lengths) if not 0 <= n <= MAX_GATHER_BYTES]
        if huge:
            rank, n = huge[0]
            raise ValueError(
                f"rank {rank} announced {n} bytes, more than MAX_GATHER_BYTES "
                f"({MAX_GATHER_BYTES}); refused before allocating"
            )
    size = max(lengths) if lengths else 0
    buf = torch.zeros(max(size, 1), dtype=torch.uint8, device=dev)
    if length:
        buf[:length] = torch.frombuffer(bytearray(payload), dtype=torch.uint8).to(dev)
    out = [torch.zeros_like(buf) for _ in range(world)]
    dist.all_gather(out, buf, group=group)
    return [bytes(t[:n].cpu().tolist()) for t, n in zip(out, lengths, strict=True)]


def all_gather_json(value: Any, group: Any = None, device: Any = None) -> list[Any]:
    """Every rank's JSON-able ``value``, by rank (for reports; never unpickles)."""
    data = json.dumps(value, separators=(",", ":")).encode("utf-8")
    return [json.loads(p.decode("utf-8")) for p in all_gather_bytes(data, group, device)]


def _collective_device(dist: Any, group: Any, device: Any) -> Any:
    """Where the check's tensors live: the CPU for gloo, the rank's GPU for NCCL."""
    backend = str(dist.get_backend(group)).lower()
    if "gloo" in backend or backend == "mpi":  # also a mixed "cpu:gloo,cuda:nccl" group
        return "cpu"
    if device is not None:
        return device
    pg = group if group is not None else dist.group.WORLD
    bound = getattr(pg, "bound_device_id", None)  # set by init_process_group(device_id=...)
    if bound is not None:
        return bound
    if "nccl" not in backend:
        return "cpu"
    import torch  # noqa: PLC0415 - deferred: only a NCCL group gets here

    return torch.device("cuda", torch.cuda.current_device())


def _distributed() -> Any:
    """torch.distributed, or None where torch (or its distributed package) is missing."""
    try:
        import torch.distributed as dist  # noqa: PLC0415 - deferred: runs without torch
    except ImportError:
        return None
    return dist if dist.is_available() else None


# -- policies that follow the verdict --------------------------------------------------------------


class CoarsePolicy:
    """A policy that answers ``NONE`` (the coarse barrier) for every cell, and says why."""

    def __init__(self, result: ConsistencyResult, backend: str = "?", spec: str = "none") -> None:
        self.result = result
        self.backend = backend
        self.spec = spec

    def lookup(
        self, mode: ForwardMode, eager: bool = False, planted: bool = True
    ) -> WarReadDonePolicy:
        return NONE

    __call__ = lookup

    def decision(self, mode: ForwardMode, eager: bool = False, planted: bool = True) -> Decision:
        ctx = Context(
            self.backend, ForwardMode.parse(mode), self.spec, eager=eager, planted=planted
        )
        return Decision(NONE, ctx, (Reason(MISMATCH_ID, self.result.message, NONE, _ORIGIN),))

    def __repr__(self) -> str:
        return f"<CoarsePolicy {self.backend!r} ({self.result.where}: ranks disagree)>"


def guard_policy(policy: PolicyLike, result: ConsistencyResult) -> PolicyLike:
    """``policy`` when the ranks agree, else a `CoarsePolicy` in its place."""
    if result.ok:
        return policy
    if isinstance(policy, NamedPolicy):
        return CoarsePolicy(result, str(policy.backend), str(policy.spec))
    return CoarsePolicy(result)


def consistent_policy(
    policy: PolicyLike,
    *,
    engine: PolicyEngine | None = None,
    platform: str = "cuda",
    external_events: bool = True,
    flags: Mapping[str, bool] | None = None,
    placements: Mapping[ForwardMode, Placement] | None = None,
    group: Any = None,
    strict: bool = False,
    device: Any = None,
    where: str = "policy",
    observers: Observers = NO_OBSERVERS,
) -> tuple[PolicyLike, ConsistencyResult]:
    """Fingerprint ``policy`` (with the runner's ``placements``), check it across ranks, and
    return what to run with.

    This is what a runner calls before its first capture (``where="runner:NAME"``). It is a
    collective: every rank of the group calls it, the same number of times, in the same order.
    """
    try:
        fingerprint = policy_fingerprint(
            policy,
            engine=engine,
            platform=platform,
            external_events=external_events,
            flags=flags,
            placements=placements,
        )
    except Exception as exc:  # noqa: BLE001 - still take part, or the peers would wait forever
        return _checked_failure(exc, group, strict, device, where, observers, policy)
    result = check_consistency(
        fingerprint, group, strict=strict, device=device, where=where, observers=observers
    )
    return guard_policy(policy, result), result


def compile_consistent(
    engine: PolicyEngine,
    backend: str,
    spec: str = "none",
    flags: Mapping[str, bool] | None = None,
    *,
    platform: str = "cuda",
    external_events: bool = True,
    group: Any = None,
    strict: bool = False,
    device: Any = None,
    observers: Observers = NO_OBSERVERS,
) -> tuple[PolicyLike, ConsistencyResult]:
    """`PolicyEngine.compile`, then the cross-rank check: the engine's compile step for TP.

    A collective, like `consistent_policy`. With ``strict=True`` a compile error still takes
    part in the check (so the peers do not wait for this rank) and is raised after it.
    """
    where = f"compile:{backend}/{spec}"
    try:
        compiled = engine.compile(
            backend, spec, flags, platform=platform, external_events=external_events, strict=strict
        )
    except Exception as exc:  # noqa: BLE001 - only raised with strict=True
        return _checked_failure(exc, group, strict, device, where, observers, None, backend, spec)
    return consistent_policy(
        compiled,
        engine=engine,
        platform=platform,
        external_events=external_events,
        flags=flags,
        group=group,
        strict=strict,
        device=device,
        where=where,
        observers=observers,
    )


def _checked_failure(
    exc: Exception,
    group: Any,
    strict: bool,
    device: Any,
    where: str,
    observers: Observers,
    policy: PolicyLike | None,
    backend: str = "?",
    spec: str = "none",
) -> tuple[PolicyLike, ConsistencyResult]:
    """This rank could not build its policy or fingerprint: take part in the check with a cell
    naming the failure (so every peer ends coarse too), then end coarse here (or raise)."""
    why = f"{type(exc).__name__}: {exc}"
    result = _verdict(PolicyFingerprint((("failed", why),)), group, device, where)
    result = attrs.evolve(result, ok=False, error=f"this rank could not build its policy ({why})")
    if strict:
        raise exc
    _report(result, False, observers)
    if policy is not None:
        return guard_policy(policy, result), result
    return CoarsePolicy(result, backend, spec), result
