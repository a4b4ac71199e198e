"""The capability registry as frozen attrs objects.

Loading (YAML with marks, layering, validation) lives in `warpolicy.loader`; this module is
only the data model and the lookups the engine needs. Every entry remembers where it was
declared (`Origin`) so decisions and errors can point at the file, line and column.
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Mapping, Optional

import attrs

from warpolicy.errors import UnknownNameError
from warpolicy.policy import ForwardMode, WarReadDonePolicy


def _frozen_map(value: Mapping | None) -> Mapping:
    return MappingProxyType(dict(value or {}))


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
    env: tuple[str, ...] = attrs.field(default=(), converter=tuple)
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
    reads_end: Mapping[ForwardMode, WarReadDonePolicy] = attrs.field(factory=dict,
                                                                     converter=_frozen_map)
    inherits: Optional[str] = None
    latest_of: tuple[str, ...] = attrs.field(default=(), converter=tuple)
    per_mode: Mapping[ForwardMode, str] = attrs.field(factory=dict, converter=_frozen_map)
    gates: tuple[Gate, ...] = attrs.field(default=(), converter=tuple)
    abstract: bool = False  # a base to inherit from; left out of tables
    doc: str = ""
    origin: Origin = UNKNOWN_ORIGIN
    #: where each key of ``reads_end`` was declared (for explanations)
    reads_end_origins: Mapping[ForwardMode, Origin] = attrs.field(factory=dict,
                                                                  converter=_frozen_map)


@attrs.frozen
class Registry:
    """A validated, merged registry. Built by `warpolicy.loader`; immutable afterwards."""

    flags: Mapping[str, Flag] = attrs.field(factory=dict, converter=_frozen_map)
    spec_algorithms: Mapping[str, SpecAlgorithm] = attrs.field(factory=dict,
                                                               converter=_frozen_map)
    backends: Mapping[str, Backend] = attrs.field(factory=dict, converter=_frozen_map)
    gates: tuple[Gate, ...] = attrs.field(default=(), converter=tuple)
    sources: tuple[str, ...] = attrs.field(default=(), converter=tuple)

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

    def concrete_backends(self) -> list[str]:
        """Backend names a table shows: every non-abstract backend, sorted."""
        return sorted(n for n, b in self.backends.items() if not b.abstract)
