"""`warpolicy.bench.command`: a benchmark's declaration becomes its subcommand; a subcommand
with variants picks by selector and refuses, from the declarations alone, an option the picked
variant does not read; the one text/JSON switch."""

from __future__ import annotations

import argparse
import json

import pytest

from warpolicy.bench.command import Report, Variant, option, render, targets_line, variants
from warpolicy.cli.common import Parser
from warpolicy.errors import InputError


def _toy(seen: list):
    def measure(name):
        def run(args):
            seen.append((name, dict(vars(args))))
            return Report({"variant": name}, lambda r: f"ran {r['variant']}")

        return run

    return variants(
        "toy",
        "a toy",
        (option("--size", default=3, type=int), option("--shared-only", default="s")),
        (
            Variant("--alt", (option("--alt", default=False, action="store_true"),
                              option("--alt-knob", default=7, type=int)),
                    frozenset({"size"}), measure("alt"), refusal="belongs elsewhere"),
            Variant(None, (option("--plain-knob", default=1.5, type=float),),
                    frozenset({"size", "shared_only"}), measure("plain")),
        ),
    )  # fmt: skip


def _parse(bench, argv):
    parser = Parser(prog="toy")
    bench.add_options(parser)
    return parser.parse_args(argv)


@pytest.mark.parametrize(
    "argv, picked, values",
    [
        ([], "plain", {"size": 3, "shared_only": "s", "plain_knob": 1.5}),
        (["--size", "5", "--plain-knob", "2"], "plain", {"size": 5, "plain_knob": 2.0}),
        (["--alt"], "alt", {"alt": True, "alt_knob": 7, "size": 3}),
        (["--alt", "--alt-knob", "9", "--size", "1"], "alt", {"alt_knob": 9, "size": 1}),
    ],
)
def test_the_selector_picks_the_variant_and_the_declared_defaults_are_filled(argv, picked, values):
    seen: list = []
    bench = _toy(seen)
    report = bench.measure(_parse(bench, argv))
    assert report is not None and report.render("text") == f"ran {picked}"
    name, args = seen[0]
    assert name == picked and values.items() <= args.items()


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--alt-knob", "2"], "bench toy: --alt-knob only applies with --alt"),
        (["--alt", "--plain-knob", "2"], "bench toy --alt: --plain-knob belongs elsewhere"),
        (["--alt", "--shared-only", "x"], "bench toy --alt: --shared-only belongs elsewhere"),
        # given explicitly, even at its default value, is given
        (["--alt", "--plain-knob", "1.5"], "--plain-knob belongs elsewhere"),
    ],
)
def test_an_option_the_picked_variant_does_not_read_is_one_line(argv, message):
    seen: list = []
    bench = _toy(seen)
    with pytest.raises(InputError) as caught:
        bench.measure(_parse(bench, argv))
    assert message in str(caught.value) and "\n" not in str(caught.value)
    assert seen == []  # refused before anything ran


def test_render_is_the_one_text_json_switch():
    result = {"a": 1}
    assert json.loads(render(result, "json", str)) == {"schema_version": 1, "a": 1}
    assert render(result, "text", lambda r: "table") == "table"
    with pytest.raises(InputError, match="unknown format 'xml'"):
        render(result, "xml", str)
    assert targets_line({"x": True, "y": False}) == "targets: x=yes, y=NO"


def test_every_declared_bench_option_reaches_the_parser():
    from warpolicy.cli.bench import BENCHMARKS

    for bench in BENCHMARKS:
        parser = argparse.ArgumentParser()
        bench.add_options(parser)
        usage = parser.format_help()
        assert all(flag in usage for one in bench.options for flag in one.flags), bench.name
