"""Stage 3 of loading: one source's converted sections -> entries (flags, per-batch facts, spec
algorithms, backends, gates), each with its origin, its key path and the names it refers to.

An entry with any invalid field is left out, but its name is remembered (``broken``) so a
reference to it is not reported a second time, and the references it makes are still checked
(``orphan_refs``) so every problem shows at once.
"""

from __future__ import annotations

from collections.abc import Callable

import attrs
from yaml.nodes import Node, SequenceNode

from warpolicy.errors import Problem
from warpolicy.registry.loader.fields import (
    Capability,
    Converter,
    EnvName,
    Fields,
    Located,
    Raw,
    ReadEnd,
    Reporter,
    is_null,
    join,
)
from warpolicy.registry.model import (
    After,
    Backend,
    BufferClass,
    Conditions,
    Fact,
    FactTest,
    Flag,
    Gate,
    Origin,
    Route,
    SpecAlgorithm,
    shape_problems,
)
from warpolicy.registry.schema import CLASS_MAP_RESERVED
from warpolicy.registry.vocabulary import (
    FORCE_COARSE_ENV,
    FORCE_COARSE_NAME,
    FactType,
    ForwardMode,
    Placement,
    WarReadDonePolicy,
)


@attrs.frozen
class Ref:
    """A name one entry refers to, checked once every source is merged."""

    kind: str  # backend | spec algorithm | spec family | capability | flag | fact | route label
    name: str
    origin: Origin
    path: str
    #: a fact reference: what the fact must be (``action``, ``name``, or a test's kind:
    #: ``bool``, ``int``, ``name``), and the names a test or router uses (checked against
    #: the fact's ``values``); ``true_test``: a test for true (refused for actions)
    want: str = ""
    values: tuple[str, ...] = ()
    true_test: bool = False


Value = BufferClass | Flag | Fact | SpecAlgorithm | Backend | Gate


@attrs.frozen
class Entry:
    """A flag, spec algorithm, backend or gate from one source, before merging."""

    kind: str  # flag | fact | spec algorithm | backend | gate
    name: str
    value: Value
    origin: Origin
    path: str
    override: bool
    source: int  # index of the source in layering order
    refs: tuple[Ref, ...] = ()
    #: a backend's scoped gates (they merge like any gate); a flag's env var origins
    gates: tuple[Entry, ...] = ()
    env_origins: tuple[Origin, ...] = ()


@attrs.frozen
class Parsed:
    """Everything one source contributes."""

    name: str
    entries: tuple[Entry, ...]  # flags, facts, spec algorithms, backends, then global gates
    broken: frozenset[tuple[str, str]]  # (kind, name) of entries left out for problems
    orphan_refs: tuple[Ref, ...]


_SECTIONS = (
    ("buffer_classes", "buffer_class", "buffer class"),
    ("flags", "flag", "flag"),
    ("facts", "fact", "fact"),
    ("spec_algorithms", "spec_algorithm", "spec algorithm"),
    ("backends", "backend", "backend"),
)
#: ``when`` keys holding names, and the kind of name each refers to ("" = not checked).
_WHEN_REFS = {
    "backend": "backend",
    "spec": "spec algorithm",
    "spec_family": "spec family",
    "spec_has": "capability",
    "spec_lacks": "capability",
    "platform": "",
}


class EntryBuilder:
    """Builds one source's entries from its root node."""

    def __init__(self, name: str, problems: list[Problem], index: int) -> None:
        self.report = Reporter(name, problems)
        self.convert = Converter(self.report)
        self.index = index
        self.broken: set[tuple[str, str]] = set()
        self.orphan_refs: list[Ref] = []

    def parse(self, root: Node) -> Parsed | None:
        top = self.convert.section(root, "", "registry")
        if top is None:
            return None
        builders: dict[str, Callable[[str, Fields, Origin, str], Entry | None]] = {
            "buffer_class": self.buffer_class,
            "flag": self.flag,
            "fact": self.fact,
            "spec_algorithm": self.spec,
            "backend": self.backend,
        }
        entries: list[Entry] = []
        for key, section, kind in _SECTIONS:
            raw = top.get(key, Raw)
            if raw is not None:
                entries += self.named_entries(raw.node, key, section, kind, builders[section])
        gates = top.get("gates", Raw)
        if gates is not None:
            entries += self.gate_list(gates.node, "gates", scope=None)
        return Parsed(
            self.report.name, tuple(entries), frozenset(self.broken), tuple(self.orphan_refs)
        )

    def named_entries(
        self,
        node: Node,
        path: str,
        section: str,
        kind: str,
        build: Callable[[str, Fields, Origin, str], Entry | None],
    ) -> list[Entry]:
        pairs = self.convert.pairs(node, path, f"a mapping of name -> {kind}", null_ok=True)
        out: list[Entry] = []
        for key, value in pairs or ():
            name = self.convert.key_name(key, path, kind)
            sub = join(path, key.value)
            fields = self.convert.section(value, sub, section)
            entry = None
            if name is not None and fields is not None:
                entry = build(name, fields, self.report.origin(key), sub)
            if entry is not None:
                out.append(entry)
            elif name is not None:
                self.broken.add((kind, name))
        return out

    def buffer_class(self, name: str, f: Fields, origin: Origin, path: str) -> Entry | None:
        if not f.ok:
            return None
        if name in CLASS_MAP_RESERVED:
            self.report.at(
                origin,
                path,
                f"{name!r} cannot name a buffer class ({{policy, after, otherwise}} mappings "
                "are declarations)",
            )
            return None
        value = BufferClass(name, f.get("doc", str) or "", origin)
        return Entry(
            "buffer class", name, value, origin, path, bool(f.get("override", bool)), self.index
        )

    def flag(self, name: str, f: Fields, origin: Origin, path: str) -> Entry | None:
        if not f.ok:
            return None
        env: list[Located[EnvName]] = f.get("env", list) or []
        if name == FORCE_COARSE_NAME:
            inverted = [e for e in env if e.value.inverted and e.value.name in FORCE_COARSE_ENV]
            for e in inverted:
                self.report.at(
                    e.origin,
                    f"{path}.env",
                    f"{e.value.name} is a built-in name of the kill switch: it cannot be "
                    f"inverted ({{not: {e.value.name}}}); {e.value.name}=1 always forces the "
                    "coarse barrier",
                )
            if inverted:
                return None
        flag = Flag(
            name=name,
            default=bool(f.get("default", bool)),
            doc=f.get("doc", str) or "",
            env=tuple(e.value.name for e in env),
            origin=origin,
            inverted=frozenset(e.value.name for e in env if e.value.inverted),
        )
        return Entry(
            "flag",
            name,
            flag,
            origin,
            path,
            bool(f.get("override", bool)),
            self.index,
            env_origins=tuple(e.origin for e in env),
        )

    def fact(self, name: str, f: Fields, origin: Origin, path: str) -> Entry | None:
        if not f.ok:
            return None
        kind = f.get("type", FactType)
        values: list[Located[str]] | None = f.get("values", list)
        if kind is None:
            return None
        if values is not None and kind is not FactType.NAME:
            self.report.at(values[0].origin, f"{path}.values", "only a name fact lists values")
            return None
        fact = Fact(
            name=name,
            type=kind,
            doc=f.get("doc", str) or "",
            values=None if values is None else frozenset(v.value for v in values),
            origin=origin,
        )
        return Entry("fact", name, fact, origin, path, bool(f.get("override", bool)), self.index)

    def spec(self, name: str, f: Fields, origin: Origin, path: str) -> Entry | None:
        caps: dict[str, Located[Capability]] = f.get("capabilities", dict) or {}
        refs = [
            Ref("fact", c.value.after.value, c.value.after.origin, f"{path}.capabilities.{n}.after",
                want="action")
            for n, c in caps.items()
            if c.value.after is not None
        ]  # fmt: skip
        if not f.ok:
            self.orphan_refs.extend(refs)
            return None
        family = f.get("family", Located)
        spec = SpecAlgorithm(
            name=name,
            family=family.value if family else None,
            capabilities={c: bool(v.value.value) for c, v in caps.items() if v.value.after is None},
            doc=f.get("doc", str) or "",
            origin=origin,
            last_reader=f.get("last_reader", ForwardMode),
            capabilities_after={
                c: v.value.after.value for c, v in caps.items() if v.value.after is not None
            },
        )
        return Entry(
            "spec algorithm",
            name,
            spec,
            origin,
            path,
            bool(f.get("override", bool)),
            self.index,
            tuple(refs),
        )

    def backend(self, name: str, f: Fields, origin: Origin, path: str) -> Entry | None:
        gates_raw = f.get("gates", Raw)
        gates = self.gate_list(gates_raw.node, f"{path}.gates", name) if gates_raw else []
        routes_raw = f.get("routes", Raw)
        routes = self.routes(routes_raw.node, f"{path}.routes") if routes_raw else None
        refs = self.backend_refs(f, path) + (routes[1] if routes else [])
        if not f.ok or (routes_raw is not None and routes is None):
            self.orphan_refs.extend(refs)
            self.orphan_refs.extend(r for g in gates for r in g.refs)
            return None
        reads_end: dict[ForwardMode, Located[ReadEnd]] = f.get("reads_end", dict) or {}
        per_mode: dict[ForwardMode, Located[Located[str]]] = f.get("per_mode", dict) or {}
        inherits = f.get("inherits", Located)
        plant: dict[ForwardMode, Placement] = f.get("plant", dict) or {}
        latest_of = tuple(c.value for c in f.get("latest_of", list) or [])
        delegates = {m: c.value.value for m, c in per_mode.items()}
        parent = inherits.value if inherits else None
        route = routes[0] if routes else None
        policies = {m: p.value.policy for m, p in reads_end.items()}
        classes = {
            m: {c: v.value for c, v in p.value.classes.items()}
            for m, p in reads_end.items()
            if p.value.classes is not None
        }
        reads = frozenset(r.value for r in f.get("reads_classes", list) or [])
        after = {
            m: After(p.value.after.value, p.value.otherwise)
            for m, p in reads_end.items()
            if p.value.after is not None
        }
        shape = shape_problems(
            reads_end=policies,
            inherits=parent,
            latest_of=latest_of,
            per_mode=delegates,
            routes=route,
            reads_end_after=after,
            reads_end_classes=classes,
        )
        for key, mode, message in shape:
            at = per_mode[mode].origin if mode is not None and mode in per_mode else origin
            self.report.at(at, join(path, key) if key else path, message)
        if shape:
            self.orphan_refs.extend(refs)
            return None
        backend = Backend(
            name=name,
            reads_end=policies,
            inherits=parent,
            latest_of=latest_of,
            per_mode=delegates,
            abstract=bool(f.get("abstract", bool)),
            doc=f.get("doc", str) or "",
            origin=origin,
            plant=plant,
            reads_end_origins={m: p.origin for m, p in reads_end.items()},
            reads_end_after=after,
            routes=route,
            reads_end_classes=classes,
            reads_classes=reads,
        )
        return Entry(
            "backend",
            name,
            backend,
            origin,
            path,
            bool(f.get("override", bool)),
            self.index,
            tuple(refs),
            tuple(gates),
        )

    @staticmethod
    def backend_refs(f: Fields, path: str) -> list[Ref]:
        """The backends this one names, wherever the field itself was valid."""
        refs = []
        inherits = f.get("inherits", Located)
        if inherits is not None:
            refs.append(Ref("backend", inherits.value, inherits.origin, f"{path}.inherits"))
        for i, child in enumerate(f.get("latest_of", list) or []):
            refs.append(Ref("backend", child.value, child.origin, f"{path}.latest_of[{i}]"))
        per_mode: dict[ForwardMode, Located[Located[str]]] = f.get("per_mode", dict) or {}
        for mode, keyed in per_mode.items():
            child = keyed.value
            refs.append(Ref("backend", child.value, child.origin, f"{path}.per_mode.{mode.label}"))
        reads_end: dict[ForwardMode, Located[ReadEnd]] = f.get("reads_end", dict) or {}
        for mode, declared in reads_end.items():
            action = declared.value.after
            if action is not None:
                where = f"{path}.reads_end.{mode.label}.after"
                refs.append(Ref("fact", action.value, action.origin, where, want="action"))
            for name, located in (declared.value.classes or {}).items():
                where = f"{path}.reads_end.{mode.label}"
                refs.append(Ref("buffer class", name, located.origin, where))
        for read in f.get("reads_classes", list) or []:
            where = f"{path}.reads_classes"
            refs.append(Ref("buffer class", read.value, read.origin, where))
        return refs

    def routes(self, node: Node, path: str) -> tuple[Route, list[Ref]] | None:
        """A router's ``routes:`` and the names it refers to (its fact and its children)."""
        f = self.convert.section(node, path, "routes")
        if f is None:
            return None
        fact = f.get("fact", Located)
        children: dict[str, Located[Located[str]]] = f.get("children", dict) or {}
        default = f.get("default", Located)
        refs = [
            Ref("backend", c.value.value, c.value.origin, f"{path}.children.{label}")
            for label, c in children.items()
        ]
        if fact is not None:
            refs.append(
                Ref("fact", fact.value, fact.origin, f"{path}.fact", "name", tuple(children))
            )
        if default is not None:
            where = f"{path}.default"
            refs.append(
                Ref("route label", default.value, default.origin, where, "", tuple(children))
            )
        if not f.ok or fact is None or not children:
            self.orphan_refs.extend(refs)
            return None
        route = Route(
            fact=fact.value,
            children={label: c.value.value for label, c in children.items()},
            modes=f.get("modes", frozenset),
            default=None if default is None else default.value,
            pinned=bool(f.get("pinned", bool)),
        )
        return route, refs

    def gate_list(self, node: Node, path: str, scope: str | None) -> list[Entry]:
        if is_null(node):
            return []
        if not isinstance(node, SequenceNode):
            self.report.expected(node, path, "a list of gates")
            return []
        out = []
        for i, item in enumerate(node.value):
            entry = self.gate(item, f"{path}[{i}]", scope)
            if entry is not None:
                out.append(entry)
        return out

    def gate(self, node: Node, path: str, scope: str | None) -> Entry | None:
        f = self.convert.section(node, path, "gate")
        if f is None:
            return None
        when_raw = f.get("when", Raw)
        when = self.when(when_raw.node, f"{path}.when") if when_raw else (Conditions(), [])
        gate_id, at_least = f.get("id", Located), f.get("at_least", WarReadDonePolicy)
        if (
            not f.ok
            or when is None
            or gate_id is None
            or at_least is None
            or f.get("because", str) is None
        ):
            if when is not None:
                self.orphan_refs.extend(when[1])
            return None
        conditions, refs = when
        origin = self.report.origin(node)
        gate = Gate(
            id=gate_id.value,
            when=conditions,
            at_least=at_least,
            because=f.get("because", str) or "",
            origin=origin,
            scope=scope,
            doc=f.get("doc", str) or "",
        )
        return Entry(
            "gate",
            gate_id.value,
            gate,
            origin,
            path,
            bool(f.get("override", bool)),
            self.index,
            tuple(refs),
        )

    def when(self, node: Node, path: str) -> tuple[Conditions, list[Ref]] | None:
        """A gate's conditions and the names they refer to (checked once all is merged).
        Null is not "no conditions": a gate that applies always leaves ``when`` out."""
        f = self.convert.section(node, path, "when")
        if f is None:
            return None
        refs: list[Ref] = []
        flags: dict[str, Located[bool]] = f.get("flags", dict) or {}
        refs += [Ref("flag", n, v.origin, f"{path}.flags") for n, v in flags.items()]
        tests: dict[str, Located[FactTest]] = f.get("facts", dict) or {}
        refs += [
            Ref(
                "fact",
                n,
                t.origin,
                f"{path}.facts.{n}",
                t.value.kind,
                tuple(sorted(t.value.names or ())),
                t.value.equals is True,
            )
            for n, t in tests.items()
        ]
        sets: dict[str, frozenset[str] | None] = {}
        for key, kind in _WHEN_REFS.items():
            names: list[Located[str]] | None = f.get(key, list)
            sets[key] = None if names is None else frozenset(n.value for n in names)
            if kind and names is not None:
                refs += [Ref(kind, n.value, n.origin, f"{path}.{key}") for n in names]
        if not f.ok:
            self.orphan_refs.extend(refs)
            return None
        conditions = Conditions(
            mode=f.get("mode", frozenset),
            backend=sets["backend"],
            spec=sets["spec"],
            spec_family=sets["spec_family"],
            spec_has=sets["spec_has"],
            spec_lacks=sets["spec_lacks"],
            flags={n: v.value for n, v in flags.items()},
            declared=f.get("declared", frozenset),
            platform=sets["platform"],
            eager=f.get("eager", bool),
            planted=f.get("planted", bool),
            external_events=f.get("external_events", bool),
            facts={n: t.value for n, t in tests.items()},
        )
        return conditions, refs
