"""Registry fragments contributed by plugins: a plugin's `warpolicy_capabilities` result ->
`Fragment` objects, read and composed once by the loader's own reading stage.

A ``pathlib.Path`` result is read as a YAML file (bounded like any registry file); a ``str`` is
YAML text; a mapping is taken as parsed; a list holds several of these. A result that cannot be
read or composed is the plugin's fault (`FragmentError`, which the plugin manager turns into a
`PluginError` naming the plugin); problems in a fragment's content are registry problems located
at ``plugin:NAME`` (see `fragment_plugin`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping

import attrs

from warpolicy.errors import Problem, WarpolicyError
from warpolicy.registry.loader import reading
from warpolicy.registry.loader.reading import Document

PREFIX = "plugin:"


@attrs.frozen
class Fragment:
    """A registry source that is not a file: YAML text or an already-parsed mapping.

    ``name`` is what error locations show, e.g. ``"plugin:warpolicy-trace"``. A mapping has no
    marks, so its problems and origins carry line and column 0. ``document`` is the composed
    text when it was read already (by `plugin_fragments`), so it is not parsed twice.
    """

    name: str
    data: str | bytes | Mapping[str, object]
    document: Document | None = attrs.field(default=None, eq=False, repr=False, kw_only=True)


class FragmentError(WarpolicyError):
    """A plugin's fragment result that cannot be read or composed."""

    def __init__(self, plugin: str, message: str) -> None:
        self.plugin = plugin
        self.message = message
        super().__init__(message)


def compose_fragment(fragment: Fragment) -> Document:
    """The fragment's node tree, with any problem reading it."""
    if fragment.document is not None:
        return fragment.document
    problems: list[Problem] = []
    if isinstance(fragment.data, Mapping):
        root = reading.to_node(fragment.name, fragment.data, problems)
    else:
        text = reading.decode(fragment.name, fragment.data, problems)
        root = None if text is None else reading.compose(fragment.name, text, problems)
    return Document(fragment.name, root, tuple(problems))


def plugin_fragments(plugin: str, result: object) -> list[Fragment]:
    """The fragments in one plugin's hook result, labelled ``plugin:NAME`` (``[i]`` when the
    result is a list, ``:PATH`` for a file). Raises `FragmentError`."""
    if result is None:
        return []
    items = list(result) if isinstance(result, (list, tuple)) else [result]
    out = []
    for index, item in enumerate(items):
        label = f"{PREFIX}{plugin}" if len(items) == 1 else f"{PREFIX}{plugin}[{index}]"
        out.append(_fragment(plugin, label, item))
    return out


def _fragment(plugin: str, label: str, item: object) -> Fragment:
    problems: list[Problem] = []
    if isinstance(item, os.PathLike):
        path = os.fspath(item)
        data = reading.read_file(path, problems)
        if data is None:
            raise FragmentError(
                plugin, f"cannot read capabilities file {path}: {problems[0].message}"
            )
        text = reading.decode(path, data, problems)
        if text is None:
            raise FragmentError(plugin, f"capabilities file {path} is {problems[0].message}")
        label, where = f"{label}:{path}", path
    elif isinstance(item, str):
        text, where = item, label
    elif isinstance(item, Mapping):
        fragment = Fragment(label, item)
        return attrs.evolve(fragment, document=compose_fragment(fragment))
    else:
        raise FragmentError(
            plugin,
            "warpolicy_capabilities must return a pathlib.Path, YAML "
            "text, a mapping or a list of these, not "
            f"{type(item).__name__}",
        )
    root = reading.compose(label, text, problems)
    if root is None:
        first = problems[0]
        at = f" at line {first.line}, column {first.col}" if first.line else ""
        raise FragmentError(plugin, f"its capabilities fragment {where}{at}: {first.message}")
    return Fragment(label, text, document=Document(label, root, ()))


def fragment_plugin(label: str) -> str | None:
    """``plugin:NAME``, ``plugin:NAME[i]`` or ``plugin:NAME[i]:PATH`` -> NAME; else None."""
    if not label.startswith(PREFIX):
        return None
    rest = label[len(PREFIX) :]
    return rest.split("[", 1)[0].split(":", 1)[0] or None
