"""``env``: every environment variable warpolicy reads (`warpolicy.environment`), the flags'
variables the registry in use declares, and what this shell sets them to.

``--format markdown`` prints docs/environment.md exactly (``scripts/gen-env-docs`` writes it;
tests/cli/test_variables.py fails while the file is stale): the page is generated, never
edited by hand.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from warpolicy import environment
from warpolicy.cli import common
from warpolicy.cli.common import ExitCode
from warpolicy.cli.layout import add_wide, output_width
from warpolicy.registry.engine import PolicyEngine
from warpolicy.registry.loader import default_registry_path
from warpolicy.registry.model import Flag
from warpolicy.registry.report import render_table

#: Section titles of the generated page, per `environment.Variable.owner`.
SECTIONS = {
    "warpolicy": "warpolicy",
    "warpolicy-metrics": "The metrics plugin (plugins/warpolicy-metrics)",
    "warpolicy-trace": "The trace plugin (plugins/warpolicy-trace)",
    "external": "Other tools' variables warpolicy honours",
}

PAGE_HEAD = """\
<!-- Generated from warpolicy/environment.py and capabilities.yaml by scripts/gen-env-docs
     (warpolicy env --format markdown): edit those, then regenerate; never edit this file. -->

# Environment variables

Every variable warpolicy and the plugins in this repository read, where they are read, and what
unset means. `warpolicy env` prints the same list with the values your shell sets.
Switches take `1/true/yes/on` or `0/false/no/off` (any case); an empty value counts as unset.
"""

FLAGS_HEAD = """\
## Flags of the packaged registry

A registry declares its flags' variables (`env:` in `capabilities.yaml`); the first one set
wins, and a name marked `not:` sets the flag to the opposite of its value. Your own registry
files may add more: `warpolicy env --capabilities FILE` lists them. `--flag NAME=VALUE` sets a
flag for one query.
"""


def add_commands(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "env", help="the environment variables warpolicy reads, and their values here"
    )
    common.add_registry_args(p)
    common.add_format(p)
    add_wide(p)
    p.set_defaults(handler=cmd_env)


def cmd_env(args: argparse.Namespace) -> int:
    if args.format == "markdown":
        common.out(markdown_page(flag_list(args.capabilities)))
        return ExitCode.OK
    flags = flag_list(args.capabilities)
    header = ("name", "value here", "default", "read by", "meaning")
    rows: list[tuple[str, ...]] = [
        (v.name, _shown(v.get()) if v.is_set() else "-", v.default, v.read_by, v.meaning)
        for v in environment.variables()
    ]
    for flag in flags:
        for var in flag.env:
            value = environment.lookup(var)
            rows.append(
                (
                    var,
                    _shown(value) if value else "-",
                    _flag_default(flag),
                    "registry",
                    _flag_doc(flag, var),
                )
            )
    records = [
        {
            "name": name,
            "set": value != "-",
            "value": value if value != "-" else None,
            "default": default,
            "read_by": read_by,
            "meaning": meaning,
        }
        for name, value, default, read_by, meaning in rows
    ]
    common.out(render_table(header, rows, args.format, records, width=output_width(args.wide)))
    return ExitCode.OK


def flag_list(files: Sequence[str] | None) -> list[Flag]:
    """The flags of the registry ``files`` (default: the packaged registry alone, whatever
    $WARPOLICY_CAPABILITIES says, so the generated page does not depend on the shell)."""
    chosen = list(files) if files else [str(default_registry_path())]
    registry = PolicyEngine.load(chosen, environ={}).registry
    return sorted(registry.flags.values(), key=lambda f: f.name)


def _shown(value: str) -> str:
    return repr(value) if value != value.strip() or not value else value


def _flag_default(flag: Flag) -> str:
    return "on" if flag.default else "off"


def _flag_doc(flag: Flag, var: str) -> str:
    inverted = " (inverted: true turns it off)" if var in flag.inverted else ""
    return f"flag `{flag.name}`{inverted}: {flag.doc}".rstrip(": ")


def markdown_page(flags: Sequence[Flag]) -> str:
    """docs/environment.md: the variables per owner, then the packaged registry's flags."""
    parts = [PAGE_HEAD]
    for owner, title in SECTIONS.items():
        chosen = [v for v in environment.variables() if v.owner == owner]
        if not chosen:
            continue
        parts.append(f"## {title}\n")
        parts.append(
            render_table(
                ("variable", "meaning", "unset means", "read by"),
                [(f"`{v.name}`", v.meaning, v.default, f"`{v.read_by}`") for v in chosen],
                "markdown",
            )
            + "\n"
        )
    parts.append(FLAGS_HEAD)
    parts.append(
        render_table(
            ("variable", "flag", "unset means", "meaning"),
            [
                (
                    f"`{var}`" + (" (`not:`)" if var in flag.inverted else ""),
                    f"`{flag.name}`",
                    _flag_default(flag),
                    flag.doc,
                )
                for flag in flags
                for var in flag.env
            ],
            "markdown",
        )
        + "\n"
    )
    return "\n".join(parts)
