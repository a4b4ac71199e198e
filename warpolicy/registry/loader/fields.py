"""Stage 2 of loading: YAML nodes -> typed, located values, problems recorded on the way.

A `Converter` turns one node into one value of a schema *kind* (`warpolicy.registry.schema`). Every
converter returns the value, or None after recording why it is invalid: no registry value is
None, so None means "invalid, already reported" and callers never report twice. Names keep
where they were written (`Located`), so a later reference check can point at them.

"""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable, Iterable, Mapping
from typing import Generic, TypeVar

import attrs
import yaml
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from warpolicy.errors import InputError, Problem, UnknownNameError
from warpolicy.registry import schema as S
from warpolicy.registry.loader.reading import BOOL, FLOAT, INT, NULL, STR, TAG
from warpolicy.registry.model import FactTest, Origin
from warpolicy.registry.vocabulary import (
    _MODE_ALIASES,
    _POLICY_ALIASES,
    NOTHING,
    RELEASE_ALIASES,
    FactType,
    ForwardMode,
    Placement,
    WarReadDonePolicy,
)

T = TypeVar("T")
V = TypeVar("V")

NAME_RE = re.compile(S.NAME_PATTERN)
ENV_RE = re.compile(S.ENV_PATTERN)
TEXT_RE = re.compile(S.TEXT_PATTERN)
_NAME_RULE = "letters, digits, _ . + -; no spaces, '=' or line breaks"


@attrs.frozen
class Located(Generic[T]):
    """A value and where it was written."""

    value: T
    origin: Origin


@attrs.frozen
class Raw:
    """A key whose value is a nested section, converted by the entry builders."""

    key: ScalarNode
    node: Node


@attrs.frozen
class EnvName:
    """An environment variable a flag reads; ``inverted``: written ``{not: NAME}``."""

    name: str
    inverted: bool = False


@attrs.frozen
class ReadEnd:
    """One ``reads_end`` value: a policy, optionally only ``after`` an action."""

    policy: WarReadDonePolicy
    after: Located[str] | None = None
    otherwise: WarReadDonePolicy = WarReadDonePolicy.NONE
    #: ``{CLASS: policy}``: each buffer class's read end (``policy`` is then their latest)
    classes: dict[str, Located[WarReadDonePolicy]] | None = None


@attrs.frozen
class Capability:
    """One ``capabilities`` value: true/false, or only ``after`` an action (``value`` None)."""

    value: bool | None
    after: Located[str] | None = None


def join(path: str, key: str) -> str:
    """``path.key`` in the file's own key names; odd keys quoted so a message stays one line."""
    if not NAME_RE.match(key):
        return f"{path}[{key!r}]"
    return f"{path}.{key}" if path else key


def describe(node: Node) -> str:
    """What a node is, for 'expected X, got Y' messages."""
    if isinstance(node, MappingNode):
        return "a mapping"
    if isinstance(node, SequenceNode):
        return "a list"
    value = node.value if len(node.value) <= 40 else node.value[:37] + "..."
    kinds = {
        STR: f"the string {value!r}",
        BOOL: f"the boolean {value}",
        NULL: "null",
        INT: f"the integer {value}",
        FLOAT: f"the number {value}",
    }
    return kinds.get(node.tag, f"{value!r} (a {node.tag.replace(TAG, '')})")


class Reporter:
    """Records located problems for one source, in the file's own key paths."""

    def __init__(self, name: str, problems: list[Problem]) -> None:
        self.name = name
        self.problems = problems

    def origin(self, node: Node) -> Origin:
        mark = node.start_mark
        if mark is None:  # a plugin's mapping: no text, no marks
            return Origin(self.name)
        return Origin(self.name, mark.line + 1, mark.column + 1)

    def at(self, origin: Origin, path: str, message: str) -> None:
        prefix = f"{path}: " if path else ""
        self.problems.append(Problem(origin.file, origin.line, origin.col, prefix + message))

    def on(self, node: Node, path: str, message: str) -> None:
        self.at(self.origin(node), path, message)

    def expected(self, node: Node, path: str, what: str) -> None:
        self.on(node, path, f"expected {what}, got {describe(node)}")


class Fields:
    """The converted values of one fixed-key section; ``ok`` when none was invalid."""

    def __init__(self, node: Node) -> None:
        self.node = node
        self.values: dict[str, object] = {}
        self.ok = True

    def __contains__(self, key: str) -> bool:
        return key in self.values

    def get(self, key: str, kind: type[T]) -> T | None:
        """The value of ``key`` if given and valid."""
        value = self.values.get(key)
        return value if isinstance(value, kind) else None


class Pairs(list[tuple[ScalarNode, Node]]):
    """A mapping's valid (key, value) pairs; ``ok`` is False when some key was left out."""

    ok = True


def _is_declaration(node: MappingNode) -> bool:
    """A mapping with a ``policy``, ``after`` or ``otherwise`` key is a ``{policy, after,
    otherwise}`` declaration (no buffer class takes those names); any other, a class map."""
    return any(
        isinstance(key, ScalarNode) and key.value in S.CLASS_MAP_RESERVED for key, _ in node.value
    )


def is_null(node: Node) -> bool:
    return isinstance(node, ScalarNode) and node.tag == NULL


class Converter:
    """Converts nodes of one source into values of the schema's kinds."""

    def __init__(self, report: Reporter) -> None:
        self.report = report
        self.by_kind: dict[str, Callable[[Node, str], object]] = {
            S.VERSION: self.version,
            S.BOOL: self.boolean,
            S.TEXT: self.text,
            S.NAME: self.name,
            S.POLICY: self.policy,
            S.READ_END: self.read_end_value,
            S.NAME_LIST: self.name_list,
            S.NAME_SET: self.name_set,
            S.ENV_LIST: self.env_list,
            S.POLICY_SET: self.policy_set,
            S.MODE_SET: self.mode_set,
            S.MODE_POLICY_MAP: self.mode_policy_map,
            S.MODE_NAME_MAP: self.mode_name_map,
            S.BOOL_MAP: self.bool_map,
            S.PLANT: self.plant,
            S.LAST_READER: self.last_reader,
            S.FACT_TYPE: self.fact_type,
            S.MODE_DECLARATION_MAP: self.mode_declaration_map,
            S.CAPABILITY_MAP: self.capability_map,
            S.LABEL_MAP: self.label_map,
            S.FACT_TESTS: self.fact_tests,
        }
        self.keys = {section: S.keys_by_name(section) for section in S.SECTIONS}
        #: converted values by (node, kind): a node shared through YAML aliases is converted
        #: (and its problems reported) once, so aliases cannot multiply the work
        self.memo: dict[tuple[int, str], object] = {}

    # -- structure --

    def pairs(self, node: Node, path: str, what: str, null_ok: bool = False) -> Pairs | None:
        """The (key, value) pairs of a mapping with string keys; duplicate, merge and
        non-string keys reported and left out (``ok`` False). None when not a mapping; null is
        an empty mapping only where ``null_ok``."""
        if null_ok and is_null(node):
            return Pairs()
        if not isinstance(node, MappingNode):
            self.report.expected(node, path, what)
            return None
        seen: dict[str, Node] = {}
        out = Pairs()
        for key, value in node.value:
            if isinstance(key, ScalarNode) and key.tag == TAG + "merge":
                self.report.on(
                    key,
                    path,
                    "YAML merge keys (<<) are not supported; use inherits: or repeat the keys",
                )
            elif not (isinstance(key, ScalarNode) and key.tag == STR):
                self.report.on(key, path, f"keys must be names, got {describe(key)}")
            elif key.value in seen:
                self.report.on(
                    key,
                    path,
                    f"duplicate key {key.value!r} (first at line "
                    f"{self.report.origin(seen[key.value]).line}); YAML "
                    "would silently keep only the last one",
                )
            else:
                seen[key.value] = key
                out.append((key, value))
                continue
            out.ok = False
        return out

    def section(self, node: Node, path: str, section: str) -> Fields | None:
        """A fixed-key section converted by key kind; unknown and missing keys reported.
        None when the node is not a mapping (or has bad keys)."""
        pairs = self.pairs(node, path, f"a {section.replace('_', ' ')} mapping")
        if pairs is None:
            return None
        known = self.keys[section]
        fields = Fields(node)
        fields.ok = pairs.ok
        for key, value in pairs:
            spec = known.get(key.value)
            if spec is None:
                self.unknown_key(key, path, known)
                fields.ok = False
                continue
            result = self.convert(spec.kind, key, value, join(path, key.value))
            if result is None:
                fields.ok = False
            fields.values[key.value] = result
        for spec in known.values():
            if spec.required and spec.name not in fields:
                hint = f" (the integer {S.FORMAT_VERSION})" if spec.kind == S.VERSION else ""
                self.report.on(node, path, f"missing required key {spec.name!r}{hint}")
                fields.ok = False
        return fields

    def convert(self, kind: str, key: ScalarNode, node: Node, path: str) -> object:
        """``node`` as a value of ``kind`` (None when invalid); nested sections stay `Raw`."""
        convert = self.by_kind.get(kind)
        if convert is None:
            return Raw(key, node)
        memo_key = (id(node), kind)
        if memo_key in self.memo:
            return self.memo[memo_key]
        result = self.memo[memo_key] = convert(node, path)
        return result

    def unknown_key(self, key: ScalarNode, path: str, known: Iterable[str]) -> None:
        close = difflib.get_close_matches(str(key.value), list(known), n=3, cutoff=0.6)
        hint = (
            "; did you mean " + ", ".join(repr(c) for c in close) + "?"
            if close
            else "; known keys: " + ", ".join(known)
        )
        where = "top-level key" if not path else "key"
        self.report.on(key, path, f"unknown {where} {key.value!r}{hint}")

    # -- scalars --

    def version(self, node: Node, path: str) -> int | None:
        value: object = None
        if isinstance(node, ScalarNode) and node.tag in (INT, FLOAT):
            constructor = yaml.constructor.SafeConstructor()
            try:  # YAML ints include 0x1, 0o1, 1_0; JSON Schema's integer includes 1.0
                value = (
                    constructor.construct_yaml_int(node)
                    if node.tag == INT
                    else constructor.construct_yaml_float(node)
                )
            except ValueError:
                value = None
        if value is None:
            self.report.expected(node, path, f"the integer {S.FORMAT_VERSION}")
            return None
        if value != S.FORMAT_VERSION:
            self.report.on(
                node,
                path,
                f"unsupported registry version {node.value}; this "
                f"warpolicy reads version {S.FORMAT_VERSION}",
            )
            return None
        return S.FORMAT_VERSION

    def boolean(self, node: Node, path: str) -> bool | None:
        if isinstance(node, ScalarNode) and node.tag == BOOL:
            return node.value.lower() in ("true", "yes", "on")
        self.report.expected(node, path, "true or false")
        return None

    def text(self, node: Node, path: str) -> str | None:
        if isinstance(node, ScalarNode) and node.tag == STR and TEXT_RE.search(node.value):
            return " ".join(node.value.split())  # folded docs read as one line
        self.report.expected(node, path, "a non-empty string")
        return None

    def name(self, node: Node, path: str) -> Located[str] | None:
        """A registry name, with where it was written (for reference checks)."""
        if not (isinstance(node, ScalarNode) and node.tag == STR):
            self.report.expected(node, path, "a name")
            return None
        if not NAME_RE.match(node.value):
            self.report.on(node, path, f"{node.value!r} is not a valid name ({_NAME_RULE})")
            return None
        return Located(node.value, self.report.origin(node))

    def key_name(self, key: ScalarNode, path: str, kind: str) -> str | None:
        if NAME_RE.match(key.value):
            return str(key.value)
        self.report.on(key, path, f"{key.value!r} is not a valid {kind} name ({_NAME_RULE})")
        return None

    def _spelling(
        self, node: Node, path: str, table: Mapping[str, V], kind: str, what: str
    ) -> V | None:
        """One of ``table``'s exact spellings (case and spaces as the schema lists them)."""
        if not (isinstance(node, ScalarNode) and node.tag == STR):
            self.report.expected(node, path, what)
            return None
        if node.value in table:
            return table[node.value]
        self.report.on(node, path, str(UnknownNameError(kind, node.value, table)))
        return None

    def policy(self, node: Node, path: str) -> WarReadDonePolicy | None:
        """A release point (a gate's ``at_least``): ``nothing`` is a read end, not one."""
        if isinstance(node, ScalarNode) and node.tag == STR and node.value == NOTHING.label:
            self.report.on(
                node,
                path,
                "'nothing' is a read end (a reads_end value), not a release point: a gate only "
                "makes a decision later (pre_replay, in_graph, post_replay, none)",
            )
            return None
        return self._spelling(
            node,
            path,
            RELEASE_ALIASES,
            "policy",
            "a policy (pre_replay, in_graph, post_replay, none)",
        )

    def read_end_value(self, node: Node, path: str) -> WarReadDonePolicy | None:
        """A read end: a policy, or ``nothing`` (the mode reads no scheduler-shared state)."""
        return self._spelling(
            node,
            path,
            _POLICY_ALIASES,
            "policy",
            "a read end (nothing, pre_replay, in_graph, post_replay, none)",
        )

    def mode(self, node: Node, path: str) -> ForwardMode | None:
        return self._spelling(node, path, _MODE_ALIASES, "mode", "a forward mode")

    def placement(self, node: Node, path: str) -> Placement | None:
        return self._spelling(
            node,
            path,
            {p.value: p for p in Placement},
            "placement",
            "a placement (marker, derived)",
        )

    def last_reader(self, node: Node, path: str) -> ForwardMode | None:
        readers = {m.value: m for m in (ForwardMode.DRAFT_EXTEND, ForwardMode.TARGET_VERIFY)}
        return self._spelling(node, path, readers, "last reader", "draft_extend or target_verify")

    def fact_type(self, node: Node, path: str) -> FactType | None:
        return self._spelling(
            node,
            path,
            {t.value: t for t in FactType},
            "fact type",
            "a fact type (int, bool, action, name)",
        )

    def env_name(self, node: Node, path: str) -> Located[EnvName] | None:
        """``NAME`` or ``{not: NAME}`` (an inverted alias: NAME=1 sets the flag false)."""
        inverted = False
        if isinstance(node, MappingNode):
            pairs = self.pairs(node, path, "{not: NAME}")
            if pairs is None or not pairs.ok:
                return None
            if [k.value for k, _v in pairs] != ["not"]:
                self.report.on(node, path, "expected {not: NAME}, a single key 'not'")
                return None
            node, inverted, path = pairs[0][1], True, join(path, "not")
        if not (isinstance(node, ScalarNode) and node.tag == STR):
            self.report.expected(node, path, "an environment variable name or {not: NAME}")
            return None
        if not ENV_RE.match(node.value):
            self.report.on(node, path, f"{node.value!r} is not an environment variable name")
            return None
        return Located(EnvName(node.value, inverted), self.report.origin(node))

    # -- collections --

    def _many(
        self,
        node: Node,
        path: str,
        convert: Callable[[Node, str], T | None],
        scalar_ok: bool,
        what: str,
    ) -> list[T] | None:
        """A list of values (or a lone non-null scalar where a set allows one); an empty list
        is reported, and so is every invalid item."""
        if scalar_ok and isinstance(node, ScalarNode) and not is_null(node):
            one = convert(node, path)
            return None if one is None else [one]
        if not isinstance(node, SequenceNode):
            self.report.expected(node, path, what)
            return None
        if not node.value:
            self.report.on(node, path, "an empty list; leave the key out instead")
            return None
        values = [convert(item, f"{path}[{i}]") for i, item in enumerate(node.value)]
        if any(v is None for v in values):
            return None
        return [v for v in values if v is not None]

    def _unique(
        self, values: list[Located[T]] | None, path: str, key: Callable[[T], str] = str
    ) -> list[Located[T]] | None:
        if values is None:
            return None
        seen: set[str] = set()
        for item in values:
            name = key(item.value)
            if name in seen:
                self.report.at(item.origin, path, f"{name!r} is listed twice")
                return None
            seen.add(name)
        return values

    def name_list(self, node: Node, path: str) -> list[Located[str]] | None:
        return self._unique(self._many(node, path, self.name, False, "a list of names"), path)

    def name_set(self, node: Node, path: str) -> list[Located[str]] | None:
        return self._many(node, path, self.name, True, "a name or a list of names")

    def env_list(self, node: Node, path: str) -> list[Located[EnvName]] | None:
        return self._unique(
            self._many(node, path, self.env_name, True, "a list of environment variable names"),
            path,
            key=lambda env: f"{{not: {env.name}}}" if env.inverted else env.name,
        )

    def policy_set(self, node: Node, path: str) -> frozenset[WarReadDonePolicy] | None:
        values = self._many(
            node, path, self.read_end_value, True, "a read end or a list of read ends"
        )
        return None if values is None else frozenset(values)

    def mode_set(self, node: Node, path: str) -> frozenset[ForwardMode] | None:
        values = self._many(node, path, self.mode, True, "a mode or a list of modes")
        return None if values is None else frozenset(values)

    def _mode_map(
        self, node: Node, path: str, convert: Callable[[Node, str], V | None]
    ) -> dict[ForwardMode, Located[V]] | None:
        """mode -> value, each with the origin of its mode key; aliases of one mode collide."""
        pairs = self.pairs(node, path, "a mapping of forward mode -> value")
        if pairs is None:
            return None
        out: dict[ForwardMode, Located[V]] = {}
        spelled: dict[ForwardMode, str] = {}
        ok = pairs.ok
        for key, value in pairs:
            mode = self.mode(key, path)
            converted = convert(value, join(path, key.value))
            if mode is None or converted is None:
                ok = False
            elif mode in out:
                self.report.on(
                    key,
                    path,
                    f"{key.value!r} is mode {mode.label!r}, already given as {spelled[mode]!r}",
                )
                ok = False
            else:
                out[mode] = Located(converted, self.report.origin(key))
                spelled[mode] = key.value
        return out if ok else None

    def _name_map(
        self,
        node: Node,
        path: str,
        expected: str,
        what: str,
        convert: Callable[[Node, str], V | None],
        *,
        non_empty: str | None = None,
    ) -> dict[str, Located[V]] | None:
        """name -> value, each with the origin of its key (``what`` names the keys in errors);
        ``non_empty``: the error for an empty mapping, when one is not allowed."""
        pairs = self.pairs(node, path, expected)
        if pairs is None:
            return None
        if non_empty is not None and not pairs and pairs.ok:
            self.report.on(node, path, non_empty)
            return None
        out: dict[str, Located[V]] = {}
        ok = pairs.ok
        for key, value in pairs:
            name = self.key_name(key, path, what)
            converted = convert(value, join(path, key.value))
            if name is None or converted is None:
                ok = False
            else:
                out[name] = Located(converted, self.report.origin(key))
        return out if ok else None

    def mode_policy_map(
        self, node: Node, path: str
    ) -> dict[ForwardMode, Located[WarReadDonePolicy]] | None:
        return self._mode_map(node, path, self.policy)

    def mode_name_map(
        self, node: Node, path: str
    ) -> dict[ForwardMode, Located[Located[str]]] | None:
        return self._mode_map(node, path, self.name)

    def plant(self, node: Node, path: str) -> dict[ForwardMode, Placement] | None:
        """``derived`` (every mode) or ``{mode: derived|marker}``."""
        if isinstance(node, ScalarNode):
            one = self.placement(node, path)
            return None if one is None else {mode: one for mode in ForwardMode}
        by_mode = self._mode_map(node, path, self.placement)
        return None if by_mode is None else {m: p.value for m, p in by_mode.items()}

    def bool_map(self, node: Node, path: str) -> dict[str, Located[bool]] | None:
        return self._name_map(
            node, path, "a mapping of name -> true/false", "capability or flag", self.boolean
        )

    # -- per-batch declarations --

    def mode_declaration_map(
        self, node: Node, path: str
    ) -> dict[ForwardMode, Located[ReadEnd]] | None:
        """mode -> a policy, or ``{policy, after, otherwise}``."""
        return self._mode_map(node, path, self.read_end)

    def read_end(self, node: Node, path: str) -> ReadEnd | None:
        if not isinstance(node, MappingNode):
            policy = self.read_end_value(node, path)
            return None if policy is None else ReadEnd(policy)
        if not _is_declaration(node):
            return self.class_map(node, path)
        fields = self.section(node, path, "declaration")
        if fields is None or not fields.ok:
            return None
        policy = fields.get("policy", WarReadDonePolicy)
        after = fields.get("after", Located)
        otherwise = fields.get("otherwise", WarReadDonePolicy)
        if policy is None or after is None:
            return None
        if otherwise is None:
            otherwise = WarReadDonePolicy.NONE
        if otherwise <= policy:
            self.report.on(
                node,
                path,
                f"otherwise ({otherwise.label}) must be later than policy ({policy.label}), or "
                "the action would not matter",
            )
            return None
        return ReadEnd(policy, after, otherwise)

    def class_map(self, node: Node, path: str) -> ReadEnd | None:
        """``{CLASS: policy}``: where each buffer class's reads end (names checked at merge)."""
        classes = self._name_map(
            node,
            path,
            "a mapping of buffer class -> read end",
            "buffer class",
            self.read_end_value,
            non_empty="an empty class map; a mode that reads no class declares nothing",
        )
        if not classes:
            return None
        latest = max(c.value for c in classes.values())
        return ReadEnd(latest, classes=classes)

    def capability_map(self, node: Node, path: str) -> dict[str, Located[Capability]] | None:
        """name -> true/false, or ``{after: ACTION}``."""
        return self._name_map(
            node,
            path,
            "a mapping of capability -> true/false or {after: ACTION}",
            "capability",
            self.capability,
        )

    def capability(self, node: Node, path: str) -> Capability | None:
        """true/false, or ``{after: ACTION}``."""
        if isinstance(node, MappingNode):
            fields = self.section(node, path, "capability_after")
            after = fields.get("after", Located) if fields is not None and fields.ok else None
            return None if after is None else Capability(None, after)
        flag = self.boolean(node, path)
        return None if flag is None else Capability(flag)

    def label_map(self, node: Node, path: str) -> dict[str, Located[Located[str]]] | None:
        """label -> backend name, each with where it was written."""
        return self._name_map(
            node,
            path,
            "a mapping of label -> backend",
            "label",
            self.name,
            non_empty="an empty mapping; a router routes to at least one child",
        )

    def fact_tests(self, node: Node, path: str) -> dict[str, Located[FactTest]] | None:
        """fact -> true/false, an integer, ``{gt|ge|lt|le|eq: N}``, a name or a list of names."""
        return self._name_map(node, path, "a mapping of fact -> test", "fact", self.fact_test)

    def fact_test(self, node: Node, path: str) -> FactTest | None:
        if isinstance(node, ScalarNode) and node.tag == BOOL:
            return FactTest(equals=node.value.lower() in ("true", "yes", "on"))
        if isinstance(node, ScalarNode) and node.tag in (INT, FLOAT):
            number = self.integer(node, path)
            return None if number is None else FactTest(compare=(("eq", number),))
        if isinstance(node, MappingNode):
            pairs = self.pairs(node, path, "comparisons such as {gt: 100}")
            if pairs is None or not pairs.ok:
                return None
            if not pairs:
                self.report.on(node, path, "no comparison; use gt, ge, lt, le or eq")
                return None
            compare = []
            for key, value in pairs:
                if key.value not in S.COMPARISON_KEYS:
                    self.unknown_key(key, path, S.COMPARISON_KEYS)
                    return None
                number = self.integer(value, join(path, key.value))
                if number is None:
                    return None
                compare.append((key.value, number))
            return FactTest(compare=tuple(compare))
        names = self._many(node, path, self.name, True, "a test: true/false, a number or names")
        if names is None:
            return None
        try:
            return FactTest(names=frozenset(n.value for n in names))
        except InputError as exc:  # pragma: no cover - _many refuses empty lists
            self.report.on(node, path, str(exc))
            return None

    def integer(self, node: Node, path: str) -> int | None:
        """An integer; an integral float (``2.0``) too, as JSON Schema's ``integer`` has it."""
        constructor = yaml.constructor.SafeConstructor()
        value: object = None
        try:
            if isinstance(node, ScalarNode) and node.tag == INT:
                value = constructor.construct_yaml_int(node)
            elif isinstance(node, ScalarNode) and node.tag == FLOAT:
                number = constructor.construct_yaml_float(node)
                value = int(number) if number == int(number) else None
        except (ValueError, OverflowError):
            value = None
        if isinstance(value, int):
            return value
        self.report.expected(node, path, "an integer")
        return None
