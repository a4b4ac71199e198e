"""Load capability registries: sources -> validated, merged, frozen `Registry`.

A pipeline in four stages, one module each:

1. `reading`: bytes -> a composed YAML node tree (bounded: regular files only, `MAX_BYTES`,
   `MAX_DEPTH`, `MAX_NODES` after aliases; no tags; YAML errors become located problems);
2. `fields`: nodes -> typed, located values of the schema's kinds (`warpolicy.registry.schema`);
3. `entries`: one source's values -> flag, spec algorithm, backend and gate entries;
4. `merge`: layering with ``override: true``, references, cycles, inheritance, then `Registry`.

Sources layer in order: files (``--capabilities``, ``WARPOLICY_CAPABILITIES`` or the packaged
default), then plugin fragments. Every problem of every source is collected with its
``FILE:LINE:COL`` and raised together, so a user fixes a file in one pass. The loader accepts
exactly the documents `warpolicy.registry.schema.registry_json_schema` accepts, plus the checks a schema
cannot express (references, cycles, layering), documented in docs/ARCHITECTURE.md.
"""

from __future__ import annotations

import os
import pathlib
from collections.abc import Callable, Mapping, Sequence

import attrs

from warpolicy import environment
from warpolicy.errors import InputError, Problem, RegistryError, UnreadableSourceError
from warpolicy.registry.inputs import parse_bool
from warpolicy.registry.loader import reading
from warpolicy.registry.loader.entries import EntryBuilder
from warpolicy.registry.loader.fragments import (
    Fragment,
    FragmentError,
    compose_fragment,
    fragment_plugin,
    plugin_fragments,
)
from warpolicy.registry.loader.merge import Merger
from warpolicy.registry.loader.reading import MAX_BYTES, MAX_DEPTH, MAX_NODES, Document
from warpolicy.registry.model import Registry, registry_warnings

__all__ = [
    "DEFAULT",
    "DEFAULT_TOKENS",
    "MAX_BYTES",
    "MAX_DEPTH",
    "MAX_NODES",
    "Assembly",
    "Fragment",
    "FragmentError",
    "Source",
    "assemble_registry",
    "default_registry_path",
    "document_problems",
    "env_flag_problems",
    "fragment_plugin",
    "load_registry",
    "plugin_fragments",
    "registry_sources",
    "validate_sources",
    "validate_warnings",
]

#: The token that names the packaged default registry among ``--capabilities`` files or in
#: ``WARPOLICY_CAPABILITIES`` (``:default:`` works too). A file literally named ``default``
#: must be given as ``./default``.
DEFAULT = "default"
DEFAULT_TOKENS = frozenset({DEFAULT, ":default:"})

Source = str | os.PathLike | Fragment
#: Rewrites problems located in plugin fragments (e.g. `warpolicy.runtime.manager.blame_plugins`
#: with its manager bound), so they also name the plugin's entry point.
Blame = Callable[[Sequence[Problem]], Sequence[Problem]]


def default_registry_path() -> pathlib.Path:
    """The packaged ``warpolicy/capabilities.yaml``; from a source tree, the repository's."""
    return reading.default_path()


def registry_sources(
    files: Sequence[str] | None = None, environ: Mapping[str, str] = environment.PROCESS
) -> list[str | pathlib.Path]:
    """The registry files to load, in layering order.

    Given ``files`` (``--capabilities``, repeatable) win; else ``WARPOLICY_CAPABILITIES`` split
    on `os.pathsep`; else the packaged default. The token ``default`` (or ``:default:``) in
    either list stands for the packaged default, so users can layer on top of it.
    """
    if files:
        chosen: list[str] = [str(f) for f in files]
    else:
        chosen = [p for p in environment.CAPABILITIES.get(environ).split(os.pathsep) if p.strip()]
    if not chosen:
        return [default_registry_path()]
    return [default_registry_path() if f.strip() in DEFAULT_TOKENS else f for f in chosen]


@attrs.frozen
class Assembly:
    """Files plus plugin fragments, loaded: the registry (None when there are problems), every
    problem of every source (unreadable ones included, plugin problems blamed) and the source
    names in layering order."""

    registry: Registry | None
    problems: tuple[Problem, ...]
    sources: tuple[str, ...]
    #: the sources themselves (files and fragments), for rebuilding a prefix of the layers
    layers: tuple[Source, ...] = ()

    @property
    def unreadable(self) -> bool:
        """Some source could not be read at all (a usage error, exit 2)."""
        return any(p.unreadable for p in self.problems)

    def checked(self) -> Registry:
        """The registry; raises `UnreadableSourceError` or `RegistryError` with every problem."""
        if self.unreadable:
            raise UnreadableSourceError(self.problems)
        if self.problems or self.registry is None:
            raise RegistryError(self.problems)
        return self.registry


def assemble_registry(
    files: Sequence[str] | None = None,
    fragments: Sequence[Fragment] = (),
    *,
    blame: Blame | None = None,
    environ: Mapping[str, str] = environment.PROCESS,
) -> Assembly:
    """Load the registry in use: `registry_sources` (``files``, else the environment, else the
    default), then ``fragments`` (collected by the caller, e.g. with
    `warpolicy.runtime.manager.collect_fragments`), with ``blame`` applied to the problems.

    Never raises for bad content; `Assembly.checked` does. Both the engine and ``validate``
    load through this one function.
    """
    sources: list[Source] = [*registry_sources(files, environ), *fragments]
    registry, problems = _load(sources)
    if blame is not None:
        problems = list(blame(problems))
    return Assembly(registry, tuple(problems), tuple(_name(s) for s in sources), tuple(sources))


def load_registry(sources: Sequence[Source]) -> Registry:
    """Load, layer and validate ``sources``.

    Raises `RegistryError` listing every problem, or `UnreadableSourceError` (a `RegistryError`
    and an `InputError`) when a source could not be read at all (missing, a directory, a FIFO
    or device, larger than `MAX_BYTES`).
    """
    registry, problems = _load(sources)
    return Assembly(registry, tuple(problems), ()).checked()


def validate_sources(sources: Sequence[Source]) -> list[Problem]:
    """Every problem of ``sources`` (empty when valid), unreadable sources included."""
    return _load(sources)[1]


def validate_warnings(sources: Sequence[Source]) -> list[Problem]:
    """What is valid in ``sources`` but hazardous (`warpolicy.registry.model.registry_warnings`:
    a per-batch router whose choice may change inside one forward); empty when they do not
    load (`validate_sources` reports that)."""
    registry, problems = _load(sources)
    return [] if registry is None or problems else registry_warnings(registry)


def document_problems(source: Source) -> list[Problem]:
    """The problems of one source on its own, before layering: what the JSON Schema
    (`warpolicy.registry.schema.registry_json_schema`) checks, found by the same stages that load it.
    References, cycles and redefinitions need the merged whole (`validate_sources`)."""
    problems: list[Problem] = []
    document = _read(source, problems)
    if document.root is not None:
        EntryBuilder(document.name, problems, 0).parse(document.root)
    return problems


def env_flag_problems(registry: Registry, environ: Mapping[str, str]) -> list[Problem]:
    """Environment variables of declared flags whose value is not a boolean, located at the
    flag (the engine would refuse them; ``validate`` reports them all at once). An empty or
    blank value counts as unset, as in the engine."""
    found = []
    for flag in registry.flags.values():
        for var in flag.env:
            raw = environment.lookup(var, environ)
            if not raw.strip():
                continue  # unset, empty or blank: the engine reads it as unset too
            try:
                parse_bool(raw, var)
            except InputError as exc:
                origin = flag.origin
                found.append(
                    Problem(
                        origin.file,
                        origin.line,
                        origin.col,
                        f"flags.{flag.name}: environment {exc}",
                    )
                )
    return found


# -- the pipeline -----------------------------------------------------------------------------


def _name(source: Source) -> str:
    return source.name if isinstance(source, Fragment) else os.fspath(source)


def _read(source: Source, problems: list[Problem]) -> Document:
    if isinstance(source, Fragment):
        document = compose_fragment(source)
        problems.extend(document.problems)
        return document
    if not isinstance(source, (str, os.PathLike)):
        raise InputError(f"not a registry source: {source!r} (expected a path or a Fragment)")
    name = os.fspath(source)
    data = reading.read_file(name, problems)
    text = None if data is None else reading.decode(name, data, problems)
    return Document(name, None if text is None else reading.compose(name, text, problems))


def _load(sources: Sequence[Source]) -> tuple[Registry | None, list[Problem]]:
    if isinstance(sources, (str, bytes, os.PathLike, Fragment)):
        sources = [sources]  # a lone path is an easy mistake
    problems: list[Problem] = []
    merger = Merger(problems)
    names: list[str] = []
    for index, source in enumerate(sources):
        document = _read(source, problems)
        names.append(document.name)
        if document.root is not None:
            parsed = EntryBuilder(document.name, problems, index).parse(document.root)
            if parsed is not None:
                merger.add(parsed)
    merger.check()
    order = {n: i for i, n in enumerate(names)}
    problems.sort(key=lambda p: (order.get(p.file, len(order)), p.line, p.col))
    return merger.build(names), problems
