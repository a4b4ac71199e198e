"""Entry-point plugins: the warpolicy-trace package seen as an installed distribution (simulated
with dist-info metadata on sys.path), broken entry points, and disabling them."""

from __future__ import annotations

import json
import pathlib
import shutil
import sys

import pytest

from warpolicy.errors import PluginError
from warpolicy.registry.vocabulary import WarReadDonePolicy as P
from warpolicy.runtime.fence import ReadDoneFence, SchedulerBarrier
from warpolicy.runtime.manager import (
    collect_fragments,
    describe_plugins,
    new_plugin_manager,
    open_platform,
    reset_plugin_manager,
)
from warpolicy.runtime.release import BucketRelease

TRACE_SRC = pathlib.Path(__file__).resolve().parents[1] / "warpolicy_trace"


def add_distribution(
    root: pathlib.Path,
    dist: str,
    version: str,
    entry_points: dict[str, str],
    modules: dict[str, str] | None = None,
) -> None:
    """Write ``<dist>-<version>.dist-info`` with METADATA and entry_points.txt under ``root``,
    plus the given top-level modules (name -> source)."""
    info = root / f"{dist.replace('-', '_')}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
    lines = ["[warpolicy]"] + [f"{name} = {value}" for name, value in entry_points.items()]
    (info / "entry_points.txt").write_text("\n".join(lines) + "\n")
    for name, source in (modules or {}).items():
        (root / f"{name}.py").write_text(source)


@pytest.fixture
def site(tmp_path, monkeypatch):
    """A fresh directory on sys.path; modules imported from it are forgotten afterwards."""
    root = tmp_path / "site"
    root.mkdir()
    before = set(sys.modules)
    monkeypatch.syspath_prepend(str(root))
    monkeypatch.delenv("WARPOLICY_TRACE_FILE", raising=False)
    reset_plugin_manager()
    yield root
    reset_plugin_manager()
    for name in set(sys.modules) - before:
        if name.startswith(("warpolicy_trace", "wp_sim_")):
            del sys.modules[name]


@pytest.fixture
def trace_dist(site):
    shutil.copytree(TRACE_SRC, site / "warpolicy_trace")
    add_distribution(site, "warpolicy-trace-sim", "0.1", {"trace": "warpolicy_trace"})
    return site


def test_trace_distribution_is_loaded_and_described(trace_dist):
    pm = new_plugin_manager(environ={})
    plugin = pm.get_plugin("trace")
    assert plugin is not None and plugin.__name__ == "warpolicy_trace"
    assert pathlib.Path(plugin.__file__).is_relative_to(trace_dist)
    row = next(r for r in describe_plugins(pm) if r["name"] == "trace")
    assert row["source"] == "distribution:warpolicy-trace-sim"
    assert row["version"] == "0.1"
    assert row["entry_point"] == "warpolicy:trace = warpolicy_trace"
    assert row["hooks"] == [
        "warpolicy_on_barrier",
        "warpolicy_on_decision",
        "warpolicy_on_fallback",
        "warpolicy_on_publish",
    ]


def test_trace_plugin_writes_a_chrome_trace(trace_dist, tmp_path, monkeypatch):
    pm = new_plugin_manager(environ={})
    trace = pm.get_plugin("trace")
    trace.TRACER.clear()
    platform = open_platform(pm, "sim")
    fence = ReadDoneFence(platform, name="decode", observers=pm.observers)
    event = fence.prepare()
    graph = platform.new_graph()
    with platform.capture(graph):
        planted = fence.plant(event)
    barrier, sched = SchedulerBarrier(platform, observers=pm.observers), platform.new_stream()
    for policy in (P.IN_GRAPH, P.NONE):
        release = BucketRelease("decode", 1, policy, planted if policy is P.IN_GRAPH else None)
        fence.before_replay(release)
        platform.replay(graph)
        fence.after_replay(release)
        barrier.apply(sched, platform.current_stream(), fence.take())
    pm.hook.warpolicy_on_decision(decision=P.IN_GRAPH, where="engine")
    out = tmp_path / "trace.json"
    monkeypatch.setenv("WARPOLICY_TRACE_FILE", str(out))
    assert trace.flush() == str(out)
    doc = json.loads(out.read_text())
    names = [e["name"] for e in doc["traceEvents"] if e["ph"] == "i"]
    assert names == [
        "publish in_graph",
        "barrier event",
        "publish none",
        "barrier coarse",
        "decide in_graph",
    ]
    tracks = {e["args"]["name"] for e in doc["traceEvents"] if e["ph"] == "M"}
    assert tracks == {"runner:decode", "scheduler", "decisions:engine"}


def test_trace_flush_without_a_path_writes_nothing(trace_dist):
    pm = new_plugin_manager(environ={})
    assert pm.get_plugin("trace").flush() is None


def test_cli_lists_the_distribution(trace_dist, capsys):
    from warpolicy.cli.main import main

    assert main(["plugins", "--format", "json"]) == 0
    out = capsys.readouterr().out
    rows = {r["name"]: r for r in json.loads(out)["rows"]}
    assert rows["trace"]["source"] == "distribution:warpolicy-trace-sim"
    assert rows["cuda"]["source"] == "builtin" and rows["sim"]["source"] == "builtin"


# -- broken plugins --------------------------------------------------------------------------------

BROKEN_IMPORT = "raise ImportError('needs a library that is not installed')\n"
BAD_FRAGMENT = """\
import pluggy
hookimpl = pluggy.HookimplMarker("warpolicy")

@hookimpl
def warpolicy_capabilities():
    return "backends: {unclosed\\n"
"""


def test_plugin_failing_to_import_is_one_clear_line(site):
    add_distribution(
        site, "wp-broken", "1.0", {"broken": "wp_sim_broken"}, {"wp_sim_broken": BROKEN_IMPORT}
    )
    with pytest.raises(PluginError) as info:
        new_plugin_manager(environ={})
    text = str(info.value)
    assert "\n" not in text
    assert "plugin 'broken'" in text
    assert "entry point warpolicy:broken = wp_sim_broken" in text
    assert "failed to import: ImportError: needs a library" in text
    assert text.endswith("disable it with WARPOLICY_DISABLE_PLUGINS=broken")


def test_disabled_broken_plugin_is_not_imported(site):
    add_distribution(
        site, "wp-broken", "1.0", {"broken": "wp_sim_broken"}, {"wp_sim_broken": BROKEN_IMPORT}
    )
    pm = new_plugin_manager(environ={"WARPOLICY_DISABLE_PLUGINS": "broken"})
    assert "wp_sim_broken" not in sys.modules
    row = next(r for r in describe_plugins(pm) if r["name"] == "broken")
    assert row == {
        "name": "broken",
        "version": "1.0",
        "source": "distribution:wp-broken",
        "hooks": [],
        "entry_point": "warpolicy:broken = wp_sim_broken",
        "status": "disabled",
    }


def test_invalid_fragment_names_plugin_and_entry_point(site):
    add_distribution(
        site, "wp-badfrag", "2.0", {"badfrag": "wp_sim_badfrag"}, {"wp_sim_badfrag": BAD_FRAGMENT}
    )
    pm = new_plugin_manager(environ={})
    with pytest.raises(PluginError) as info:
        collect_fragments(pm)
    text = str(info.value)
    assert "plugin 'badfrag' (entry point warpolicy:badfrag = wp_sim_badfrag)" in text
    assert "invalid YAML" in text and "\n" not in text
    pm = new_plugin_manager(environ={"WARPOLICY_DISABLE_PLUGINS": "badfrag"})
    assert collect_fragments(pm) == []


def test_cli_exits_2_with_one_line_for_a_broken_plugin(site, capsys, monkeypatch):
    from warpolicy.cli.main import main

    add_distribution(
        site, "wp-broken", "1.0", {"broken": "wp_sim_broken"}, {"wp_sim_broken": BROKEN_IMPORT}
    )
    assert main(["plugins"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "WARPOLICY_DISABLE_PLUGINS=broken" in err
    monkeypatch.setenv("WARPOLICY_DISABLE_PLUGINS", "broken")
    reset_plugin_manager()
    assert main(["plugins"]) == 0


def test_entry_point_named_like_a_builtin_is_refused(site):
    add_distribution(site, "wp-clash", "1.0", {"sim": "wp_sim_clash"}, {"wp_sim_clash": ""})
    with pytest.raises(PluginError, match="clashes with the builtin plugin 'sim'"):
        new_plugin_manager(environ={})


INVALID_HOOK = """\
import pluggy
hookimpl = pluggy.HookimplMarker("warpolicy")

@hookimpl
def warpolicy_on_publish(runner, bogus):
    return None
"""


def test_invalid_hook_implementation_is_one_line(site):
    # pluggy's validation message spans several lines; the error must still be one
    add_distribution(
        site, "wp-badhook", "1.0", {"badhook": "wp_sim_badhook"}, {"wp_sim_badhook": INVALID_HOOK}
    )
    with pytest.raises(PluginError) as info:
        new_plugin_manager(environ={})
    text = str(info.value)
    assert "\n" not in text and "invalid hook implementation" in text and "bogus" in text
    assert text.endswith("WARPOLICY_DISABLE_PLUGINS=badhook")


def test_two_entry_points_naming_one_module_is_a_plugin_error(site):
    add_distribution(
        site,
        "wp-twice",
        "1.0",
        {"one": "wp_sim_twice", "two": "wp_sim_twice"},
        {"wp_sim_twice": ""},
    )
    with pytest.raises(PluginError) as info:  # was a ValueError traceback from pluggy
        new_plugin_manager(environ={})
    text = str(info.value)
    assert "\n" not in text and "plugin 'two'" in text and "already registered plugin 'one'" in text
    assert (
        new_plugin_manager(environ={"WARPOLICY_DISABLE_PLUGINS": "two"}).get_plugin("one")
        is not None
    )


def test_plugin_calling_sys_exit_on_import_is_a_plugin_error(site):
    add_distribution(
        site, "wp-exit", "1.0", {"exits": "wp_sim_exit"}, {"wp_sim_exit": "raise SystemExit(3)\n"}
    )
    with pytest.raises(PluginError, match="failed to import: SystemExit: 3"):
        new_plugin_manager(environ={})


@pytest.mark.parametrize(
    "entry_points_txt, metadata",
    [
        (
            "[warpolicy]\nnot an entry point\n",
            b"Metadata-Version: 2.1\nName: wp-junk\nVersion: 1\n",
        ),
        ("[warpolicy]\njunk = wp_sim_junk\n", b"\xff\xfe not utf-8"),
    ],
)
def test_distribution_with_unreadable_metadata_is_skipped_with_one_line(
    site, caplog, entry_points_txt, metadata
):
    info = site / "wp_junk-1.dist-info"
    info.mkdir()
    (info / "METADATA").write_bytes(metadata)
    (info / "entry_points.txt").write_text(entry_points_txt)
    with caplog.at_level("WARNING", logger="warpolicy"):
        pm = new_plugin_manager(environ={})  # was a traceback from importlib.metadata
    assert pm.get_plugin("sim") is not None
    (line,) = [r.getMessage() for r in caplog.records if "wp_junk" in r.getMessage()]
    assert "unreadable metadata" in line and "\n" not in line
