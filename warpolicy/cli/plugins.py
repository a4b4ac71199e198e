"""``plugins``: every plugin, where it comes from, its hooks, and the cells its registry
fragment makes earlier. A plugin whose fragment cannot be collected or does not load is shown
as ``broken`` with its error, and the command exits 2 (as ``query`` would)."""

from __future__ import annotations

import argparse

from warpolicy.cli import common
from warpolicy.cli.common import ExitCode
from warpolicy.cli.failure import Failure
from warpolicy.cli.layout import add_wide, output_width
from warpolicy.errors import PluginError
from warpolicy.registry.compare import LayerChange, earlier_layers
from warpolicy.registry.loader import Fragment, fragment_plugin, registry_sources, validate_sources
from warpolicy.registry.report import format_plugins
from warpolicy.runtime import manager


def add_commands(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("plugins", help="list plugins, their source and the hooks they implement")
    common.add_format(p)
    add_wide(p)
    p.set_defaults(handler=cmd_plugins)


def cmd_plugins(args: argparse.Namespace) -> int:
    pm = common.plugin_manager()
    rows = manager.describe_plugins(pm)
    broken: dict[str, str] = {}
    layers: list[LayerChange] = []
    fragments: list[Fragment] = []
    try:
        fragments = manager.collect_fragments(pm)
    except PluginError as exc:
        broken[exc.plugin] = str(exc)
    if fragments and not broken:
        sources = [*registry_sources(), *fragments]
        problems = manager.blame_plugins(pm, validate_sources(sources))
        for problem in problems:
            name = fragment_plugin(problem.file)
            if name is not None:
                broken.setdefault(name, f"{problem}")
        if not broken:
            layers = earlier_layers(sources)
    for row in rows:
        if row["name"] in broken:
            row["status"] = "broken"
            row["error"] = broken[row["name"]]
    common.out(format_plugins(rows, args.format, layers, width=output_width(args.wide)))
    for name, message in broken.items():  # with --format json, one JSON error object each
        failure = Failure(
            "plugin",
            "warpolicy plugins",
            ExitCode.USAGE,
            f"warpolicy: {message}",
            message,
            location={"plugin": name},
        )
        common.err(failure.render(args.format == "json"))
    return ExitCode.USAGE if broken else ExitCode.OK
