"""Stage 4 of loading: layer the sources' entries, check what only the merged whole can show
(references, per-batch facts of the right type, cycles, inheritance from wrappers, one flag per
environment variable), and build the frozen `Registry`.

Layering: a later source may add entries; redefining a name needs ``override: true``, and
``override: true`` on a name no earlier source defines is an error (it would silently add
instead of replace). Every check is linear in the merged entries. Close-match hints for unknown
names are searched once per distinct name, and all searches of one load together compare at
most `MAX_SUGGESTION_WORK` candidates (a search costs one comparison per known name); past that
budget an unknown name is reported without a hint.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping

import attrs

from warpolicy.errors import Problem, RegistryError, UnknownNameError
from warpolicy.registry.loader.entries import Entry, Parsed, Ref
from warpolicy.registry.model import (
    BUILT_IN_CLASSES,
    Backend,
    BufferClass,
    Fact,
    Flag,
    Gate,
    Origin,
    Registry,
    SpecAlgorithm,
    class_problems,
)
from warpolicy.registry.vocabulary import FactType

#: Candidate comparisons all "did you mean" searches of one load may spend together (about
#: 0.4 s of difflib at worst); a registry of 30 names affords over a thousand searches.
MAX_SUGGESTION_WORK = 50_000

_ADDED, _REPLACED, _REJECTED = "added", "replaced", "rejected"
#: Entry kinds whose names are matched ignoring case (two that fold alike are refused).
FOLDED_KINDS = ("backend", "spec algorithm")


class _Suggestions:
    """Close matches per (kind, name), cached, with a bounded number of searches."""

    def __init__(self, known: Mapping[str, Iterable[str]]) -> None:
        self.known = known
        self.sorted: dict[str, list[str]] = {}
        self.cache: dict[tuple[str, str], list[str]] = {}
        self.work_left = MAX_SUGGESTION_WORK

    def error(self, kind: str, name: str) -> UnknownNameError:
        candidates = self.sorted.get(kind)
        if candidates is None:
            candidates = self.sorted[kind] = sorted(set(self.known[kind]))
        found = self.cache.get((kind, name))
        if found is None:
            found = []
            if len(candidates) <= self.work_left:
                self.work_left -= len(candidates)
                found = difflib.get_close_matches(name, candidates, n=3, cutoff=0.6)
                self.cache[(kind, name)] = found
        shown = candidates if len(candidates) <= 12 else ()
        return UnknownNameError(kind, name, shown, suggestions=found)


class Merger:
    """Layers parsed sources: adds, overrides, and reports redefinitions with both places."""

    def __init__(self, problems: list[Problem]) -> None:
        self.problems = problems
        self.tables: dict[str, dict[str, Entry]] = {
            "buffer class": {},
            "flag": {},
            "fact": {},
            "spec algorithm": {},
            "backend": {},
            "gate": {},
        }
        self.broken: set[tuple[str, str]] = set()  # (kind, name) of entries with problems
        self.orphan_refs: list[Ref] = []
        #: per kind whose names are looked up ignoring case: folded name -> the first spelling
        self.folded: dict[str, dict[str, str]] = {kind: {} for kind in FOLDED_KINDS}

    def at(self, origin: Origin, path: str, message: str) -> None:
        self.problems.append(Problem(origin.file, origin.line, origin.col, f"{path}: {message}"))

    def add(self, parsed: Parsed) -> None:
        self.broken |= parsed.broken
        self.orphan_refs.extend(parsed.orphan_refs)
        for entry in parsed.entries:
            outcome = self.put(entry)
            if entry.kind != "backend" or outcome == _REJECTED:
                continue
            if outcome == _REPLACED:  # an overriding backend replaces its scoped gates too
                gates = self.tables["gate"]
                for gate_id in [
                    g
                    for g, e in gates.items()
                    if isinstance(e.value, Gate) and e.value.scope == entry.name
                ]:
                    del gates[gate_id]
            for gate in entry.gates:
                self.put(gate)

    def put(self, entry: Entry) -> str:
        """Add ``entry``, replace an earlier one (``override: true``) or report why not."""
        table = self.tables[entry.kind]
        old = table.get(entry.name)
        what = "gate id" if entry.kind == "gate" else entry.kind
        if old is None and self._clashes(entry, what):
            return _REJECTED
        if old is None:
            if entry.override and (entry.kind, entry.name) not in self.broken:
                self.at(
                    entry.origin,
                    entry.path,
                    f"override: true, but no earlier source "
                    f"defines {what} {entry.name!r}; remove override to add it",
                )
                self.broken.add((entry.kind, entry.name))  # no second "unknown" for it
                return _REJECTED
            table[entry.name] = entry
            return _ADDED
        if entry.override and old.source != entry.source:
            table[entry.name] = entry  # keeps the first definition's position
            return _REPLACED
        if old.source == entry.source:
            hint = "; names must be unique within a file"
        else:
            hint = "; add override: true to replace it"
        self.at(
            entry.origin, entry.path, f"{what} {entry.name!r} already defined at {old.origin}{hint}"
        )
        return _REJECTED

    def _clashes(self, entry: Entry, what: str) -> bool:
        """A new backend or spec algorithm whose name equals an earlier one's when case is
        ignored (lookups ignore case: `Registry.backend_name`): reported at the new one."""
        folded = self.folded.get(entry.kind)
        if folded is None:
            return False
        first = folded.setdefault(entry.name.casefold(), entry.name)
        if first == entry.name:
            return False
        self.at(
            entry.origin,
            entry.path,
            f"{what} {entry.name!r} is {what} {first!r} (defined at "
            f"{self.tables[entry.kind][first].origin}) when case is ignored, as every lookup "
            f"ignores it; spell it {first!r} (override: true replaces it) or rename it",
        )
        self.broken.add((entry.kind, entry.name))  # no second "unknown" for its references
        return True

    # -- checks on the merged entries --

    def check(self) -> None:
        backends, specs = self.tables["backend"], self.tables["spec algorithm"]
        spec_values = [e.value for e in specs.values() if isinstance(e.value, SpecAlgorithm)]
        known: dict[str, Iterable[str]] = {
            "backend": backends,
            "spec algorithm": specs,
            "flag": self.tables["flag"],
            "fact": self.tables["fact"],
            "buffer class": set(self.tables["buffer class"]) | set(BUILT_IN_CLASSES),
            "spec family": {s.family for s in spec_values if s.family},
            "capability": {c for s in spec_values for c in s.known_capabilities()},
        }
        broken: dict[str, set[str]] = {}
        for kind, name in self.broken:
            broken.setdefault(kind, set()).add(name)
        suggest = _Suggestions({k: set(v) | broken.get(k, set()) for k, v in known.items()})
        refs = [
            r
            for kind in ("backend", "gate", "spec algorithm")
            for e in self.tables[kind].values()
            for r in e.refs
        ]
        for ref in refs + self.orphan_refs:
            if ref.kind == "route label":  # a router's default names one of its own labels
                if ref.name not in ref.values:
                    known_labels = ", ".join(ref.values)
                    self.at(ref.origin, ref.path, f"{ref.name!r} is not a label ({known_labels})")
                continue
            if ref.name not in known[ref.kind] and ref.name not in broken.get(ref.kind, ()):
                self.at(ref.origin, ref.path, str(suggest.error(ref.kind, ref.name)))
            elif ref.kind == "fact":
                self.check_fact_ref(ref)
        self.check_inheritance()
        self.check_env_names()
        self.check_cycles()

    def check_fact_ref(self, ref: Ref) -> None:
        """A per-batch fact is used as its type allows: ``after`` names an action, a router a
        name fact, a test fits the fact (an action only for false), names are its values."""
        entry = self.tables["fact"].get(ref.name)
        fact = entry.value if entry is not None else None
        if not isinstance(fact, Fact):
            return  # broken: reported where it is declared
        kind = fact.type
        fits = {
            "action": (FactType.ACTION,),
            "name": (FactType.NAME,),
            "bool": (FactType.BOOL, FactType.ACTION),
            "int": (FactType.INT,),
        }[ref.want]
        if kind not in fits:
            uses = {
                "action": "after names an action fact",
                "name": "a router names its child by a name fact",
                "bool": "true/false tests a bool or action fact",
                "int": "a number or comparison tests an int fact",
            }[ref.want]
            if ref.want == "name" and not ref.path.endswith(".fact"):
                uses = "names test a name fact"
            self.at(ref.origin, ref.path, f"fact {ref.name!r} is {kind.label}; {uses}")
        elif kind is FactType.ACTION and ref.true_test:
            self.at(
                ref.origin,
                ref.path,
                f"fact {ref.name!r} is an action: test it only for false (the action did not "
                "succeed), so success can only make a decision earlier",
            )
        elif fact.values is not None:
            stray = [v for v in ref.values if v not in fact.values]
            if stray:
                self.at(
                    ref.origin,
                    ref.path,
                    str(UnknownNameError(f"value of fact {ref.name!r}", stray[0], fact.values)),
                )

    def check_inheritance(self) -> None:
        """``inherits`` names a plain backend: the engine inherits read ends, and a wrapper's
        come from its children."""
        backends = self.tables["backend"]
        for entry in backends.values():
            for ref in entry.refs:
                parent = backends.get(ref.name)
                if (
                    ref.path.endswith(".inherits")
                    and parent is not None
                    and isinstance(parent.value, Backend)
                    and parent.value.is_wrapper
                ):
                    self.at(
                        ref.origin,
                        ref.path,
                        f"{ref.name!r} is a composite or per-mode "
                        "wrapper; inherit from a plain backend",
                    )

    def check_env_names(self) -> None:
        """One environment variable sets one flag."""
        owners: dict[str, tuple[str, Origin]] = {}
        for entry in self.tables["flag"].values():
            if not isinstance(entry.value, Flag):
                continue
            for var, origin in zip(entry.value.env, entry.env_origins, strict=True):
                first = owners.setdefault(var, (entry.name, origin))
                if first[0] == entry.name and first[1] != origin:
                    self.at(origin, f"{entry.path}.env", f"{var} is listed twice (at {first[1]})")
                elif first[0] != entry.name:
                    self.at(
                        origin,
                        f"{entry.path}.env",
                        f"{var} already sets flag {first[0]!r} at {first[1]}",
                    )

    def check_cycles(self) -> None:
        """Report each cycle through inherits / latest_of / per_mode once, where the
        depth-first walk closes it (iterative: a long chain does not recurse)."""
        backends = self.tables["backend"]
        edges = {
            name: [r for r in entry.refs if r.name in backends] for name, entry in backends.items()
        }
        state: dict[str, int] = {}  # 1 = on the current path, 2 = done
        for start in edges:
            if start in state:
                continue
            path = [start]
            stack = [iter(edges[start])]
            state[start] = 1
            while stack:
                ref = next(stack[-1], None)
                if ref is None:
                    state[path.pop()] = 2
                    stack.pop()
                elif state.get(ref.name) == 1:
                    cycle = path[path.index(ref.name) :] + [ref.name]
                    self.at(ref.origin, ref.path, "cycle: " + " -> ".join(cycle))
                elif ref.name not in state:
                    state[ref.name] = 1
                    path.append(ref.name)
                    stack.append(iter(edges[ref.name]))

    # -- result --

    def build(self, sources: Iterable[str]) -> Registry | None:
        """The registry, or None when the merged entries still break an invariant (only after
        problems were reported; the models check themselves again on construction)."""
        scoped: dict[str, list[Gate]] = {}
        global_gates: list[Gate] = []
        for entry in self.tables["gate"].values():
            gate = entry.value
            if isinstance(gate, Gate):
                (global_gates if gate.scope is None else scoped.setdefault(gate.scope, [])).append(
                    gate
                )
        try:
            backends = {
                name: attrs.evolve(e.value, gates=tuple(scoped.get(name, ())))
                for name, e in self.tables["backend"].items()
                if isinstance(e.value, Backend)
            }
            registry = Registry(
                buffer_classes={
                    n: e.value
                    for n, e in self.tables["buffer class"].items()
                    if isinstance(e.value, BufferClass)
                },
                flags={n: e.value for n, e in self.tables["flag"].items()},
                facts={n: e.value for n, e in self.tables["fact"].items()},
                spec_algorithms={n: e.value for n, e in self.tables["spec algorithm"].items()},
                backends=backends,
                gates=global_gates,
                sources=list(sources),
            )
        except RegistryError:
            if not self.problems:  # the loader's checks must have found it first
                raise
            return None
        declared = class_problems(registry)  # a valid registry only: it walks the lineages
        if declared:
            self.problems.extend(declared)
            return None
        return registry
