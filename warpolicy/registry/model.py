"""The capability registry as frozen attrs objects.

Loading (YAML with marks, layering, located problems) lives in `warpolicy.registry.loader`; this module
is the data model, its invariants and the lookups the engine needs. The invariants are checked
on construction, so a `Registry` built in Python is held to the same rules as a loaded one: a
`Backend` has one shape (`shape_problems`), and a `Registry` has no dangling reference, no
cycle, no inheritance from a wrapper, unique gate ids and one flag per environment variable
(`registry_problems`). A violation raises `RegistryError` with a problem per finding at the
entry's `Origin`.
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Iterable, Iterator, Mapping, Optional

import attrs

from warpolicy.errors import Problem, RegistryError, UnknownNameError
from warpolicy.registry.vocabulary import ForwardMode, Placement, WarReadDonePolicy


def _frozen_map(value: Mapping | None) -> Mapping:
    return MappingProxyType(dict(value or {}))


def _names(value: Iterable[str]) -> tuple[str, ...]:
    return tuple(value)


def _gates(value: Iterable[Gate]) -> tuple[Gate, ...]:
    return tuple(value)


@attrs.frozen
class Origin:
    """Where an entry or key was declared; ``file`` is a path or a plugin fragment name."""

    file: str
    line: int = 0  # 1-based; 0 when unknown (e.g. a mapping contributed by a plugin)
    col: int = 0

    def __str__(self) -> str:
        if self.line:
            return f"{self.file}:{self.line}:{self.col}"
        return self.file


UNKNOWN_ORIGIN = Origin("<unknown>")


@attrs.frozen
class Flag:
    """An operator switch: a default plus the environment variables that set it."""

    name: str
    default: bool = False
    env: tuple[str, ...] = attrs.field(default=(), converter=_names)
    doc: str = ""
    origin: Origin = UNKNOWN_ORIGIN


@attrs.frozen
class SpecAlgorithm:
    """A speculative algorithm and the capabilities that gates test."""

    name: str
    family: Optional[str] = None
    capabilities: Mapping[str, bool] = attrs.field(factory=dict, converter=_frozen_map)
    doc: str = ""
    origin: Origin = UNKNOWN_ORIGIN
    #: the last phase of a step that reads shared state (draft_extend or target_verify);
    #: None: the last phase the step runs (the conservative default)
    last_reader: Optional[ForwardMode] = attrs.field(default=None)

    @last_reader.validator
    def _check_last_reader(self, _attribute: object, value: Optional[ForwardMode]) -> None:
        if value not in (None, ForwardMode.DRAFT_EXTEND, ForwardMode.TARGET_VERIFY):
            _raise(
                self.origin,
                f"spec_algorithms.{self.name}.last_reader",
                f"expected draft_extend or target_verify, got {value!r}",
            )

    def has(self, capability: str) -> bool:
        return bool(self.capabilities.get(capability, False))


@attrs.frozen
class Conditions:
    """A gate's ``when:``; every field that is set must hold; a set means any of its members.

    ``None`` means the condition is not tested.
    """

    mode: Optional[frozenset[ForwardMode]] = None
    backend: Optional[frozenset[str]] = None
    spec: Optional[frozenset[str]] = None
    spec_family: Optional[frozenset[str]] = None
    spec_has: Optional[frozenset[str]] = None  # spec has any of these capabilities
    spec_lacks: Optional[frozenset[str]] = None  # spec lacks any of these capabilities
    flags: Mapping[str, bool] = attrs.field(factory=dict, converter=_frozen_map)  # all must hold
    declared: Optional[frozenset[WarReadDonePolicy]] = None
    platform: Optional[frozenset[str]] = None
    eager: Optional[bool] = None
    planted: Optional[bool] = None
    external_events: Optional[bool] = None


@attrs.frozen
class Gate:
    """A declared condition that can only make a decision later (``at_least``)."""

    id: str
    when: Conditions
    at_least: WarReadDonePolicy
    because: str
    origin: Origin = UNKNOWN_ORIGIN
    scope: Optional[str] = None  # the backend whose ``gates:`` declared it, None for global
    doc: str = ""


@attrs.frozen
class Backend:
    """An attention backend's declared read ends.

    Exactly one shape: plain (``reads_end``, optionally ``inherits``), composite
    (``latest_of``: the latest of its children) or per-mode (``per_mode``: delegates each
    listed mode to a child). ``reads_end`` here is the backend's *own* map; inheritance is
    resolved by the engine so explanations can show the chain.
    """

    name: str
    reads_end: Mapping[ForwardMode, WarReadDonePolicy] = attrs.field(
        factory=dict, converter=_frozen_map
    )
    inherits: Optional[str] = None
    latest_of: tuple[str, ...] = attrs.field(default=(), converter=_names)
    per_mode: Mapping[ForwardMode, str] = attrs.field(factory=dict, converter=_frozen_map)
    gates: tuple[Gate, ...] = attrs.field(default=(), converter=_gates)
    abstract: bool = False  # a base to inherit from; left out of tables
    doc: str = ""
    origin: Origin = UNKNOWN_ORIGIN
    #: where each key of ``reads_end`` was declared (for explanations)
    reads_end_origins: Mapping[ForwardMode, Origin] = attrs.field(
        factory=dict, converter=_frozen_map
    )
    #: where the runner plants the in-graph node, per mode (own declarations; inherited per
    #: mode like ``reads_end``); an undeclared mode is `Placement.MARKER`
    plant: Mapping[ForwardMode, Placement] = attrs.field(factory=dict, converter=_frozen_map)

    def __attrs_post_init__(self) -> None:
        problems = [
            Problem(
                self.origin.file,
                self.origin.line,
                self.origin.col,
                f"backends.{self.name}: {message}",
            )
            for _key, _mode, message in shape_problems(
                reads_end=self.reads_end,
                inherits=self.inherits,
                latest_of=self.latest_of,
                per_mode=self.per_mode,
            )
        ]
        if problems:
            raise RegistryError(problems)

    @property
    def is_wrapper(self) -> bool:
        """A composite (``latest_of``) or per-mode wrapper: its read end comes from children."""
        return bool(self.latest_of or self.per_mode)

    def children(self) -> Iterator[str]:
        """Every backend this one names: inherits, latest_of, per_mode."""
        if self.inherits is not None:
            yield self.inherits
        yield from self.latest_of
        yield from self.per_mode.values()


def shape_problems(
    *,
    reads_end: Mapping[ForwardMode, object],
    inherits: Optional[str],
    latest_of: tuple[str, ...],
    per_mode: Mapping[ForwardMode, str],
) -> list[tuple[str, Optional[ForwardMode], str]]:
    """Why a backend with these fields has no single shape, as ``(key, mode, message)``
    (key ``""`` is the entry).

    Plain (``reads_end``, optionally ``inherits``), composite (``latest_of``, optionally with
    its own or inherited ``reads_end``: the engine takes the latest of all) or per-mode
    (``per_mode``, optionally ``reads_end`` for other modes). A per-mode wrapper neither
    inherits nor is a composite, and a mode is either delegated or declared: anything else would
    let the delegated child hide a declaration.
    """
    out: list[tuple[str, Optional[ForwardMode], str]] = []
    if latest_of and per_mode:
        out.append(
            (
                "",
                None,
                "use either latest_of (a composite) or per_mode (a per-mode wrapper), not both",
            )
        )
    if per_mode and inherits is not None:
        out.append(
            (
                "",
                None,
                "a per-mode wrapper cannot inherit (the delegated child would "
                "hide the inherited read ends); declare the other modes in "
                "reads_end, or delegate them",
            )
        )
    for mode in sorted(set(per_mode) & set(reads_end), key=_mode_order):
        out.append(
            (
                "per_mode",
                mode,
                f"mode {mode.label!r} is delegated here and also declared in reads_end; keep one",
            )
        )
    if len(set(latest_of)) != len(latest_of):
        out.append(("latest_of", None, "a child is listed twice"))
    return out


def _mode_order(mode: ForwardMode) -> int:
    return list(ForwardMode).index(mode)


def _raise(origin: Origin, path: str, message: str) -> None:
    raise RegistryError([Problem(origin.file, origin.line, origin.col, f"{path}: {message}")])


@attrs.frozen
class Registry:
    """A validated, merged registry. Built by `warpolicy.registry.loader`; immutable afterwards."""

    flags: Mapping[str, Flag] = attrs.field(factory=dict, converter=_frozen_map)
    spec_algorithms: Mapping[str, SpecAlgorithm] = attrs.field(factory=dict, converter=_frozen_map)
    backends: Mapping[str, Backend] = attrs.field(factory=dict, converter=_frozen_map)
    gates: tuple[Gate, ...] = attrs.field(default=(), converter=_gates)
    sources: tuple[str, ...] = attrs.field(default=(), converter=_names)

    def __attrs_post_init__(self) -> None:
        problems = registry_problems(self)
        if problems:
            raise RegistryError(problems)

    def backend(self, name: str) -> Backend:
        try:
            return self.backends[name]
        except KeyError:
            raise UnknownNameError("backend", name, self.backends) from None

    def spec(self, name: str) -> SpecAlgorithm:
        try:
            return self.spec_algorithms[name]
        except KeyError:
            raise UnknownNameError("spec algorithm", name, self.spec_algorithms) from None

    def flag(self, name: str) -> Flag:
        try:
            return self.flags[name]
        except KeyError:
            raise UnknownNameError("flag", name, self.flags) from None

    def lineage(self, name: str) -> tuple[Backend, ...]:
        """``name`` and every backend it inherits from, nearest first (raises
        `UnknownNameError` for an unknown name; stops at a cycle, which validation refuses)."""
        chain: list[Backend] = []
        seen: set[str] = set()
        current: Optional[str] = name
        while current is not None and current not in seen:
            seen.add(current)
            backend = self.backend(current)
            chain.append(backend)
            current = backend.inherits
        return tuple(chain)

    def concrete_backends(self) -> list[str]:
        """Backend names a table shows: every non-abstract backend, sorted."""
        return sorted(n for n, b in self.backends.items() if not b.abstract)


def registry_problems(registry: Registry) -> list[Problem]:
    """Every broken cross-entry invariant of ``registry`` (linear in its size)."""
    found: list[Problem] = []

    def add(origin: Origin, message: str) -> None:
        found.append(Problem(origin.file, origin.line, origin.col, message))

    backends = registry.backends
    for backend in backends.values():
        for child in backend.children():
            if child not in backends:
                add(backend.origin, f"backends.{backend.name}: unknown backend {child!r}")
        parent = backends.get(backend.inherits) if backend.inherits else None
        if parent is not None and parent.is_wrapper:
            add(
                backend.origin,
                f"backends.{backend.name}.inherits: {parent.name!r} is a "
                "composite or per-mode wrapper; inherit from a plain backend",
            )
    cycle = find_cycle(backends)
    if cycle:
        add(backends[cycle[0]].origin, "backends: cycle: " + " -> ".join(cycle))
    gate_ids: set[str] = set()
    scoped = [g for b in backends.values() for g in b.gates]
    for gate in list(registry.gates) + scoped:
        if gate.id in gate_ids:
            add(gate.origin, f"gate id {gate.id!r} is defined twice")
        gate_ids.add(gate.id)
        if gate.scope is not None and gate.scope not in backends:
            add(gate.origin, f"gate {gate.id!r} is scoped to unknown backend {gate.scope!r}")
    env_owner: dict[str, str] = {}
    for flag in registry.flags.values():
        for var in flag.env:
            if env_owner.setdefault(var, flag.name) != flag.name or flag.env.count(var) > 1:
                add(flag.origin, f"flags.{flag.name}.env: {var} sets more than one flag value")
    return found


def find_cycle(backends: Mapping[str, Backend]) -> Optional[list[str]]:
    """A cycle through inherits / latest_of / per_mode as ``[a, b, ..., a]``, or None
    (an iterative depth-first walk: a long chain does not recurse)."""
    state: dict[str, int] = {}  # 1 = on the current path, 2 = done
    for start in backends:
        if start in state:
            continue
        path = [start]
        stack = [iter(list(backends[start].children()))]
        state[start] = 1
        while stack:
            child = next(stack[-1], None)
            if child is None:
                state[path.pop()] = 2
                stack.pop()
            elif state.get(child) == 1:
                return path[path.index(child) :] + [child]
            elif child not in state and child in backends:
                state[child] = 1
                path.append(child)
                stack.append(iter(list(backends[child].children())))
    return None
