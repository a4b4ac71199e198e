"""The capability registry as frozen attrs objects.

Loading (YAML with marks, layering, located problems) lives in `warpolicy.registry.loader`; this
module is the data model, its invariants and the lookups the engine needs. The invariants are
checked on construction, so a `Registry` built in Python is held to the same rules as a loaded
one: a `Backend` has one shape (`shape_problems`), and a `Registry` has no dangling reference
(backends, facts of the right type), no cycle, no inheritance from a wrapper, unique gate ids
and one flag per environment variable (`registry_problems`). A violation raises `RegistryError`
with a problem per finding at the entry's `Origin`. `registry_warnings` names what is valid but
hazardous (a per-batch router whose choice may change inside one forward).

Per-batch facts (`Fact`) are values known only when a batch runs: a query-token count, whether
a per-batch action (a snapshot, a staging copy) succeeded, which child a router picked. Gates
test them (`FactTest`), a declaration may hold only after an action (`After`), a spec
capability may too (``SpecAlgorithm.capabilities_after``), and a router (`Route`) names its
child by one.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Iterable, Iterator, Mapping
from types import MappingProxyType

import attrs

from warpolicy.errors import InputError, Problem, RegistryError, UnknownNameError
from warpolicy.registry.vocabulary import (
    FactType,
    ForwardMode,
    Placement,
    WarReadDonePolicy,
    platform_key,
)


def _frozen_map(value: Mapping | None) -> Mapping:
    return MappingProxyType(dict(value or {}))


def _names(value: Iterable[str]) -> tuple[str, ...]:
    return tuple(value)


def _gates(value: Iterable[Gate]) -> tuple[Gate, ...]:
    return tuple(value)


def _platform_set(value: Iterable[str] | None) -> frozenset[str] | None:
    return None if value is None else frozenset(platform_key(v) for v in value)


def _name_set(value: Iterable[str]) -> frozenset[str]:
    return frozenset(value)


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


#: The class a plain (one-policy) declaration means: the scheduler's metadata tables.
METADATA = "metadata"

#: The buffer classes every registry knows, with what each holds.
BUILT_IN_CLASSES: Mapping[str, str] = MappingProxyType(
    {
        METADATA: "The scheduler's metadata tables a forward reads: request-to-token rows, "
        "sequence lengths, SWA maps, page tables (what a one-policy declaration means).",
        "recurrent_state": "Per-request recurrent state slots of linear-attention layers "
        "(Mamba / GDN): read and updated by every such layer of the forward.",
        "kv_pages": "KV cache pages by slot: a page or request slot the scheduler frees and "
        "hands to the next batch while the forward may still read it.",
        "host_staging": "Pinned host staging and device-visible host rings the scheduler "
        "refills (inputs copied to the device, outputs copied back).",
    }
)


@attrs.frozen
class BufferClass:
    """A class of scheduler-shared state a declaration may end reads of separately."""

    name: str
    doc: str = ""
    origin: Origin = UNKNOWN_ORIGIN
    built_in: bool = False


def built_in_classes() -> dict[str, BufferClass]:
    """The built-in buffer classes (`BUILT_IN_CLASSES`) as models."""
    return {n: BufferClass(n, doc, built_in=True) for n, doc in BUILT_IN_CLASSES.items()}


def _with_built_in_classes(value: Mapping[str, BufferClass] | None) -> Mapping:
    merged = built_in_classes()
    merged.update(value or {})
    return MappingProxyType(merged)


def _class_maps(value: Mapping | None) -> Mapping:
    return MappingProxyType({m: MappingProxyType(dict(c)) for m, c in (value or {}).items()})


@attrs.frozen
class Flag:
    """An operator switch: a default plus the environment variables that set it.

    ``env`` is ordered (the first one set wins); a name in ``inverted`` sets the flag to the
    opposite of its value (an opt-out switch such as SGLang main's
    ``SGLANG_FORCE_PREFILL_COARSE_WAR_BARRIER`` for ``prefill_read_done``).
    """

    name: str
    default: bool = False
    env: tuple[str, ...] = attrs.field(default=(), converter=_names)
    doc: str = ""
    origin: Origin = UNKNOWN_ORIGIN
    inverted: frozenset[str] = attrs.field(default=frozenset(), converter=_name_set)

    @inverted.validator
    def _check_inverted(self, _attribute: object, value: frozenset[str]) -> None:
        stray = sorted(value - set(self.env))
        if stray:
            _raise(self.origin, f"flags.{self.name}.env", f"inverted names not in env: {stray}")


@attrs.frozen
class Fact:
    """A per-batch fact: a value the runner knows only when a batch runs.

    Declared in the registry with its type (`FactType`); ``values`` optionally lists the names a
    ``name`` fact may take (gates and routers are checked against it).
    """

    name: str
    type: FactType
    doc: str = ""
    values: frozenset[str] | None = attrs.field(default=None)
    origin: Origin = UNKNOWN_ORIGIN

    @values.validator
    def _check_values(self, _attribute: object, value: frozenset[str] | None) -> None:
        if value is not None and self.type is not FactType.NAME:
            _raise(self.origin, f"facts.{self.name}.values", "only a name fact lists values")

    def valid(self, value: object) -> bool:
        """Whether ``value`` is a value of this fact (anything else counts as not reported)."""
        return fact_value_ok(self, value)


def fact_value_ok(fact: Fact, value: object) -> bool:
    """``int`` facts take ints (not bools), ``bool`` and ``action`` facts bools, ``name`` facts
    strings (one of ``values`` when the fact lists them)."""
    kind = fact.type
    if kind is FactType.INT:
        return type(value) is int
    if kind is FactType.NAME:
        return type(value) is str and (fact.values is None or value in fact.values)
    return type(value) is bool


#: Comparisons an ``int`` fact test may use, and how they print.
COMPARISONS: Mapping[str, tuple[Callable[[int, int], bool], str]] = MappingProxyType(
    {
        "gt": (operator.gt, ">"),
        "ge": (operator.ge, ">="),
        "lt": (operator.lt, "<"),
        "le": (operator.le, "<="),
        "eq": (operator.eq, "=="),
    }
)

#: Which fact types each kind of test accepts.
_TEST_TYPES = {
    "bool": (FactType.BOOL, FactType.ACTION),
    "int": (FactType.INT,),
    "name": (FactType.NAME,),
}


def _compare(value: Iterable[tuple[str, int]]) -> tuple[tuple[str, int], ...]:
    return tuple((str(op), int(n)) for op, n in value)


@attrs.frozen
class FactTest:
    """One per-batch fact condition of a gate: exactly one of ``equals`` (a ``bool`` or
    ``action`` fact is this value), ``compare`` (an ``int`` fact passes every comparison) or
    ``names`` (a ``name`` fact is any of these)."""

    equals: bool | None = None
    compare: tuple[tuple[str, int], ...] = attrs.field(default=(), converter=_compare)
    names: frozenset[str] | None = None

    def __attrs_post_init__(self) -> None:
        given = [self.equals is not None, bool(self.compare), self.names is not None]
        if sum(given) != 1:
            raise InputError("a fact test is exactly one of: a boolean, comparisons, names")
        bad = [op for op, _n in self.compare if op not in COMPARISONS]
        if bad:
            raise InputError(f"unknown comparison {bad[0]!r}; use {', '.join(COMPARISONS)}")
        if self.names is not None and not self.names:
            raise InputError("a fact test names at least one value")

    @property
    def kind(self) -> str:
        """``bool``, ``int`` or ``name``: the kind of fact the test is written for."""
        if self.equals is not None:
            return "bool"
        return "int" if self.compare else "name"

    def accepts(self, fact_type: FactType) -> bool:
        return fact_type in _TEST_TYPES[self.kind]

    def holds(self, value: object) -> bool:
        """Whether a *valid* value of the fact passes the test."""
        if self.equals is not None:
            return value is self.equals
        if self.compare:
            return all(COMPARISONS[op][0](value, n) for op, n in self.compare)  # type: ignore[arg-type]
        return value in self.names  # type: ignore[operator]

    def text(self, fact: str) -> str:
        """The test as a reviewer reads it: ``num_qo_tokens > 11673``."""
        if self.equals is not None:
            return f"{fact} is {str(self.equals).lower()}"
        if self.compare:
            return " and ".join(f"{fact} {COMPARISONS[op][1]} {n}" for op, n in self.compare)
        names = sorted(self.names or ())
        return (
            f"{fact} is {names[0]}" if len(names) == 1 else f"{fact} is any of {', '.join(names)}"
        )


@attrs.frozen
class SpecAlgorithm:
    """A speculative algorithm and the capabilities that gates test.

    ``capabilities`` holds the plain ones; ``capabilities_after`` those the algorithm has only
    for a batch whose per-batch action (an ``action`` fact, e.g. ``prefill_staged``) succeeded.
    """

    name: str
    family: str | None = None
    capabilities: Mapping[str, bool] = attrs.field(factory=dict, converter=_frozen_map)
    doc: str = ""
    origin: Origin = UNKNOWN_ORIGIN
    #: the last phase of a step that reads shared state (draft_extend or target_verify);
    #: None: the last phase the step runs (the conservative default)
    last_reader: ForwardMode | None = attrs.field(default=None)
    #: capability -> the action fact that must have succeeded for the batch
    capabilities_after: Mapping[str, str] = attrs.field(factory=dict, converter=_frozen_map)

    @capabilities_after.validator
    def _check_after(self, _attribute: object, value: Mapping[str, str]) -> None:
        both = sorted(set(value) & set(self.capabilities))
        if both:
            _raise(
                self.origin,
                f"spec_algorithms.{self.name}.capabilities",
                f"{both[0]!r} is both plain and after an action; keep one",
            )

    @last_reader.validator
    def _check_last_reader(self, _attribute: object, value: ForwardMode | None) -> None:
        if value not in (None, ForwardMode.DRAFT_EXTEND, ForwardMode.TARGET_VERIFY):
            _raise(
                self.origin,
                f"spec_algorithms.{self.name}.last_reader",
                f"expected draft_extend or target_verify, got {value!r}",
            )

    def has(self, capability: str) -> bool:
        """The plain capability (one that holds only after an action counts as absent here)."""
        return bool(self.capabilities.get(capability, False))

    def known_capabilities(self) -> set[str]:
        return set(self.capabilities) | set(self.capabilities_after)


@attrs.frozen
class Conditions:
    """A gate's ``when:``; every field that is set must hold; a set means any of its members.

    ``None`` means the condition is not tested.
    """

    mode: frozenset[ForwardMode] | None = None
    backend: frozenset[str] | None = None
    spec: frozenset[str] | None = None
    spec_family: frozenset[str] | None = None
    spec_has: frozenset[str] | None = None  # spec has any of these capabilities
    spec_lacks: frozenset[str] | None = None  # spec lacks any of these capabilities
    flags: Mapping[str, bool] = attrs.field(factory=dict, converter=_frozen_map)  # all must hold
    declared: frozenset[WarReadDonePolicy] | None = None
    #: case-folded (`platform_key`): ``CUDA`` matches the runtime's ``cuda``
    platform: frozenset[str] | None = attrs.field(default=None, converter=_platform_set)
    eager: bool | None = None
    planted: bool | None = None
    external_events: bool | None = None
    #: per-batch fact name -> test; all must hold (an unreported fact holds: fail closed)
    facts: Mapping[str, FactTest] = attrs.field(factory=dict, converter=_frozen_map)


@attrs.frozen
class Gate:
    """A declared condition that can only make a decision later (``at_least``)."""

    id: str
    when: Conditions
    at_least: WarReadDonePolicy
    because: str
    origin: Origin = UNKNOWN_ORIGIN
    scope: str | None = None  # the backend whose ``gates:`` declared it, None for global
    doc: str = ""


@attrs.frozen
class After:
    """A declaration that holds only for a batch whose per-batch ``action`` (an ``action``
    fact) succeeded; for any other batch the read end is ``otherwise`` (default ``none``)."""

    action: str
    otherwise: WarReadDonePolicy = WarReadDonePolicy.NONE


def _route_children(value: Mapping[str, str]) -> Mapping[str, str]:
    return MappingProxyType(dict(value))


@attrs.frozen
class Route:
    """A per-batch router: in its routed ``modes`` (None: every mode) the batch's ``fact`` (a
    ``name`` fact) names the label of the child that runs; ``default`` is the label every other
    mode runs. ``pinned``: the child chosen for a batch runs every layer of that forward (the
    choice is made once, at metadata init, and reused); only then may the fact narrow the
    decision to one child."""

    fact: str
    children: Mapping[str, str] = attrs.field(converter=_route_children)  # label -> backend
    modes: frozenset[ForwardMode] | None = None
    default: str | None = None
    pinned: bool = False

    def routed(self, mode: ForwardMode) -> bool:
        return self.modes is None or mode in self.modes


@attrs.frozen
class Backend:
    """An attention backend's declared read ends.

    Exactly one shape: plain (``reads_end``, optionally ``inherits``), composite
    (``latest_of``: the latest of its children), per-mode (``per_mode``: delegates each
    listed mode to a child) or router (``routes``: the child is chosen per batch). ``reads_end``
    here is the backend's *own* map; inheritance is resolved by the engine so explanations can
    show the chain. ``reads_end_after`` marks declarations that hold only after a per-batch
    action (`After`).
    """

    name: str
    reads_end: Mapping[ForwardMode, WarReadDonePolicy] = attrs.field(
        factory=dict, converter=_frozen_map
    )
    inherits: str | None = None
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
    #: declarations of ``reads_end`` that hold only after a per-batch action
    reads_end_after: Mapping[ForwardMode, After] = attrs.field(factory=dict, converter=_frozen_map)
    routes: Route | None = None
    #: per mode declared as ``{CLASS: policy}``: where each buffer class's reads end (the
    #: mode's ``reads_end`` is then the latest of them); a one-policy declaration is
    #: ``{metadata: policy}`` (`declared_classes`)
    reads_end_classes: Mapping[ForwardMode, Mapping[str, WarReadDonePolicy]] = attrs.field(
        factory=dict, converter=_class_maps
    )
    #: buffer classes this backend's kernels read (inherited): a declaration that does not say
    #: where one of them ends is none for that class (unknown), and validate refuses it
    reads_classes: frozenset[str] = attrs.field(default=frozenset(), converter=_name_set)

    def declared_classes(self, mode: ForwardMode) -> Mapping[str, WarReadDonePolicy]:
        """This backend's own declaration of ``mode`` per buffer class (empty: undeclared)."""
        classes = self.reads_end_classes.get(mode)
        if classes is not None:
            return classes
        policy = self.reads_end.get(mode)
        return {} if policy is None else {METADATA: policy}

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
                routes=self.routes,
                reads_end_after=self.reads_end_after,
                reads_end_classes=self.reads_end_classes,
            )
        ]
        if problems:
            raise RegistryError(problems)

    @property
    def is_wrapper(self) -> bool:
        """A composite (``latest_of``), per-mode wrapper or router: its read end comes from
        children."""
        return bool(self.latest_of or self.per_mode or self.routes)

    def children(self) -> Iterator[str]:
        """Every backend this one names: inherits, latest_of, per_mode, routes."""
        if self.inherits is not None:
            yield self.inherits
        yield from self.latest_of
        yield from self.per_mode.values()
        if self.routes is not None:
            yield from self.routes.children.values()


def shape_problems(
    *,
    reads_end: Mapping[ForwardMode, object],
    inherits: str | None,
    latest_of: tuple[str, ...],
    per_mode: Mapping[ForwardMode, str],
    routes: Route | None = None,
    reads_end_after: Mapping[ForwardMode, After] | None = None,
    reads_end_classes: Mapping[ForwardMode, Mapping[str, object]] | None = None,
) -> list[tuple[str, ForwardMode | None, str]]:
    """Why a backend with these fields has no single shape, as ``(key, mode, message)``
    (key ``""`` is the entry).

    Plain (``reads_end``, optionally ``inherits``), composite (``latest_of``, optionally with
    its own or inherited ``reads_end``: the engine takes the latest of all), per-mode
    (``per_mode``, optionally ``reads_end`` for other modes) or router (``routes``, optionally
    ``reads_end``: the latest of it and the routed child). A per-mode wrapper or a router
    neither inherits nor is a composite, and a mode is either delegated or declared: anything
    else would let the delegated child hide a declaration. A declaration that holds only after
    an action falls back to something later than itself.
    """
    out: list[tuple[str, ForwardMode | None, str]] = []
    if routes is not None:
        for key, given in (
            ("latest_of", latest_of),
            ("per_mode", per_mode),
            ("inherits", inherits),
        ):
            if given:
                out.append(
                    (
                        "",
                        None,
                        f"a router (routes) cannot have {key}: its children are the ones it "
                        "routes to",
                    )
                )
        if not routes.children:
            out.append(("routes", None, "a router routes to at least one child"))
        if routes.default is not None and routes.modes is None:
            out.append(("routes", None, "default needs modes: without modes every mode is routed"))
    for mode, after in sorted((reads_end_after or {}).items(), key=lambda i: _mode_order(i[0])):
        policy = reads_end.get(mode)
        if policy is None:
            out.append(("reads_end", mode, f"mode {mode.label!r}: after without a policy"))
        elif isinstance(policy, WarReadDonePolicy) and after.otherwise <= policy:
            out.append(
                (
                    "reads_end",
                    mode,
                    f"mode {mode.label!r}: otherwise ({after.otherwise.label}) must be later "
                    f"than policy ({policy.label}), or the action would not matter",
                )
            )
    for mode, classes in sorted((reads_end_classes or {}).items(), key=lambda i: _mode_order(i[0])):
        cell = reads_end.get(mode)
        latest = max(classes.values(), default=None)  # type: ignore[type-var]
        if not classes:
            out.append(("reads_end", mode, f"mode {mode.label!r}: a class map names a class"))
        elif cell != latest:
            out.append(
                (
                    "reads_end",
                    mode,
                    f"mode {mode.label!r}: the mode's read end must be the latest of its "
                    f"classes ({getattr(latest, 'label', latest)})",
                )
            )
        if mode in (reads_end_after or {}):
            out.append(
                ("reads_end", mode, f"mode {mode.label!r}: a class map cannot hold after an action")
            )
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
    facts: Mapping[str, Fact] = attrs.field(factory=dict, converter=_frozen_map)
    #: buffer classes declarations may name: the built-in ones plus the registry's own
    buffer_classes: Mapping[str, BufferClass] = attrs.field(
        factory=dict, converter=_with_built_in_classes
    )
    #: lineages walked so far (the registry is immutable, so each is walked once)
    _lineages: dict[str, tuple[Backend, ...]] = attrs.field(
        factory=dict, init=False, eq=False, repr=False
    )
    #: case-folded name -> the registry's spelling, per kind ("backend", "spec"), built once
    _folded: dict[str, dict[str, str]] = attrs.field(factory=dict, init=False, eq=False, repr=False)

    def __attrs_post_init__(self) -> None:
        problems = registry_problems(self)
        if problems:
            raise RegistryError(problems)

    def backend_name(self, name: str) -> str:
        """The registry's spelling of backend ``name``, matched ignoring case (``FA3`` is
        ``fa3``, as ``--platform CUDA`` is ``cuda``); `UnknownNameError` when none matches.
        Validation refuses two backends equal under folding, so the match is unique."""
        if name in self.backends:
            return name
        return self._fold("backend", self.backends, name)

    def spec_name(self, name: str) -> str:
        """The registry's spelling of spec algorithm ``name``, matched ignoring case."""
        if name in self.spec_algorithms:
            return name
        return self._fold("spec algorithm", self.spec_algorithms, name)

    def _fold(self, kind: str, names: Mapping[str, object], name: str) -> str:
        folded = self._folded.get(kind)
        if folded is None:
            folded = self._folded[kind] = {n.casefold(): n for n in names}
        found = folded.get(str(name).strip().casefold())
        if found is None:
            raise UnknownNameError(kind, name, names)
        return found

    def backend(self, name: str) -> Backend:
        return self.backends[self.backend_name(name)]

    def spec(self, name: str) -> SpecAlgorithm:
        return self.spec_algorithms[self.spec_name(name)]

    def flag(self, name: str) -> Flag:
        try:
            return self.flags[name]
        except KeyError:
            raise UnknownNameError("flag", name, self.flags) from None

    def fact(self, name: str) -> Fact:
        try:
            return self.facts[name]
        except KeyError:
            raise UnknownNameError("fact", name, self.facts) from None

    def lineage(self, name: str) -> tuple[Backend, ...]:
        """``name`` and every backend it inherits from, nearest first, walked once per backend.

        Raises `UnknownNameError` for an unknown name and `InputError` at a cycle (construction
        refuses cycles, so one means the registry was tampered with; the engine fails closed).
        """
        cached = self._lineages.get(name)
        if cached is not None:
            return cached
        chain: list[Backend] = []
        seen: set[str] = set()
        current: str | None = name
        while current is not None:
            if current in seen:
                raise InputError(f"inheritance cycle through backend {current!r}")
            seen.add(current)
            backend = self.backend(current)
            chain.append(backend)
            current = backend.inherits
        lineage = self._lineages[name] = tuple(chain)
        return lineage

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
        route = backend.routes
        if route is not None and route.default is not None and route.default not in route.children:
            add(
                backend.origin,
                f"backends.{backend.name}.routes.default: {route.default!r} is not one of its "
                f"children's labels ({', '.join(sorted(route.children))})",
            )
    found += _folding_clashes("backends", "backend", backends)
    found += _folding_clashes("spec_algorithms", "spec algorithm", registry.spec_algorithms)
    known_classes = registry.buffer_classes
    for backend in backends.values():
        named = set(backend.reads_classes)
        for classes in backend.reads_end_classes.values():
            named |= set(classes)
        for name in sorted(named - set(known_classes)):
            add(
                backend.origin,
                f"backends.{backend.name}: {UnknownNameError('buffer class', name, known_classes)}",
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
    found += fact_problems(registry)
    return found


def _folding_clashes(
    section: str, kind: str, entries: Mapping[str, Backend | SpecAlgorithm]
) -> list[Problem]:
    """Names are matched ignoring case (`Registry.backend_name`): two that fold to the same
    name would make a lookup ambiguous. Each later one is a problem at its own place."""
    first: dict[str, Backend | SpecAlgorithm] = {}
    found = []
    for name, entry in entries.items():
        other = first.setdefault(name.casefold(), entry)
        if other is not entry:
            origin = entry.origin
            found.append(
                Problem(
                    origin.file,
                    origin.line,
                    origin.col,
                    f"{section}.{name}: the same {kind} as {other.name!r} ({other.origin}) "
                    f"when case is ignored; {kind} names are matched ignoring case: rename one",
                )
            )
    return found


def fact_problems(registry: Registry) -> list[Problem]:
    """Every reference to a per-batch fact that names no declared fact, or one of the wrong
    type: gate tests, ``after`` actions of declarations and capabilities, router facts."""
    found: list[Problem] = []
    facts = registry.facts

    def check(origin: Origin, where: str, name: str, types: Iterable[FactType], what: str) -> None:
        fact = facts.get(name)
        if fact is None:
            message = str(UnknownNameError("fact", name, facts))
        elif fact.type not in tuple(types):
            message = f"fact {name!r} is {fact.type.label}; {what}"
        else:
            return
        found.append(Problem(origin.file, origin.line, origin.col, f"{where}: {message}"))

    scoped = [g for b in registry.backends.values() for g in b.gates]
    for gate in list(registry.gates) + scoped:
        for name, test in gate.when.facts.items():
            where = f"gate {gate.id!r}: when.facts.{name}"
            check(gate.origin, where, name, _TEST_TYPES[test.kind], f"a {test.kind} test")
            fact = facts.get(name)
            if fact is not None and fact.type is FactType.ACTION and test.equals is True:
                found.append(
                    Problem(
                        gate.origin.file,
                        gate.origin.line,
                        gate.origin.col,
                        f"{where}: fact {name!r} is an action: test it only for false, so "
                        "success can only make a decision earlier",
                    )
                )
            if fact is not None and fact.values is not None and test.names is not None:
                stray = sorted(test.names - fact.values)
                if stray:
                    found.append(
                        Problem(
                            gate.origin.file,
                            gate.origin.line,
                            gate.origin.col,
                            f"{where}: {stray[0]!r} is not a value of fact {name!r} "
                            f"({', '.join(sorted(fact.values))})",
                        )
                    )
    for backend in registry.backends.values():
        for mode, after in backend.reads_end_after.items():
            where = f"backends.{backend.name}.reads_end.{mode.label}.after"
            check(backend.origin, where, after.action, (FactType.ACTION,), "after names an action")
        if backend.routes is not None:
            route = backend.routes
            where = f"backends.{backend.name}.routes.fact"
            check(backend.origin, where, route.fact, (FactType.NAME,), "a router needs a name fact")
            fact = facts.get(route.fact)
            if fact is not None and fact.values is not None:
                stray = sorted(set(route.children) - fact.values)
                if stray:
                    add_at = backend.origin
                    found.append(
                        Problem(
                            add_at.file,
                            add_at.line,
                            add_at.col,
                            f"backends.{backend.name}.routes.children: label {stray[0]!r} is "
                            f"not a value of fact {route.fact!r}",
                        )
                    )
    for spec in registry.spec_algorithms.values():
        for capability, action in spec.capabilities_after.items():
            where = f"spec_algorithms.{spec.name}.capabilities.{capability}.after"
            check(spec.origin, where, action, (FactType.ACTION,), "after names an action")
    return found


def registry_warnings(registry: Registry) -> list[Problem]:
    """What is valid but hazardous, one located problem each (``validate`` prints them as
    warnings): a per-batch router that does not declare ``pinned: true``, whose choice may
    therefore change inside one forward."""
    found = []
    for backend in registry.backends.values():
        route = backend.routes
        if route is None or route.pinned:
            continue
        origin = backend.origin
        found.append(
            Problem(
                origin.file,
                origin.line,
                origin.col,
                f"backends.{backend.name}.routes: the child is chosen per batch, but the router "
                "does not declare pinned: true, so its choice may change inside one forward (a "
                "layer that re-evaluates the route runs another child on metadata built for the "
                "first, the hazard SGLang's ImagePrefillAttnBackend TODO names); its batches "
                f"decide the latest of every child it may route to, whatever {route.fact} says. "
                "Declare pinned: true once the forward reuses the choice made at metadata init.",
            )
        )
    return found


def find_cycle(backends: Mapping[str, Backend]) -> list[str] | None:
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


def class_problems(registry: Registry) -> list[Problem]:
    """Declarations that do not say where every class a backend runs reads ends, one located
    problem each (the loader refuses them; call it on a registry `registry_problems` accepts):

    * a backend (or one it inherits) lists a class in ``reads_classes`` that its declaration of a mode
      does not name: its kernels read that class and nothing says where those reads end
      (a hybrid model's linear-attention layers that keep the base declaration);
    * a wrapper (``latest_of``, ``per_mode``, ``routes``) with its own declaration of a mode
      that is earlier, for some class, than a child that runs in that mode, or that does not
      name a class such a child reads (a composite declaring only its primary child's read
      end). A per-mode wrapper declares only modes it does not delegate, where no child
      runs, so it cannot under-declare (the shape rules keep the two apart).

    The engine is sound without this check (it takes the latest of everything and an
    undeclared class that is read is none); the check keeps declarations honest for review.
    """
    found: list[Problem] = []
    trees: dict[tuple[str, ForwardMode], Mapping[str, WarReadDonePolicy]] = {}

    def add(origin: Origin, message: str) -> None:
        found.append(Problem(origin.file, origin.line, origin.col, message))

    for backend in registry.backends.values():
        lineage = registry.lineage(backend.name)
        reads = frozenset().union(*(entry.reads_classes for entry in lineage))
        for mode in ForwardMode:
            own = own_classes(lineage, mode)
            if own is None:
                continue
            origin = backend.reads_end_origins.get(mode, backend.origin)  # inherited: the entry
            where = f"backends.{backend.name}.reads_end.{mode.label}"
            missing = sorted(reads - set(own))
            if missing:
                add(
                    origin,
                    f"{where}: {backend.name} reads {', '.join(missing)} (reads_classes), but its "
                    f"declaration ({_classes_text(own)}) does not say where those reads end; "
                    "declare {CLASS: policy} for every class it reads",
                )
            for child in running_children(backend, mode):
                tree = declared_tree(registry, child, mode, trees)
                for name, policy in sorted(tree.items()):
                    mine = own.get(name)
                    if mine is None or mine < policy:
                        said = "does not name it" if mine is None else f"says {mine.label}"
                        add(
                            origin,
                            f"{where}: {backend.name} runs {child} for {mode.label}, whose "
                            f"{name} reads end at {policy.label}, but its own declaration "
                            f"{said}; a wrapper declares at least the latest of every child "
                            "that runs (or leave the mode undeclared: the engine takes it)",
                        )
    return found


def own_classes(
    lineage: Iterable[Backend], mode: ForwardMode
) -> dict[str, WarReadDonePolicy] | None:
    """The latest of the lineage's own declarations of ``mode`` per class, or None (undeclared)."""
    out: dict[str, WarReadDonePolicy] | None = None
    for entry in lineage:
        for name, policy in entry.declared_classes(mode).items():
            out = {} if out is None else out
            out[name] = max(policy, out.get(name, policy))
    return out


def running_children(backend: Backend, mode: ForwardMode) -> tuple[str, ...]:
    """The children of a wrapper that may run in ``mode``, as the engine evaluates it: every
    child of a composite, a per-mode wrapper's delegate (none in a mode it does not delegate:
    its own declaration holds there), every child a router may route to (its default child in
    a mode it does not route)."""
    if backend.latest_of:
        return backend.latest_of
    if backend.per_mode:
        delegate = backend.per_mode.get(mode)
        return (delegate,) if delegate is not None else ()
    route = backend.routes
    if route is not None:
        if route.routed(mode):
            return tuple(route.children.values())
        return (route.children[route.default],) if route.default is not None else ()
    return ()


def declared_tree(
    registry: Registry,
    name: str,
    mode: ForwardMode,
    memo: dict[tuple[str, ForwardMode], Mapping[str, WarReadDonePolicy]] | None = None,
) -> Mapping[str, WarReadDonePolicy]:
    """Per class, the latest declared read end of ``name`` in ``mode``: its lineage's own
    declarations, the classes it reads without declaring (none) and every child that may run.
    Declarations only (no gates): what a reviewer compares a wrapper's declaration against."""
    memo = {} if memo is None else memo
    key = (name, mode)
    cached = memo.get(key)
    if cached is not None:
        return cached
    lineage = registry.lineage(name)
    out = dict(own_classes(lineage, mode) or {})
    reads = frozenset().union(*(entry.reads_classes for entry in lineage))
    for missing in reads - set(out):
        out[missing] = WarReadDonePolicy.NONE
    for entry in lineage:
        for child in running_children(entry, mode):
            for cls, policy in declared_tree(registry, child, mode, memo).items():
                out[cls] = max(policy, out.get(cls, policy))
    memo[key] = out
    return out


def _classes_text(classes: Mapping[str, WarReadDonePolicy]) -> str:
    return ", ".join(f"{n}: {p.label}" for n, p in sorted(classes.items()))


def names_a_class(registry: Registry, name: str, mode: ForwardMode) -> bool:
    """Whether ``name``'s declaration of ``mode`` says anything per buffer class: a class map
    or ``reads_classes`` along its lineage or in a child that runs in ``mode``."""
    seen: set[str] = set()
    stack = [name]
    while stack:
        current = stack.pop()
        if current in seen:
            continue
        seen.add(current)
        for entry in registry.lineage(current):
            if entry.reads_classes or mode in entry.reads_end_classes:
                return True
            stack.extend(running_children(entry, mode))
    return False
