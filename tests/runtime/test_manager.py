"""Plugin autoload off: ``WARPOLICY_DISABLE_PLUGIN_AUTOLOAD`` and ``warpolicy
--disable-plugin-autoload`` keep installed (entry-point) plugins out, built-ins in."""

from __future__ import annotations

import json
import sys

import pytest

from warpolicy.cli.main import ExitCode, main
from warpolicy.errors import InputError, PluginError
from warpolicy.runtime import manager
from warpolicy.runtime.manager import autoload_disabled, new_plugin_manager

BROKEN = "raise ImportError('needs a library that is not installed')\n"
WORKING = "def warpolicy_capabilities():\n    return None\n"


@pytest.fixture
def installed(tmp_path, monkeypatch):
    """Two installed distributions on sys.path: a working plugin and one that cannot import."""
    for name, source in (("wp_auto_ok", WORKING), ("wp_auto_broken", BROKEN)):
        info = tmp_path / f"{name}-0.1.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1\n")
        (info / "entry_points.txt").write_text(f"[warpolicy]\n{name} = {name}\n")
        (tmp_path / f"{name}.py").write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delenv("WARPOLICY_DISABLE_PLUGIN_AUTOLOAD", raising=False)
    manager.reset_plugin_manager()
    yield tmp_path
    manager.reset_plugin_manager()
    for name in ("wp_auto_ok", "wp_auto_broken"):
        sys.modules.pop(name, None)


def test_autoload_loads_installed_plugins(installed):
    with pytest.raises(PluginError, match="wp_auto_broken"):
        new_plugin_manager(environ={})
    pm = new_plugin_manager(environ={"WARPOLICY_DISABLE_PLUGINS": "wp_auto_broken"})
    assert pm.has_plugin("wp_auto_ok")


@pytest.mark.parametrize("value", ["1", "true", "YES", " on "])
def test_the_variable_keeps_installed_plugins_out(installed, value):
    pm = new_plugin_manager(environ={"WARPOLICY_DISABLE_PLUGIN_AUTOLOAD": value})
    assert not pm.has_plugin("wp_auto_ok") and not pm.has_plugin("wp_auto_broken")
    assert pm.has_plugin("cuda") and pm.has_plugin("sim")  # built-ins still register


@pytest.mark.parametrize("value", ["", "  ", "0", "off"])
def test_unset_or_false_autoloads(value):
    assert not autoload_disabled({"WARPOLICY_DISABLE_PLUGIN_AUTOLOAD": value})
    assert not autoload_disabled({})


def test_a_value_that_is_not_a_boolean_is_refused_by_name():
    with pytest.raises(InputError, match="WARPOLICY_DISABLE_PLUGIN_AUTOLOAD='maybe'"):
        new_plugin_manager(environ={"WARPOLICY_DISABLE_PLUGIN_AUTOLOAD": "maybe"})


def test_the_cli_switch_keeps_them_out_for_one_command(installed, capsys):
    assert main(["plugins", "--format", "json"]) == ExitCode.USAGE  # the broken one loads
    capsys.readouterr()
    assert main(["--disable-plugin-autoload", "plugins", "--format", "json"]) == ExitCode.OK
    names = {row["name"] for row in json.loads(capsys.readouterr().out)["rows"]}
    assert names == {"cuda", "sim"}
    assert main(["plugins", "--format", "json"]) == ExitCode.USAGE  # the next command loads again


def test_the_variable_reaches_the_cli(installed, capsys, monkeypatch):
    monkeypatch.setenv("WARPOLICY_DISABLE_PLUGIN_AUTOLOAD", "1")
    assert main(["query", "--backend", "fa3", "--mode", "decode"]) == ExitCode.OK
