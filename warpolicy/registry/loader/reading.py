"""Stage 1 of loading: bytes -> a composed YAML node tree, or located problems.

Reading is bounded: only regular files are opened (a FIFO or a device is refused before it
is opened, so a read can never block), at most `MAX_BYTES` are read, composing stops at
`MAX_DEPTH` levels of nesting, and a document whose aliases add more than `MAX_NODES` nodes
to it is refused before anything walks it. YAML-level constructs the registry format does not have
(explicit tags such as ``!!bool``) are refused here, at their mark, because the node tree no
longer shows them.
"""

from __future__ import annotations

import enum
import os
import pathlib
import stat
from collections.abc import Mapping

import attrs
import yaml
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from warpolicy.errors import Problem
from warpolicy.registry import schema as S

#: Largest registry file or text fragment read, in bytes. The default registry is about
#: 10 KiB and a synthetic 1,000-backend registry about 90 KiB.
MAX_BYTES = 4 * 1024 * 1024
#: Deepest collection nesting composed. yaml.compose recurses once per level (a RecursionError
#: in Python, a crash in libyaml's C composer) and scanning is quadratic in flow depth; a
#: registry nests about 6 deep.
MAX_DEPTH = 100
#: Most nodes YAML aliases may add to a document once they are followed (each alias counts the
#: whole subtree it names; the document's own nodes do not count: `MAX_BYTES` bounds those).
#: A 1,000-backend registry has about 20,000 nodes and no aliases.
MAX_NODES = 200_000

TAG = "tag:yaml.org,2002:"
STR, BOOL, INT, FLOAT, NULL = (TAG + "str", TAG + "bool", TAG + "int", TAG + "float", TAG + "null")


@attrs.frozen
class Document:
    """One source read and composed: ``root`` is None when it could not be (see problems)."""

    name: str
    root: Node | None
    problems: tuple[Problem, ...] = ()


class _Refused(Exception):
    """Composing stopped at ``line``, ``col`` (1-based) for ``reason`` (too deep, a tag)."""

    def __init__(self, at: tuple[int, int], reason: str) -> None:
        super().__init__(reason)
        self.line, self.col = at
        self.reason = reason


def _at(event: yaml.Event) -> tuple[int, int]:
    mark = event.start_mark
    return (mark.line + 1, mark.column + 1) if mark is not None else (1, 1)


class _StrictEvents:
    """Checks the events PyYAML's composer consumes, before it recurses into them: collection
    depth, and explicit tags (which the composed nodes no longer distinguish)."""

    _depth = 0

    def get_event(self) -> yaml.Event:
        event = super().get_event()  # type: ignore[misc]
        if isinstance(event, yaml.CollectionStartEvent):
            self._depth += 1
            if self._depth > MAX_DEPTH:
                raise _Refused(
                    _at(event), f"YAML nested more than {MAX_DEPTH} levels deep; not a registry"
                )
        elif isinstance(event, yaml.CollectionEndEvent):
            self._depth -= 1
        tag = getattr(event, "tag", None)
        if tag is not None and isinstance(event, (yaml.ScalarEvent, yaml.CollectionStartEvent)):
            shown = tag.replace(TAG, "!!")
            raise _Refused(
                _at(event),
                f"YAML tags ({shown}) are not part of the registry format; write the plain value",
            )
        return event


class _PyComposer(_StrictEvents, yaml.SafeLoader):
    """PyYAML's pure-Python safe loader, strict and depth-limited."""


_CLoader: type | None = None
if hasattr(yaml, "CSafeLoader"):

    class _CComposer(_StrictEvents, yaml.composer.Composer, yaml.CSafeLoader):
        """libyaml's parser (about 10x faster) feeding PyYAML's Python composer, which can be
        checked per event and names the anchor in its errors (libyaml's C composer does
        neither)."""

        def __init__(self, stream: str) -> None:
            yaml.CSafeLoader.__init__(self, stream)
            yaml.composer.Composer.__init__(self)

    _CLoader = _CComposer

#: The composer class in use; tests set it to None to run the pure-Python one.
C_LOADER = _CLoader


# -- reading ----------------------------------------------------------------------------------


def read_file(name: str, problems: list[Problem]) -> bytes | None:
    """The bytes of a regular file, at most `MAX_BYTES`; else a problem marked unreadable.

    The type is checked before opening (a FIFO would block an ``open``) and again on the open
    descriptor, which is opened non-blocking in case the path was swapped in between.
    """
    try:
        kind = _file_kind(os.stat(name).st_mode)
        if kind is None:
            fd = os.open(name, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
            try:
                kind = _file_kind(os.fstat(fd).st_mode)
                data = b"" if kind else _read_capped(fd)
            finally:
                os.close(fd)
    except OSError as exc:
        reason = exc.strerror or exc.__class__.__name__
        problems.append(
            Problem(name, 0, 0, f"cannot read registry file: {reason}", unreadable=True)
        )
        return None
    if kind is not None:
        problems.append(
            Problem(
                name, 0, 0, f"not a regular file ({kind}); refusing to read it", unreadable=True
            )
        )
        return None
    if len(data) > MAX_BYTES:
        problems.append(
            Problem(
                name,
                0,
                0,
                f"larger than {MAX_BYTES // (1024 * 1024)} MiB; not a registry",
                unreadable=True,
            )
        )
        return None
    return data


def _file_kind(mode: int) -> str | None:
    """None for a regular file, else what it is."""
    if stat.S_ISREG(mode):
        return None
    kinds = {
        stat.S_ISDIR: "a directory",
        stat.S_ISFIFO: "a FIFO",
        stat.S_ISCHR: "a device",
        stat.S_ISBLK: "a device",
        stat.S_ISSOCK: "a socket",
    }
    return next((what for test, what in kinds.items() if test(mode)), "not a file")


def _read_capped(fd: int) -> bytes:
    chunks, size = [], 0
    while size <= MAX_BYTES:
        chunk = os.read(fd, min(1 << 20, MAX_BYTES + 1 - size))
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    return b"".join(chunks)


def decode(name: str, data: str | bytes, problems: list[Problem]) -> str | None:
    """UTF-8 (a BOM allowed) text, size-capped; a located problem otherwise."""
    if len(data) > MAX_BYTES:
        problems.append(
            Problem(name, 0, 0, f"larger than {MAX_BYTES // (1024 * 1024)} MiB; not a registry")
        )
        return None
    if isinstance(data, str):
        return data
    try:
        return bytes(data).decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line, col = line_col(data, exc.start, b"\n")
        problems.append(
            Problem(
                name,
                line,
                col,
                f"not UTF-8 text (byte 0x{data[exc.start]:02x} at offset {exc.start})",
            )
        )
        return None


def line_col(text: str | bytes, index: int, newline: str | bytes) -> tuple[int, int]:
    """1-based line and column of ``index`` in ``text``."""
    line = text.count(newline, 0, index) + 1  # type: ignore[arg-type]
    return line, index - (text.rfind(newline, 0, index) + 1) + 1  # type: ignore[arg-type]


# -- composing --------------------------------------------------------------------------------


def compose(name: str, text: str, problems: list[Problem]) -> Node | None:
    """``yaml.compose(text)``, strict, depth- and size-limited; problems instead of raising."""
    try:
        root = yaml.compose(text, Loader=C_LOADER or _PyComposer)
    except _Refused as exc:
        problems.append(Problem(name, exc.line, exc.col, exc.reason))
        return None
    except yaml.YAMLError as exc:
        problems.append(yaml_problem(name, text, exc))
        return None
    if root is None:
        problems.append(
            Problem(
                name,
                1,
                1,
                f"empty registry; expected a mapping starting with 'version: {S.FORMAT_VERSION}'",
            )
        )
        return None
    return root if _within_node_limit(name, root, problems) else None


def yaml_problem(name: str, text: str, exc: yaml.YAMLError) -> Problem:
    """One line from a PyYAML error, at its mark."""
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    if mark is not None:
        line, col = mark.line + 1, mark.column + 1
    elif isinstance(getattr(exc, "position", None), int):  # ReaderError: bad character
        line, col = line_col(text, min(exc.position, len(text)), "\n")  # type: ignore[attr-defined]
    else:
        line, col = 1, 1
    parts = [getattr(exc, "context", None), getattr(exc, "problem", None)]
    if isinstance(exc, yaml.reader.ReaderError):
        char = exc.character if isinstance(exc.character, str) else chr(exc.character)
        parts = [f"unacceptable character {char!r}: {exc.reason}"]
    message = "; ".join(str(p) for p in parts if p) or str(exc).splitlines()[0]
    return Problem(name, line, col, f"invalid YAML: {message}")


def _within_node_limit(name: str, root: Node, problems: list[Problem]) -> bool:
    """Refuse a document whose aliases add more than `MAX_NODES` nodes to it (its size with
    every alias expanded, less its distinct nodes), in time linear in its distinct nodes: an
    alias is the same node object, so sizes are memoised per object. A large document without
    aliases is bounded by `MAX_BYTES` alone."""
    sizes: dict[int, int] = {}  # expanded size per distinct node, in post-order
    nodes: list[Node] = []
    stack: list[tuple[Node, bool]] = [(root, False)]
    while stack:
        node, children_done = stack.pop()
        key = id(node)
        if key in sizes:
            continue
        if isinstance(node, ScalarNode):
            sizes[key] = 1
            nodes.append(node)
            continue
        kids = _children(node)
        if not children_done:
            stack.append((node, True))
            stack.extend((k, False) for k in kids if id(k) not in sizes)
            continue
        sizes[key] = 1 + sum(sizes[id(k)] for k in kids)
        nodes.append(node)
    limit = len(sizes) + MAX_NODES
    if sizes[id(root)] <= limit:
        return True
    node = next(n for n in nodes if sizes[id(n)] > limit)  # the first value over the limit
    mark = node.start_mark
    line, col = (mark.line + 1, mark.column + 1) if mark is not None else (0, 0)
    problems.append(
        Problem(
            name,
            line,
            col,
            f"this value expands to more than {MAX_NODES} nodes through YAML aliases; "
            "not a registry",
        )
    )
    return False


def _children(node: Node) -> list[Node]:
    if isinstance(node, MappingNode):
        return [n for pair in node.value for n in pair]
    if isinstance(node, SequenceNode):
        return list(node.value)
    return []


# -- plugin mappings --------------------------------------------------------------------------


def to_node(name: str, value: object, problems: list[Problem]) -> Node | None:
    """A mark-less node tree for a plugin's Python mapping, so one walker validates both.

    Shared sub-objects become shared nodes (like YAML aliases, and counted the same way); a
    mapping that contains itself, or nests past `MAX_DEPTH`, is a problem, not a crash.
    """
    memo: dict[int, Node] = {}
    on_path: set[int] = set()

    def build(item: object, depth: int) -> Node:
        if id(item) in memo:
            return memo[id(item)]
        if depth > MAX_DEPTH or id(item) in on_path:
            raise _Refused((0, 0), "mapping nested too deeply (or containing itself)")
        if isinstance(item, Mapping):
            on_path.add(id(item))
            node: Node = MappingNode(
                TAG + "map", [(build(k, depth + 1), build(v, depth + 1)) for k, v in item.items()]
            )
            on_path.discard(id(item))
        elif isinstance(item, (list, tuple)):
            on_path.add(id(item))
            node = SequenceNode(TAG + "seq", [build(v, depth + 1) for v in item])
            on_path.discard(id(item))
        else:
            node = _scalar(item)
        memo[id(item)] = node
        return node

    try:
        root = build(value, 0)
    except _Refused as exc:
        problems.append(Problem(name, 0, 0, exc.reason))
        return None
    return root if _within_node_limit(name, root, problems) else None


def _scalar(value: object) -> ScalarNode:
    if isinstance(value, enum.Enum) and isinstance(getattr(value, "label", None), str):
        return ScalarNode(STR, value.label)  # type: ignore[attr-defined]  # a mode or policy
    if isinstance(value, bool):
        return ScalarNode(BOOL, "true" if value else "false")
    if isinstance(value, int):
        return ScalarNode(INT, str(value))
    if isinstance(value, float):
        return ScalarNode(FLOAT, repr(value))
    if isinstance(value, str):
        return ScalarNode(STR, value)
    if value is None:
        return ScalarNode(NULL, "null")
    return ScalarNode(f"!python/{type(value).__name__}", repr(value)[:60])


def default_path() -> pathlib.Path:
    """The packaged ``warpolicy/capabilities.yaml``; from a source tree, the repository's."""
    package = pathlib.Path(__file__).resolve().parents[2]  # warpolicy/registry/loader/
    packaged = package / "capabilities.yaml"
    if packaged.is_file():
        return packaged
    return package.parent / "capabilities.yaml"
