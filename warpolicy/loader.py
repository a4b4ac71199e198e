"""Load capability registries: YAML with marks -> validated, merged, frozen `Registry`.

Sources layer in order: files (``--capabilities``, ``WARPOLICY_CAPABILITIES`` or the packaged
default), then plugin fragments. A later source may add entries; redefining a name needs
``override: true``. Every problem is collected with its ``FILE:LINE:COL`` and raised together
as one `RegistryError`, so a user fixes a file in one pass.

The walk is driven by the key tables in `warpolicy.schema` (the JSON Schema comes from the same
tables) and works on the composed node tree (`yaml.compose`), which keeps marks and shows
duplicate keys that `yaml.safe_load` would silently merge. All work after composing is linear in
the input.
"""

from __future__ import annotations

import difflib
import enum
import os
import pathlib
import re
from typing import Any, Callable, Iterable, Mapping, Optional, Sequence, Union

import attrs
import yaml
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from warpolicy import schema as S
from warpolicy.errors import InputError, Problem, RegistryError, UnknownNameError
from warpolicy.policy import ForwardMode, WarReadDonePolicy
from warpolicy.registry import (Backend, Conditions, Flag, Gate, Origin, Registry,
                                SpecAlgorithm)

#: The token that names the packaged default registry among ``--capabilities`` files or in
#: ``WARPOLICY_CAPABILITIES`` (``:default:`` works too). A file literally named ``default``
#: must be given as ``./default``.
DEFAULT = "default"
DEFAULT_TOKENS = frozenset({DEFAULT, ":default:"})
ENV_VAR = "WARPOLICY_CAPABILITIES"

_NAME_RE = re.compile(S.NAME_PATTERN)
_ENV_RE = re.compile(S.ENV_PATTERN)
_TAG = "tag:yaml.org,2002:"
_STR, _BOOL, _INT, _NULL = _TAG + "str", _TAG + "bool", _TAG + "int", _TAG + "null"
_BAD = object()  # a value that failed to parse (its problem is already recorded)
_KIND = {"flag": "flag", "spec_algorithm": "spec algorithm", "backend": "backend"}

# yaml.compose recurses once per nesting level (RecursionError in Python, a segfault in libyaml's
# C composer on a deeply nested file) and the scanners spend time quadratic in flow depth, so
# composing stops at the first collection nested deeper than this. A registry nests about 6 deep.
_MAX_DEPTH = 100


class _TooDeep(Exception):
    def __init__(self, mark) -> None:
        super().__init__(mark)
        self.mark = mark


class _DepthLimit:
    """Counts collection depth on the events PyYAML's composer consumes; refuses past the limit
    before the composer recurses into it."""

    _depth = 0

    def get_event(self):
        event = super().get_event()
        if isinstance(event, yaml.CollectionStartEvent):
            self._depth += 1
            if self._depth > _MAX_DEPTH:
                raise _TooDeep(event.start_mark)
        elif isinstance(event, yaml.CollectionEndEvent):
            self._depth -= 1
        return event


class _PyComposer(_DepthLimit, yaml.SafeLoader):
    """PyYAML's pure-Python safe loader, depth-limited."""


_C_LOADER = None
if hasattr(yaml, "CSafeLoader"):
    class _CComposer(_DepthLimit, yaml.composer.Composer, yaml.CSafeLoader):
        """libyaml's parser (about 10x faster) feeding PyYAML's Python composer, which can be
        depth-limited and names the anchor in its errors (libyaml's C composer does neither)."""

        def __init__(self, stream) -> None:
            yaml.CSafeLoader.__init__(self, stream)
            yaml.composer.Composer.__init__(self)

    _C_LOADER = _CComposer


@attrs.frozen
class Fragment:
    """A registry source that is not a file: YAML text or an already-parsed mapping.

    ``name`` is what error locations show, e.g. ``"plugin:warpolicy-trace"``. A mapping has no
    marks, so its problems and origins carry line and column 0.
    """

    name: str
    data: Union[str, bytes, Mapping]


Source = Union[str, os.PathLike, Fragment]


# -- choosing sources -------------------------------------------------------------------------

def default_registry_path() -> pathlib.Path:
    """The packaged ``warpolicy/capabilities.yaml``; from a source tree, the repository's."""
    here = pathlib.Path(__file__).resolve().parent
    packaged = here / "capabilities.yaml"
    if packaged.is_file():
        return packaged
    return here.parent / "capabilities.yaml"


def registry_sources(files: Optional[Sequence[str]] = None,
                     environ: Mapping[str, str] = os.environ) -> list[Union[str, pathlib.Path]]:
    """The registry files to load, in layering order.

    Given ``files`` (``--capabilities``, repeatable) win; else ``WARPOLICY_CAPABILITIES`` split
    on `os.pathsep`; else the packaged default. The token ``default`` (or ``:default:``) in
    either list stands for the packaged default, so users can layer on top of it.
    """
    if files:
        chosen: list[str] = [str(f) for f in files]
    else:
        chosen = [p for p in environ.get(ENV_VAR, "").split(os.pathsep) if p.strip()]
    if not chosen:
        return [default_registry_path()]
    return [default_registry_path() if f.strip() in DEFAULT_TOKENS else f for f in chosen]


# -- public entry points ----------------------------------------------------------------------

def load_registry(sources: Sequence[Source]) -> Registry:
    """Load, layer and validate ``sources``; raise `RegistryError` listing every problem.

    Raises `InputError` when a file cannot be read at all (missing, a directory, no
    permission): that is a usage error, not a registry problem.
    """
    registry, problems = _load(sources)
    if problems:
        raise RegistryError(problems)
    return registry


def validate_sources(sources: Sequence[Source]) -> list[Problem]:
    """Like `load_registry`, but return the problems (empty when valid) instead of raising."""
    return _load(sources)[1]


def _load(sources: Sequence[Source]) -> tuple[Registry, list[Problem]]:
    if isinstance(sources, (str, bytes, os.PathLike, Fragment)):
        sources = [sources]  # a lone path is an easy mistake; be kind
    problems: list[Problem] = []
    merger = _Merger(problems)
    names: list[str] = []
    for source in sources:
        name, root = _compose_source(source, problems)
        names.append(name)
        if root is not None:
            parsed = _SourceParser(name, problems, len(names) - 1).parse(root)
            if parsed is not None:
                merger.add(parsed)
    merger.check_references()
    order = {n: i for i, n in enumerate(names)}
    problems.sort(key=lambda p: (order.get(p.file, len(order)), p.line, p.col))
    return merger.build(names), problems


# -- reading and composing --------------------------------------------------------------------

def _compose_source(source: Source, problems: list[Problem]) -> tuple[str, Optional[Node]]:
    """Read one source into a node tree; record why when it cannot be parsed."""
    if isinstance(source, Fragment):
        if isinstance(source.data, Mapping):
            try:
                return source.name, _to_node(source.data)
            except RecursionError:  # a self-referencing or absurdly deep mapping
                problems.append(Problem(source.name, 0, 0, "mapping nested too deeply (or "
                                                           "containing itself)"))
                return source.name, None
        data = source.data
        name = source.name
    elif isinstance(source, (str, os.PathLike)):
        name = os.fspath(source)
        try:
            data = pathlib.Path(name).read_bytes()
        except OSError as exc:
            reason = exc.strerror or exc.__class__.__name__
            raise InputError(f"cannot read registry file {name}: {reason}") from None
    else:
        raise InputError(f"not a registry source: {source!r} (expected a path or a Fragment)")
    text = _decode(name, data, problems)
    if text is None:
        return name, None
    return name, _compose(name, text, problems)


def _decode(name: str, data: Union[str, bytes], problems: list[Problem]) -> Optional[str]:
    if isinstance(data, str):
        return data
    try:
        return bytes(data).decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line, col = _line_col(data, exc.start, newline=b"\n")
        problems.append(Problem(name, line, col, f"not UTF-8 text (byte 0x{data[exc.start]:02x} "
                                                 f"at offset {exc.start})"))
        return None


def _line_col(text, index: int, newline) -> tuple[int, int]:
    line = text.count(newline, 0, index) + 1
    return line, index - (text.rfind(newline, 0, index) + 1) + 1


def _compose(name: str, text: str, problems: list[Problem]) -> Optional[Node]:
    """``yaml.compose(text)``, depth-limited; problems instead of raising."""
    try:
        root = yaml.compose(text, Loader=_C_LOADER or _PyComposer)
    except _TooDeep as exc:
        problems.append(Problem(name, exc.mark.line + 1, exc.mark.column + 1,
                                f"YAML nested more than {_MAX_DEPTH} levels deep; not a registry"))
        return None
    except yaml.YAMLError as exc:
        problems.append(_yaml_problem(name, text, exc))
        return None
    if root is None:
        problems.append(Problem(name, 1, 1, f"empty registry; expected a mapping starting "
                                            f"with 'version: {S.FORMAT_VERSION}'"))
    return root


def _yaml_problem(name: str, text: str, exc: yaml.YAMLError) -> Problem:
    """One line from a PyYAML error, at its mark."""
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    if mark is not None:
        line, col = mark.line + 1, mark.column + 1
    elif isinstance(getattr(exc, "position", None), int):  # ReaderError: bad character
        line, col = _line_col(text, min(exc.position, len(text)), newline="\n")
    else:
        line, col = 1, 1
    parts = [getattr(exc, "context", None), getattr(exc, "problem", None)]
    if isinstance(exc, yaml.reader.ReaderError):
        char = exc.character if isinstance(exc.character, str) else chr(exc.character)
        parts = [f"unacceptable character {char!r}: {exc.reason}"]
    message = "; ".join(str(p) for p in parts if p) or str(exc).splitlines()[0]
    return Problem(name, line, col, f"invalid YAML: {message}")


def _to_node(value: Any) -> Node:
    """A mark-less node tree for a plugin's Python mapping, so one walker validates both."""
    if isinstance(value, Node):
        return value
    if isinstance(value, Mapping):
        return MappingNode(_TAG + "map", [(_to_node(k), _to_node(v)) for k, v in value.items()])
    if isinstance(value, (list, tuple)):
        return SequenceNode(_TAG + "seq", [_to_node(v) for v in value])
    if isinstance(value, enum.Enum) and hasattr(value, "label"):
        return ScalarNode(_STR, value.label)  # a ForwardMode or WarReadDonePolicy
    if isinstance(value, bool):
        return ScalarNode(_BOOL, "true" if value else "false")
    if isinstance(value, int):
        return ScalarNode(_INT, str(value))
    if isinstance(value, float):
        return ScalarNode(_TAG + "float", repr(value))
    if isinstance(value, str):
        return ScalarNode(_STR, value)
    if value is None:
        return ScalarNode(_NULL, "null")
    return ScalarNode(f"!python/{type(value).__name__}", repr(value)[:60])


# -- per-source parsing -----------------------------------------------------------------------

@attrs.frozen
class _Ref:
    """A name one entry refers to, checked on the merged registry."""

    kind: str  # backend | spec algorithm | spec family | capability | flag
    name: str
    problem_at: tuple  # (origin, path) to report at


@attrs.frozen
class _Entry:
    """A flag, spec algorithm, backend or gate from one source, before merging."""

    kind: str
    name: str
    value: Any  # Flag | SpecAlgorithm | _BackendDraft | Gate
    origin: Origin
    path: str
    override: bool
    refs: tuple[_Ref, ...] = ()
    source: int = 0  # index of the source in layering order


@attrs.frozen
class _BackendDraft:
    backend: Backend  # without its scoped gates (they merge like any gate)
    gates: tuple[_Entry, ...]
    edges: tuple[tuple[str, Origin, str], ...]  # (child, origin, path) for cycle checks


@attrs.frozen
class _Parsed:
    source: str
    flags: tuple[_Entry, ...]
    specs: tuple[_Entry, ...]
    backends: tuple[_Entry, ...]
    gates: tuple[_Entry, ...]
    #: names declared by entries that had problems: referring to them is not a second problem
    broken: frozenset[tuple[str, str]] = frozenset()
    #: references made by entries that had problems, still checked so all show at once
    orphan_refs: tuple[_Ref, ...] = ()


def _join(path: str, key: str) -> str:
    """``path.key`` in the file's own key names; odd keys quoted so a message stays one line."""
    if not _NAME_RE.match(key):
        return f"{path}[{key!r}]"
    return f"{path}.{key}" if path else key


def _describe(node: Node) -> str:
    """What a node is, for 'expected X, got Y' messages."""
    if isinstance(node, MappingNode):
        return "a mapping"
    if isinstance(node, SequenceNode):
        return "a list"
    value = node.value if len(node.value) <= 40 else node.value[:37] + "..."
    kinds = {_STR: f"the string {value!r}", _BOOL: f"the boolean {value}", _NULL: "null",
             _INT: f"the integer {value}", _TAG + "float": f"the number {value}"}
    return kinds.get(node.tag, f"{value!r} (tagged {node.tag})")


class _SourceParser:
    """Walks one source's node tree with the schema tables; records problems as it goes."""

    def __init__(self, name: str, problems: list[Problem], index: int = 0) -> None:
        self.name = name
        self.problems = problems
        self.index = index
        self.broken: set[tuple[str, str]] = set()
        self.orphan_refs: list[_Ref] = []
        self.parsers: dict[str, Callable[[Node, str], Any]] = {
            S.BOOL: self.bool, S.TEXT: self.text, S.NAME: self.name_value,
            S.POLICY: self.policy, S.NAME_LIST: self.name_list, S.NAME_SET: self.name_set,
            S.ENV_LIST: self.env_list, S.POLICY_SET: self.policy_set, S.MODE_SET: self.mode_set,
            S.MODE_POLICY_MAP: self.mode_policy_map, S.MODE_NAME_MAP: self.mode_name_map,
            S.BOOL_MAP: self.bool_map, S.WHEN: self.when,
        }
        self.keys = {section: S.keys_by_name(section) for section in S.SECTIONS}

    # -- locations and problems --

    def origin(self, node: Node) -> Origin:
        mark = node.start_mark
        if mark is None:
            return Origin(self.name)
        return Origin(self.name, mark.line + 1, mark.column + 1)

    def problem_at(self, origin: Origin, path: str, message: str) -> None:
        prefix = f"{path}: " if path else ""
        self.problems.append(Problem(origin.file, origin.line, origin.col, prefix + message))

    def problem(self, node: Node, path: str, message: str) -> None:
        self.problem_at(self.origin(node), path, message)

    def expected(self, node: Node, path: str, what: str) -> object:
        self.problem(node, path, f"expected {what}, got {_describe(node)}")
        return _BAD

    # -- structure --

    def mapping(self, node: Node, path: str, what: str = "a mapping") -> Optional[list]:
        """The (key node, value node) pairs of a mapping, duplicates and bad keys reported.

        Null stands for an empty mapping (``flags:`` with nothing under it).
        """
        if isinstance(node, ScalarNode) and node.tag == _NULL:
            return []
        if not isinstance(node, MappingNode):
            self.expected(node, path, what)
            return None
        seen: dict[str, Node] = {}
        pairs = []
        for key, value in node.value:
            if not isinstance(key, ScalarNode):
                self.problem(key, path, f"keys must be plain names, got {_describe(key)}")
                continue
            if key.tag == _TAG + "merge":
                self.problem(key, path, "YAML merge keys (<<) are not supported; "
                                        "use inherits: or repeat the keys")
                continue
            first = seen.get(key.value)
            if first is not None:
                self.problem(key, path, f"duplicate key {key.value!r} (first at line "
                                        f"{self.origin(first).line}); YAML would silently "
                                        "keep only the last one")
                continue
            seen[key.value] = key
            pairs.append((key, value))
        return pairs

    def section(self, node: Node, path: str, section: str) -> Optional[dict]:
        """Parse a fixed-key section into {key: parsed value}; unknown and missing keys
        reported. Returns None when the node is not a mapping."""
        pairs = self.mapping(node, path, f"a {section.replace('_', ' ')} mapping")
        if pairs is None:
            return None
        known = self.keys[section]
        out: dict[str, Any] = {}
        for key, value in pairs:
            spec = known.get(key.value)
            if spec is None:
                self.unknown_key(key, path, known)
                continue
            parser = self.parsers.get(spec.kind)
            sub = _join(path, key.value)
            out[key.value] = (key, value) if parser is None else parser(value, sub)
        for spec in known.values():
            if spec.required and spec.name not in out:
                hint = f" (the integer {S.FORMAT_VERSION})" if spec.kind == S.VERSION else ""
                self.problem(node, path, f"missing required key {spec.name!r}{hint}")
        return out

    def unknown_key(self, key: ScalarNode, path: str, known: Mapping) -> None:
        close = difflib.get_close_matches(str(key.value), list(known), n=3, cutoff=0.6)
        hint = ("; did you mean " + ", ".join(repr(c) for c in close) + "?" if close
                else "; known keys: " + ", ".join(known))
        where = "top-level key" if not path else "key"
        self.problem(key, path, f"unknown {where} {key.value!r}{hint}")

    # -- scalars --

    def bool(self, node: Node, path: str) -> Any:
        if isinstance(node, ScalarNode) and node.tag == _BOOL:
            return node.value.lower() in ("true", "yes", "on")
        return self.expected(node, path, "true or false")

    def text(self, node: Node, path: str) -> Any:
        if isinstance(node, ScalarNode) and node.tag == _STR and node.value.strip():
            return " ".join(node.value.split())  # folded docs read as one line
        return self.expected(node, path, "a non-empty string")

    def name_value(self, node: Node, path: str) -> Any:
        """A registry name, returned with where it was written (for reference checks)."""
        if not (isinstance(node, ScalarNode) and node.tag == _STR):
            return self.expected(node, path, "a name")
        if not _NAME_RE.match(node.value):
            self.problem(node, path, f"{node.value!r} is not a valid name (letters, digits, "
                                     "_ . + -; no spaces or '=')")
            return _BAD
        return (node.value, self.origin(node))

    def key_name(self, key: ScalarNode, path: str, kind: str) -> Optional[str]:
        if _NAME_RE.match(key.value):
            return key.value
        self.problem(key, path, f"{key.value!r} is not a valid {kind} name (letters, digits, "
                                "_ . + -; no spaces or '=')")
        return None

    def policy(self, node: Node, path: str) -> Any:
        if not (isinstance(node, ScalarNode) and node.tag == _STR):
            return self.expected(node, path, "a policy (pre_replay, in_graph, post_replay, none)")
        try:
            return WarReadDonePolicy.parse(node.value)
        except UnknownNameError as exc:
            self.problem(node, path, str(exc))
            return _BAD

    def mode(self, node: Node, path: str) -> Any:
        if not (isinstance(node, ScalarNode) and node.tag == _STR):
            return self.expected(node, path, "a forward mode")
        try:
            return ForwardMode.parse(node.value)
        except UnknownNameError as exc:
            self.problem(node, path, str(exc))
            return _BAD

    # -- collections --

    def items(self, node: Node, path: str, scalar_ok: bool, what: str) -> Optional[list]:
        """Items of a list (or a lone scalar where a set allows one); empty lists reported."""
        if scalar_ok and isinstance(node, ScalarNode) and node.tag != _NULL:
            return [(node, path)]
        if not isinstance(node, SequenceNode):
            self.expected(node, path, what)
            return None
        if not node.value:
            self.problem(node, path, "an empty list; leave the key out instead")
            return None
        return [(item, f"{path}[{i}]") for i, item in enumerate(node.value)]

    def _collect(self, node: Node, path: str, parse, scalar_ok: bool, what: str) -> Any:
        items = self.items(node, path, scalar_ok, what)
        if items is None:
            return _BAD
        values = [parse(item, sub) for item, sub in items]
        return _BAD if any(v is _BAD for v in values) else values

    def name_list(self, node: Node, path: str) -> Any:
        values = self._collect(node, path, self.name_value, False, "a list of names")
        if values is _BAD:
            return _BAD
        seen: set[str] = set()
        for (name, origin) in values:
            if name in seen:
                self.problem_at(origin, path, f"{name!r} is listed twice")
                return _BAD
            seen.add(name)
        return values

    def name_set(self, node: Node, path: str) -> Any:
        return self._collect(node, path, self.name_value, True, "a name or a list of names")

    def env_list(self, node: Node, path: str) -> Any:
        def env(item: Node, sub: str) -> Any:
            if not (isinstance(item, ScalarNode) and item.tag == _STR):
                return self.expected(item, sub, "an environment variable name")
            if not _ENV_RE.match(item.value):
                self.problem(item, sub, f"{item.value!r} is not an environment variable name")
                return _BAD
            return (item.value, self.origin(item))
        return self._collect(node, path, env, True, "a list of environment variable names")

    def policy_set(self, node: Node, path: str) -> Any:
        values = self._collect(node, path, self.policy, True, "a policy or a list of policies")
        return values if values is _BAD else frozenset(values)

    def mode_set(self, node: Node, path: str) -> Any:
        values = self._collect(node, path, self.mode, True, "a mode or a list of modes")
        return values if values is _BAD else frozenset(values)

    def mode_map(self, node: Node, path: str, parse_value) -> Any:
        """mode -> value, with the origin of each mode key; aliases of one mode collide."""
        pairs = self.mapping(node, path, "a mapping of forward mode -> value")
        if pairs is None:
            return _BAD
        out: dict[ForwardMode, tuple[Any, Origin]] = {}
        spelled: dict[ForwardMode, str] = {}
        ok = True
        for key, value in pairs:
            sub = _join(path, key.value)
            mode = self.mode(key, path)
            parsed = parse_value(value, sub)
            if mode is _BAD or parsed is _BAD:
                ok = False
                continue
            if mode in out:
                self.problem(key, path, f"{key.value!r} is mode {mode.label!r}, already given "
                                        f"as {spelled[mode]!r}")
                ok = False
                continue
            out[mode] = (parsed, self.origin(key))
            spelled[mode] = key.value
        return out if ok else _BAD

    def mode_policy_map(self, node: Node, path: str) -> Any:
        return self.mode_map(node, path, self.policy)

    def mode_name_map(self, node: Node, path: str) -> Any:
        return self.mode_map(node, path, self.name_value)

    def bool_map(self, node: Node, path: str) -> Any:
        pairs = self.mapping(node, path, "a mapping of name -> true/false")
        if pairs is None:
            return _BAD
        out: dict[str, tuple[bool, Origin]] = {}
        ok = True
        for key, value in pairs:
            name = self.key_name(key, path, "capability or flag")
            parsed = self.bool(value, _join(path, key.value))
            if name is None or parsed is _BAD:
                ok = False
                continue
            out[name] = (parsed, self.origin(key))
        return out if ok else _BAD

    # -- entries --

    def parse(self, root: Node) -> Optional[_Parsed]:
        top = self.section(root, "", "registry")
        if top is None:
            return None
        self.check_version(top.get("version"))
        flags = self.named_entries(top.get("flags"), "flags", "flag", self.flag)
        specs = self.named_entries(top.get("spec_algorithms"), "spec_algorithms",
                                   "spec_algorithm", self.spec)
        backends = self.named_entries(top.get("backends"), "backends", "backend", self.backend)
        gates = self.gate_list(top.get("gates"), "gates", scope=None)
        return _Parsed(self.name, flags, specs, backends, gates, frozenset(self.broken),
                       tuple(self.orphan_refs))

    def check_version(self, raw) -> None:
        if raw is None:
            return  # reported as a missing required key
        _key, node = raw
        value = None
        if isinstance(node, ScalarNode) and node.tag == _INT:
            try:  # YAML ints include 0x1, 0o1, 1_0
                value = yaml.constructor.SafeConstructor().construct_yaml_int(node)
            except ValueError:  # an explicit !!int tag on text
                value = None
        if value is None:
            self.expected(node, "version", f"the integer {S.FORMAT_VERSION}")
        elif value != S.FORMAT_VERSION:
            self.problem(node, "version", f"unsupported registry version {node.value}; this "
                                          f"warpolicy reads version {S.FORMAT_VERSION}")

    def named_entries(self, raw, path: str, section: str, build) -> tuple[_Entry, ...]:
        if raw is None:
            return ()
        _key, node = raw
        pairs = self.mapping(node, path, f"a mapping of name -> {section.replace('_', ' ')}")
        out = []
        for key, value in pairs or ():
            name = self.key_name(key, path, section.replace("_", " "))
            sub = _join(path, key.value)
            fields = self.section(value, sub, section)
            if name is None or fields is None:
                if name is not None:
                    self.broken.add((_KIND[section], name))
                continue
            entry = build(name, fields, self.origin(key), sub)
            if entry is not None:
                out.append(entry)
            else:
                self.broken.add((_KIND[section], name))
        return tuple(out)

    @staticmethod
    def _ok(fields: dict) -> bool:
        return all(v is not _BAD for v in fields.values())

    def flag(self, name: str, f: dict, origin: Origin, path: str) -> Optional[_Entry]:
        if not self._ok(f):
            return None
        env = tuple(n for n, _o in f.get("env", ()))
        flag = Flag(name=name, default=f.get("default", False), env=env, doc=f.get("doc", ""),
                    origin=origin)
        env_origins = tuple(o for _n, o in f.get("env", ()))
        return _Entry("flag", name, (flag, env_origins), origin, path, f.get("override", False),
                      source=self.index)

    def spec(self, name: str, f: dict, origin: Origin, path: str) -> Optional[_Entry]:
        if not self._ok(f):
            return None
        family = f.get("family")
        caps = {cap: value for cap, (value, _o) in f.get("capabilities", {}).items()}
        spec = SpecAlgorithm(name=name, family=family[0] if family else None,
                             capabilities=caps, doc=f.get("doc", ""), origin=origin)
        return _Entry("spec algorithm", name, spec, origin, path, f.get("override", False),
                      source=self.index)

    def backend(self, name: str, f: dict, origin: Origin, path: str) -> Optional[_Entry]:
        gates = self.gate_list(f.get("gates"), f"{path}.gates", scope=name)
        refs, edges = self.backend_refs(f, path)
        if not self._ok(f) or not self.check_shape(f, origin, path):
            self.orphan_refs.extend(refs)
            for gate in gates:
                self.orphan_refs.extend(gate.refs)
            return None
        reads_end = f.get("reads_end", {})
        per_mode = f.get("per_mode", {})
        inherits = f.get("inherits")
        backend = Backend(
            name=name,
            reads_end={m: p for m, (p, _o) in reads_end.items()},
            inherits=inherits[0] if inherits else None,
            latest_of=tuple(c for c, _o in f.get("latest_of", ())),
            per_mode={m: c for m, ((c, _co), _ko) in per_mode.items()},
            abstract=f.get("abstract", False),
            doc=f.get("doc", ""),
            origin=origin,
            reads_end_origins={m: o for m, (_p, o) in reads_end.items()},
        )
        draft = _BackendDraft(backend, gates, edges)
        return _Entry("backend", name, draft, origin, path, f.get("override", False),
                      refs, source=self.index)

    @staticmethod
    def backend_refs(f: dict, path: str) -> tuple[tuple[_Ref, ...], tuple]:
        """The backends this one names (inherits, latest_of, per_mode), as references and as
        edges for the cycle check; fields that failed to parse are skipped."""
        found: list[tuple[str, Origin, str]] = []
        inherits = f.get("inherits", _BAD)
        if inherits is not _BAD:
            found.append((inherits[0], inherits[1], f"{path}.inherits"))
        latest_of = f.get("latest_of", _BAD)
        if latest_of is not _BAD:
            for i, (child, origin) in enumerate(latest_of):
                found.append((child, origin, f"{path}.latest_of[{i}]"))
        per_mode = f.get("per_mode", _BAD)
        if per_mode is not _BAD:
            for mode, ((child, origin), _key_origin) in per_mode.items():
                found.append((child, origin, f"{path}.per_mode.{mode.label}"))
        refs = tuple(_Ref("backend", child, (origin, sub)) for child, origin, sub in found)
        return refs, tuple(found)

    def check_shape(self, f: dict, origin: Origin, path: str) -> bool:
        """A backend is plain, composite or per-mode; say so when it mixes them."""
        ok = True
        if "latest_of" in f and "per_mode" in f:
            self.problem_at(origin, path, "use either latest_of (a composite) or per_mode "
                                          "(a per-mode wrapper), not both")
            ok = False
        per_mode, reads_end = f.get("per_mode", {}), f.get("reads_end", {})
        if per_mode is _BAD or reads_end is _BAD:
            return ok
        for mode in sorted(set(per_mode) & set(reads_end), key=lambda m: m.value):
            self.problem_at(per_mode[mode][1], f"{path}.per_mode",
                            f"mode {mode.label!r} is delegated here and also declared in "
                            "reads_end; keep one")
            ok = False
        return ok

    def gate_list(self, raw, path: str, scope: Optional[str]) -> tuple[_Entry, ...]:
        if raw is None:
            return ()
        node = raw[1] if isinstance(raw, tuple) else raw
        if isinstance(node, ScalarNode) and node.tag == _NULL:
            return ()
        if not isinstance(node, SequenceNode):
            self.expected(node, path, "a list of gates")
            return ()
        out = []
        for i, item in enumerate(node.value):
            entry = self.gate(item, f"{path}[{i}]", scope)
            if entry is not None:
                out.append(entry)
        return tuple(out)

    def gate(self, node: Node, path: str, scope: Optional[str]) -> Optional[_Entry]:
        f = self.section(node, path, "gate")
        if f is None:
            return None
        when = f.get("when", (Conditions(), ()))
        if not self._ok(f) or not {"id", "at_least", "because"} <= set(f):
            if when is not _BAD:
                self.orphan_refs.extend(when[1])
            return None
        cond, refs = when
        gate_id, _id_origin = f["id"]
        origin = self.origin(node)
        gate = Gate(id=gate_id, when=cond, at_least=f["at_least"], because=f["because"],
                    origin=origin, scope=scope, doc=f.get("doc", ""))
        return _Entry("gate", gate_id, gate, origin, path, f.get("override", False), refs,
                      source=self.index)

    def when(self, node: Node, path: str) -> Any:
        """A gate's conditions and the names they refer to (checked once all is merged)."""
        f = self.section(node, path, "when")
        if f is None:
            return _BAD
        refs: list[_Ref] = []

        def names(key: str, kind: str) -> Optional[frozenset]:
            value = f.get(key)
            if value is None or value is _BAD:
                return None
            if kind:
                refs.extend(_Ref(kind, n, (o, f"{path}.{key}")) for n, o in value)
            return frozenset(n for n, _o in value)

        flags = f.get("flags", {})
        if flags is not _BAD:
            refs.extend(_Ref("flag", n, (o, f"{path}.flags")) for n, (_v, o) in flags.items())
        sets = {key: names(key, kind) for key, kind in _WHEN_REFS.items()}
        if not self._ok(f):
            self.orphan_refs.extend(refs)
            return _BAD
        cond = Conditions(
            mode=f.get("mode"),
            flags={n: v for n, (v, _o) in flags.items()},
            declared=f.get("declared"),
            eager=f.get("eager"),
            planted=f.get("planted"),
            external_events=f.get("external_events"),
            **sets,
        )
        return cond, tuple(refs)


#: ``when`` keys holding names, and the kind of name each refers to ("" = not checked).
_WHEN_REFS = {"backend": "backend", "spec": "spec algorithm", "spec_family": "spec family",
              "spec_has": "capability", "spec_lacks": "capability", "platform": ""}


# -- layering ---------------------------------------------------------------------------------

_ADDED, _REPLACED, _REJECTED = "added", "replaced", "rejected"


class _Merger:
    """Layers parsed sources: adds, overrides, and reports redefinitions with both places."""

    def __init__(self, problems: list[Problem]) -> None:
        self.problems = problems
        self.flags: dict[str, _Entry] = {}
        self.specs: dict[str, _Entry] = {}
        self.backends: dict[str, _Entry] = {}
        self.gates: dict[str, _Entry] = {}
        self.broken: set[tuple[str, str]] = set()  # (kind, name) of entries with problems
        self.orphan_refs: list[_Ref] = []

    def problem_at(self, origin: Origin, path: str, message: str) -> None:
        self.problems.append(Problem(origin.file, origin.line, origin.col, f"{path}: {message}"))

    def add(self, parsed: _Parsed) -> None:
        self.broken |= parsed.broken
        self.orphan_refs.extend(parsed.orphan_refs)
        for entry in parsed.flags:
            self.put(self.flags, entry)
        for entry in parsed.specs:
            self.put(self.specs, entry)
        for entry in parsed.backends:
            outcome = self.put(self.backends, entry)
            if outcome == _REPLACED:
                self.drop_scoped_gates(entry.name)
            if outcome != _REJECTED:
                for gate in entry.value.gates:
                    self.put(self.gates, gate)
        for entry in parsed.gates:
            self.put(self.gates, entry)

    def put(self, table: dict[str, _Entry], entry: _Entry) -> str:
        """Add ``entry``, replace an earlier one (``override: true``) or report both places."""
        old = table.get(entry.name)
        if old is None:
            table[entry.name] = entry
            return _ADDED
        if entry.override and old.source != entry.source:
            table[entry.name] = entry  # keeps the first definition's position
            return _REPLACED
        what = "gate id" if entry.kind == "gate" else entry.kind
        if old.source == entry.source:
            hint = "; names must be unique within a file"
        else:
            hint = "; add override: true to replace it"
        self.problem_at(entry.origin, entry.path,
                        f"{what} {entry.name!r} already defined at {old.origin}{hint}")
        return _REJECTED

    def drop_scoped_gates(self, backend: str) -> None:
        """An overriding backend replaces its whole entry, scoped gates included."""
        for gate_id in [g for g, e in self.gates.items() if e.value.scope == backend]:
            del self.gates[gate_id]

    # -- checks on the merged registry --

    def check_references(self) -> None:
        known = {
            "backend": self.backends,
            "spec algorithm": self.specs,
            "flag": self.flags,
            "spec family": {e.value.family for e in self.specs.values() if e.value.family},
            "capability": {c for e in self.specs.values() for c in e.value.capabilities},
        }
        refs = [r for table in (self.backends, self.gates) for e in table.values()
                for r in e.refs]
        for ref in refs + self.orphan_refs:
            if ref.name in known[ref.kind] or (ref.kind, ref.name) in self.broken:
                continue
            origin, path = ref.problem_at
            candidates = set(known[ref.kind]) | {n for k, n in self.broken if k == ref.kind}
            self.problem_at(origin, path, str(UnknownNameError(ref.kind, ref.name, candidates)))
        self.check_env_names()
        self.check_cycles()

    def check_env_names(self) -> None:
        """One environment variable must not set two flags."""
        owners: dict[str, tuple[str, Origin]] = {}
        for entry in self.flags.values():
            flag, env_origins = entry.value
            for var, origin in zip(flag.env, env_origins):
                first = owners.setdefault(var, (flag.name, origin))
                if first[0] != flag.name:
                    self.problem_at(origin, f"{entry.path}.env",
                                    f"{var} already sets flag {first[0]!r} at {first[1]}")
                elif first[1] != origin:
                    self.problem_at(origin, f"{entry.path}.env", f"{var} is listed twice")

    def check_cycles(self) -> None:
        """Report each cycle through inherits / latest_of / per_mode once (iterative DFS)."""
        edges = {name: [e for e in entry.value.edges if e[0] in self.backends]
                 for name, entry in self.backends.items()}
        state: dict[str, int] = {}  # 1 = on the current path, 2 = done
        for start in edges:
            if start in state:
                continue
            path: list[str] = [start]
            stack = [iter(edges[start])]
            state[start] = 1
            while stack:
                step = next(stack[-1], None)
                if step is None:
                    state[path.pop()] = 2
                    stack.pop()
                    continue
                child, origin, where = step
                if state.get(child) == 1:
                    cycle = path[path.index(child):] + [child]
                    self.problem_at(origin, where, "cycle: " + " -> ".join(cycle))
                elif child not in state:
                    state[child] = 1
                    path.append(child)
                    stack.append(iter(edges[child]))

    # -- result --

    def build(self, sources: Iterable[str]) -> Registry:
        scoped: dict[str, list[Gate]] = {}
        global_gates: list[Gate] = []
        for entry in self.gates.values():
            gate: Gate = entry.value
            if gate.scope is None:
                global_gates.append(gate)
            else:
                scoped.setdefault(gate.scope, []).append(gate)
        backends = {name: attrs.evolve(e.value.backend, gates=tuple(scoped.get(name, ())))
                    for name, e in self.backends.items()}
        return Registry(
            flags={n: e.value[0] for n, e in self.flags.items()},
            spec_algorithms={n: e.value for n, e in self.specs.items()},
            backends=backends,
            gates=tuple(global_gates),
            sources=tuple(sources),
        )
