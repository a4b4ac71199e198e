"""How a benchmark becomes a ``warpolicy bench`` subcommand: it declares one `Benchmark`.

A benchmark module declares its subcommand's name and help, its own options (`Option`, each
declared once, by the module that reads it) and how it measures from the parsed options
(``measure``: a `Report`, the result and its text form, or None when this process prints
nothing, e.g. a torchrun rank other than 0). The CLI (`warpolicy.cli.bench`) adds every
declared benchmark with ``--format text|json`` and prints `Report.render`: the one place the
output switches between text and JSON.

A subcommand with variants (``bench overlap``: the synthetic decode, ``--tp N``,
``--spec-step``, ``--factory``) is `variants`: each `Variant` is declared by its own module
with the option that selects it, its own options and the shared ones it reads; an option given
to a variant that does not read it is one usage line derived from those declarations (no
option is checked against another by hand). Adding an option to a variant is one `Option` in
its ``options`` (or a shared option's dest in its ``reads``); adding a variant is one `Variant`
in the subcommand's list.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import attrs

from warpolicy.errors import InputError
from warpolicy.registry.report import json_document

#: What a ``--device`` option of a GPU benchmark accepts: ``sim`` is the simulated platform
#: (``fake``: its 0.1 name).
DEVICES = ("cuda", "sim", "fake")


@attrs.frozen
class Option:
    """One command-line option: ``parser.add_argument(*flags, default=default, **settings)``."""

    flags: tuple[str, ...]
    default: Any = None
    settings: Mapping[str, Any] = attrs.field(factory=dict)
    #: the ``--help`` section it is listed in (None: the subcommand's own options)
    section: str | None = None

    def add(self, parser: Any, default: Any) -> argparse.Action:
        """Add it to ``parser`` (a parser or an argument group) with ``default``."""
        action: argparse.Action = parser.add_argument(*self.flags, default=default, **self.settings)
        return action


def option(*flags: str, default: Any = None, **settings: Any) -> Option:
    """`Option` with argparse's keyword arguments (``type``, ``help``, ``action``...)."""
    return Option(tuple(flags), default, settings)


def device_option(
    help: str = "cuda (default) or sim: the simulated platform, tiny and "
    "host-timed (exercises the code path; numbers meaningless)",
) -> Option:
    """``--device``: every GPU benchmark's."""
    return option("--device", choices=DEVICES, help=help)


@attrs.frozen
class Report:
    """A benchmark's result and its text form (``text(result)``)."""

    result: dict
    text: Callable[[dict], str]

    def render(self, fmt: str) -> str:
        """``text``, or ``json`` (the result, ``schema_version`` first, like every JSON output)."""
        return render(self.result, fmt, self.text)


def render(result: dict, fmt: str, text: Callable[[dict], str]) -> str:
    """The one text/JSON switch of every benchmark's output."""
    if fmt == "json":
        return json_document(result)
    if fmt != "text":
        raise InputError(f"unknown format {fmt!r}; use text or json")
    return text(result)


def targets_line(targets: Mapping[str, bool]) -> str:
    """The ``targets: name=yes, ...`` line that ends every benchmark's text."""
    return "targets: " + ", ".join(f"{k}={'yes' if v else 'NO'}" for k, v in targets.items())


@attrs.frozen
class Benchmark:
    """One ``warpolicy bench`` subcommand."""

    name: str
    help: str
    options: tuple[Option, ...]
    measure: Callable[[argparse.Namespace], Report | None]
    #: whether it needs torch (the CLI imports it first, quietly; without it: one line)
    torch: bool = True

    def add_options(self, parser: argparse.ArgumentParser) -> None:
        sections: dict[str, Any] = {}
        for one in self.options:
            target: Any = parser
            if one.section is not None:
                if one.section not in sections:
                    sections[one.section] = parser.add_argument_group(one.section)
                target = sections[one.section]
            one.add(target, one.default)


@attrs.frozen(eq=False)  # compared and hashed by identity: one declaration, one variant
class Variant:
    """One variant of a subcommand with variants (see the module docstring)."""

    #: the flag of the option that selects it (None: the default variant)
    selector: str | None
    #: what it measures, for ``--help`` (its options' section)
    title: str
    #: its own options (the selecting one first)
    options: tuple[Option, ...]
    #: the dests of the subcommand's shared options it reads
    reads: frozenset[str]
    measure: Callable[[argparse.Namespace], Report | None]
    #: what a refused option is told (after the option names); None: "is not supported with"
    #: the selector
    refusal: str | None = None


def variants(
    name: str, help: str, shared: Sequence[Option], members: Sequence[Variant]
) -> Benchmark:
    """One subcommand whose ``members`` pick by their selectors (the first given wins; none:
    the member without one). Options are parsed without defaults, so "given" is exact; the
    declared defaults are filled in once the picked member is known."""
    default = next(m for m in members if m.selector is None)
    declared: list[tuple[Option, frozenset[Variant]]] = []
    for one in shared:
        dest = _dest(one)
        declared.append((one, frozenset(m for m in members if dest in m.reads)))
    for member in members:
        section = f"{member.title} ({member.selector or 'the default'})"
        declared += [
            (attrs.evolve(one, section=section), frozenset({member})) for one in member.options
        ]

    def measure(args: argparse.Namespace) -> Report | None:
        given = {_dest(one): one for one, _ in declared if hasattr(args, _dest(one))}
        picked = next(
            (m for m in members if m.selector is not None and _dest_of(m.selector) in given),
            default,
        )
        refused = [
            one.flags[0]
            for one, readers in declared
            if _dest(one) in given and picked not in readers
        ]
        if refused:
            raise InputError(_refusal(name, picked, refused, declared))
        for one, _ in declared:
            if not hasattr(args, _dest(one)):
                setattr(args, _dest(one), one.default)
        return picked.measure(args)

    return Benchmark(
        name,
        help,
        tuple(attrs.evolve(one, default=argparse.SUPPRESS) for one, _ in declared),
        measure,
    )


def _refusal(
    name: str,
    picked: Variant,
    refused: Sequence[str],
    declared: Sequence[tuple[Option, frozenset[Variant]]],
) -> str:
    options = ", ".join(refused)
    if picked.selector is None:
        readers = {
            m.selector for one, members in declared if one.flags[0] in refused for m in members
        }
        return f"bench {name}: {options} only applies with {' or '.join(sorted(filter(None, readers)))}"
    why = picked.refusal or f"is not supported with {picked.selector}"
    return f"bench {name} {picked.selector}: {options} {why}"


def _dest(one: Option) -> str:
    return str(one.settings.get("dest") or _dest_of(one.flags[0]))


def _dest_of(flag: str) -> str:
    return flag.lstrip("-").replace("-", "_")
