"""The plugin manager: built-ins, disable/trace switches, fragment collection, description."""

from __future__ import annotations

import functools
import pathlib
import warnings

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import warpolicy
from warpolicy.errors import PluginError
from warpolicy.registry.loader import Fragment
from warpolicy.runtime import hookspecs
from warpolicy.runtime.hookspecs import hookimpl
from warpolicy.runtime.manager import (
    blame_plugins,
    collect_fragments,
    describe_plugins,
    get_plugin_manager,
    new_plugin_manager,
    observers_of,
    open_runtime,
    reset_plugin_manager,
)
from warpolicy.runtime.observers import Reporter

BACKEND_YAML = """\
version: 1
backends:
  {name}:
    inherits: base
    doc: A backend contributed by a plugin.
"""


def contributes(value):
    class Plugin:
        @hookimpl
        def warpolicy_capabilities(self):
            return value() if callable(value) else value

    return Plugin()


def test_builtins_are_ordinary_named_plugins(pm):
    import warpolicy.runtime.platforms.cuda
    from warpolicy.runtime.platforms.sim import SimPlugin

    assert pm.get_plugin("cuda") is warpolicy.runtime.platforms.cuda
    assert isinstance(pm.get_plugin("sim"), SimPlugin)
    assert pm.get_plugin("fake") is None  # "fake" is a device alias, not a plugin name


def test_disable_blocks_builtins_by_name():
    pm = new_plugin_manager(
        load_entry_points=False, environ={"WARPOLICY_DISABLE_PLUGINS": " sim , nope"}
    )
    assert pm.get_plugin("sim") is None and pm.is_blocked("sim")
    assert pm.get_plugin("cuda") is not None
    rows = {r["name"]: r for r in describe_plugins(pm)}
    assert rows["sim"]["status"] == "disabled" and rows["sim"]["hooks"] == []
    assert rows["sim"]["source"] == "builtin"
    assert rows["cuda"]["status"] == "active"


def test_trace_hooks_writes_hook_calls_to_stderr(capsys):
    pm = new_plugin_manager(load_entry_points=False, environ={"WARPOLICY_TRACE_HOOKS": "1"})
    pm.hook.warpolicy_platform(device="sim")
    assert "warpolicy_platform" in capsys.readouterr().err


def test_no_trace_by_default(capsys, pm):
    pm.hook.warpolicy_platform(device="sim")
    assert capsys.readouterr().err == ""


def test_default_manager_is_cached_until_reset():
    reset_plugin_manager()
    try:
        first = get_plugin_manager()
        assert get_plugin_manager() is first
        reset_plugin_manager()
        assert get_plugin_manager() is not first
    finally:
        reset_plugin_manager()


def test_describe_plugins_lists_builtins_with_hooks(pm):
    rows = describe_plugins(pm)
    assert [r["name"] for r in rows] == sorted(r["name"] for r in rows)
    sim = next(r for r in rows if r["name"] == "sim")
    assert sim["source"] == "builtin" and sim["version"] == warpolicy.__version__
    assert sim["hooks"] == ["warpolicy_platform"]
    assert set(sim) >= {"name", "version", "source", "hooks"}


def test_describe_hand_registered_plugin(pm, register):
    register(contributes(None), "inline")
    row = next(r for r in describe_plugins(pm) if r["name"] == "inline")
    assert row["source"] == "registered" and row["hooks"] == ["warpolicy_capabilities"]


def test_typo_hook_is_a_plugin_error():
    class Typo:
        @hookimpl
        def warpolicy_capabilitys(self):
            return None

    from warpolicy.runtime.manager import _check_pending

    pm = new_plugin_manager(load_entry_points=False, environ={})
    pm.register(Typo(), name="typo")
    try:
        with pytest.raises(PluginError, match="typo"):
            _check_pending(pm)
    finally:
        pm.unregister(name="typo")


# -- the removed 0.1 platform hooks -----------------------------------------------------------------


@pytest.mark.parametrize("hook", hookspecs.REMOVED_PLATFORM_HOOKS)
def test_a_plugin_with_a_removed_platform_hook_is_refused_naming_the_new_one(pm, hook):
    plugin = type("Old", (), {hook: hookimpl(lambda self, device: None)})()
    with pytest.raises(PluginError) as info:
        pm.register(plugin, name="old")
    text = str(info.value)
    assert "\n" not in text and text.startswith("plugin 'old'") and hook in text
    assert "warpolicy_platform(device)" in text and "WARPOLICY_DISABLE_PLUGINS=old" in text
    assert pm.get_plugin("old") is None


def test_a_blocked_old_plugin_is_not_refused(pm):
    class Old:
        @hookimpl
        def warpolicy_create_event(self, device, external):
            return None

    pm.set_blocked("old")
    assert pm.register(Old(), name="old") is None


# -- observers: pluggy's own calls, one per implementation ---------------------------------------


class Seen:
    def __init__(self):
        self.calls = []

    @hookimpl
    def warpolicy_on_publish(self, runner, step, policy, event):
        self.calls.append(("publish", runner, step, policy, event))

    @hookimpl
    def warpolicy_on_barrier(self, kind, runner):  # a subset, in another order
        self.calls.append(("barrier", kind, runner))


def test_without_observers_every_tuple_is_empty(pm):
    obs = observers_of(pm)
    assert (obs.on_decision, obs.on_publish, obs.on_barrier, obs.on_fallback) == ((), (), (), ())
    assert obs is pm.observers


def test_observer_calls_follow_register_and_unregister(pm):
    obs = observers_of(pm)
    seen = Seen()
    pm.register(seen, name="seen")
    assert len(obs.on_publish) == 1 and len(obs.on_barrier) == 1 and obs.on_fallback == ()
    reporter = Reporter(obs, "test")
    reporter.publish("decode", 3, "p", "ev")
    reporter.barrier("decode", 3, "event", "in_graph")
    assert seen.calls == [("publish", "decode", 3, "p", "ev"), ("barrier", "event", "decode")]
    assert obs.on_barrier[0].plugin == "seen"
    pm.unregister(name="seen")
    assert obs.on_publish == () and obs.on_barrier == ()


def test_observers_are_called_in_pluggys_order(pm):
    order = []

    def observer(tag, **opts):
        class O:
            @hookimpl(**opts)
            def warpolicy_on_fallback(self, where, error):
                order.append(tag)

        return O()

    pm.register(observer("first-registered"))
    pm.register(observer("last-registered"))
    pm.register(observer("trylast", trylast=True))
    with pytest.warns(RuntimeWarning, match="x failed"):
        Reporter(observers_of(pm), "test").fallback("x", RuntimeError())
    pluggy_order = []
    order, pluggy_order = pluggy_order, order
    pm.hook.warpolicy_on_fallback(where="x", error=RuntimeError())
    assert pluggy_order == order == ["last-registered", "first-registered", "trylast"]


def test_monitoring_sees_every_observer_call_and_wrappers_wrap_them_all(pm):
    seen = Seen()
    pm.register(seen)
    monitored = []
    undo = pm.add_hookcall_monitoring(
        lambda name, impls, kwargs: monitored.append(name), lambda *a: None
    )
    reporter = Reporter(observers_of(pm), "test")
    reporter.publish("decode", 1, "p", None)
    undo()
    assert monitored == ["warpolicy_on_publish"]

    class Wrapper:
        @hookimpl(wrapper=True)
        def warpolicy_on_publish(self):
            result = yield
            seen.calls.append("wrapped")
            return result

    pm.register(Wrapper(), name="wrapper")
    assert len(observers_of(pm).on_publish) == 1  # the whole hook, once: the wrapper wraps it
    reporter.publish("decode", 2, "p", None)
    assert seen.calls == [
        ("publish", "decode", 1, "p", None),
        ("publish", "decode", 2, "p", None),
        "wrapped",
    ]


ARGS = {
    "warpolicy_on_decision": {"decision": "d", "where": "w"},
    "warpolicy_on_publish": {"runner": "r", "step": 7, "policy": "p", "event": "e"},
    "warpolicy_on_barrier": {"runner": "r", "step": 7, "kind": "k", "reason": "why"},
    "warpolicy_on_fallback": {"where": "w", "error": "err"},
    "warpolicy_on_demotion": {"runner": "r", "bucket": 2, "reason": "why"},
}


def _observer(tag, hook, params, defaulted, log):
    """An observer of ``hook`` naming ``params``; those in ``defaulted`` have a default."""
    args = ", ".join(f"{p}='default'" if p in defaulted else p for p in params)
    namespace = {}
    exec(
        f"def impl(self, {args}):\n    log.append((tag, dict(locals())))",
        {"log": log, "tag": tag},
        namespace,
    )
    impl = namespace["impl"]
    impl.__name__ = hook
    return type(f"O{tag}", (), {hook: hookimpl(impl)})()


@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_observers_receive_exactly_what_the_installed_pluggy_passes(data):
    """Issue 17 class 9: an implementation whose parameters have defaults gets the same
    arguments through the runtime as through ``pm.hook.<name>(...)`` (pluggy 1.5 and 1.7 differ
    here; the runtime follows whichever is installed)."""
    hook = data.draw(st.sampled_from(sorted(ARGS)))
    names = list(ARGS[hook])
    pm = new_plugin_manager(load_entry_points=False, environ={})
    log = []
    for tag in range(data.draw(st.integers(1, 3))):
        params = data.draw(st.lists(st.sampled_from(names), unique=True))
        defaulted = set(data.draw(st.lists(st.sampled_from(params or ["-"]), unique=True)))
        ordered = [p for p in params if p not in defaulted] + [p for p in params if p in defaulted]
        pm.register(_observer(tag, hook, ordered, defaulted, log), name=f"o{tag}")
    getattr(pm.hook, hook)(**ARGS[hook])
    through_pluggy, log[:] = list(log), []
    reporter = Reporter(pm.observers, "test")
    call = {
        "warpolicy_on_decision": lambda a: reporter.decision(a["decision"], a["where"]),
        "warpolicy_on_publish": lambda a: reporter.publish(
            a["runner"], a["step"], a["policy"], a["event"]
        ),
        "warpolicy_on_barrier": lambda a: reporter.barrier(
            a["runner"], a["step"], a["kind"], a["reason"]
        ),
        "warpolicy_on_fallback": lambda a: reporter.fallback(a["where"], a["error"]),
        "warpolicy_on_demotion": lambda a: reporter.demotion(a["runner"], a["bucket"], a["reason"]),
    }[hook]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        call(ARGS[hook])
    if hook == "warpolicy_on_fallback":  # the reporter names its component in ``where``
        # (a defaulted ``where`` keeps its default under pluggy 1.5: nothing to rename then)
        log = [
            (t, {k: ("w" if k == "where" and v != "default" else v) for k, v in a.items()})
            for t, a in log
        ]
    assert log == through_pluggy


def test_the_runtime_refuses_a_bare_pluggy_manager():
    import pluggy

    with pytest.raises(TypeError, match="new_plugin_manager"):
        observers_of(pluggy.PluginManager("warpolicy"))


def test_the_composition_root_builds_everything_once():
    rt = open_runtime("sim", load_entry_points=False, environ={})
    assert rt.observers is rt.pm.observers and rt.platform.name == "sim"


# -- fragments -------------------------------------------------------------------------------------


def test_fragments_are_sorted_by_plugin_name_not_registration_order(pm, register):
    register(contributes("version: 1\nflags: {}\n"), "zeta")
    register(contributes({"version": 1, "flags": {}}), "alpha")
    names = [f.name for f in collect_fragments(pm)]
    assert names == ["plugin:alpha", "plugin:zeta"]


def test_fragment_kinds_path_text_mapping_and_lists(pm, register, tmp_path):
    path = tmp_path / "frag.yaml"
    path.write_text(BACKEND_YAML.format(name="from_file"))
    register(
        contributes([path, BACKEND_YAML.format(name="from_text"), {"version": 1, "flags": {}}]),
        "multi",
    )
    frags = collect_fragments(pm)
    assert all(isinstance(f, Fragment) for f in frags)
    assert [f.name for f in frags] == [
        f"plugin:multi[0]:{path}",
        "plugin:multi[1]",
        "plugin:multi[2]",
    ]
    assert "from_file" in frags[0].data and "from_text" in frags[1].data
    assert frags[2].data == {"version": 1, "flags": {}}


def test_a_str_is_yaml_text_never_a_file_name(pm, register, tmp_path):
    path = tmp_path / "frag.yaml"
    path.write_text(BACKEND_YAML.format(name="x"))
    register(contributes(str(path)), "s")
    (frag,) = collect_fragments(pm)
    assert frag.data == str(path)


def test_no_result_contributes_nothing(pm, register):
    register(contributes(None), "quiet")
    assert collect_fragments(pm) == []


def test_invalid_yaml_is_one_plugin_error_line(pm, register):
    register(contributes("backends: [unclosed\n"), "broken")
    with pytest.raises(PluginError) as info:
        collect_fragments(pm)
    text = str(info.value)
    assert "\n" not in text
    assert (
        "'broken'" in text and "invalid YAML" in text and "WARPOLICY_DISABLE_PLUGINS=broken" in text
    )


@pytest.mark.parametrize(
    "value, match",
    [
        (lambda: 42, "must return"),
        (lambda: pathlib.Path("/nonexistent/warpolicy/frag.yaml"), "cannot read"),
        (lambda: (_ for _ in ()).throw(ValueError("boom")), "raised ValueError: boom"),
    ],
)
def test_bad_fragment_results_name_the_plugin(pm, register, value, match):
    register(contributes(value), "bad")
    with pytest.raises(PluginError, match=match) as info:
        collect_fragments(pm)
    assert info.value.plugin == "bad"


def test_plugin_backend_becomes_queryable(pm, register):
    from warpolicy.registry.engine import Context, PolicyEngine
    from warpolicy.registry.vocabulary import ForwardMode, WarReadDonePolicy

    register(contributes(BACKEND_YAML.format(name="plugin_attn")), "onboard")
    engine = PolicyEngine.load(fragments=collect_fragments(pm), environ={})
    ctx = Context(
        backend="plugin_attn",
        mode=ForwardMode.DECODE,
        spec="none",
        flags={},
        platform="cuda",
        external_events=True,
        eager=False,
        planted=True,
    )
    assert engine.decide(ctx) is WarReadDonePolicy.IN_GRAPH


def test_invalid_fragment_problems_name_the_plugin_and_how_to_disable_it():
    from warpolicy.errors import RegistryError
    from warpolicy.registry.engine import PolicyEngine
    from warpolicy.runtime.hookspecs import hookimpl
    from warpolicy.runtime.manager import new_plugin_manager

    class BadFragment:
        @hookimpl
        def warpolicy_capabilities(self):
            return "version: 1\nbackends:\n  mine:\n    inherits: nosuchbase\n"

    pm = new_plugin_manager(load_entry_points=False)
    plugin = BadFragment()
    pm.register(plugin, name="badfrag")
    try:
        with pytest.raises(RegistryError) as info:
            PolicyEngine.load(
                fragments=collect_fragments(pm),
                blame=functools.partial(blame_plugins, pm),
                environ={},
            )
    finally:
        pm.unregister(plugin)
    (problem,) = info.value.problems
    text = str(problem)
    assert text.startswith("plugin:badfrag:4:")
    assert "nosuchbase" in text and "WARPOLICY_DISABLE_PLUGINS=badfrag" in text


def test_non_utf8_fragment_file_is_one_plugin_error_line(pm, register, tmp_path):
    path = tmp_path / "latin1.yaml"
    path.write_bytes(b"version: 1\n# caf\xe9\n")
    register(contributes(lambda: path), "latin")
    with pytest.raises(PluginError) as info:  # was a UnicodeDecodeError traceback
        collect_fragments(pm)
    text = str(info.value)
    assert "\n" not in text and "'latin'" in text and "not UTF-8" in text


def test_a_capabilities_wrapper_is_not_taken_for_a_fragment(pm, register):
    class Wrapper:
        @hookimpl(wrapper=True)
        def warpolicy_capabilities(self):
            return (yield)

    register(Wrapper(), "wrapper")
    register(contributes({"version": 1, "flags": {}}), "plain")
    assert [f.name for f in collect_fragments(pm)] == ["plugin:plain"]


class _PluginBaseException(BaseException):
    """A plugin's own BaseException (neither Exception nor KeyboardInterrupt)."""


class _FailingEntryPoint:
    name = "broken_import"
    group = "warpolicy"
    value = "broken_import:plugin"

    def __init__(self, error: BaseException) -> None:
        self.error = error

    def load(self):
        raise self.error


@pytest.mark.parametrize(
    "error", [GeneratorExit("gen"), _PluginBaseException("custom"), SystemExit(3)]
)
def test_a_plugin_raising_a_base_exception_at_import_is_one_line_exit_2(monkeypatch, capsys, error):
    """Issue 26 finding 9: 0.3.0 let GeneratorExit or a custom BaseException out of the import
    (a traceback, exit 1); now it is a broken plugin: one line naming it, exit 2."""
    from warpolicy.cli.main import ExitCode, main
    from warpolicy.runtime import manager

    monkeypatch.setattr(
        manager, "_entry_points", lambda: [(_FailingEntryPoint(error), "broken-dist", "1.0")]
    )
    monkeypatch.setattr(manager, "_DEFAULT", None)  # the CLI builds its manager afresh
    with pytest.raises(manager.PluginError, match="broken_import.*failed to import"):
        manager.new_plugin_manager(load_entry_points=True, environ={})
    code = main(["plugins"])
    out, err = capsys.readouterr()
    assert code == ExitCode.USAGE and "Traceback" not in err
    (line,) = err.strip().splitlines()
    assert "broken_import" in line and type(error).__name__ in line


def test_a_keyboard_interrupt_at_plugin_import_is_the_operators(monkeypatch):
    from warpolicy.runtime import manager

    monkeypatch.setattr(
        manager,
        "_entry_points",
        lambda: [(_FailingEntryPoint(KeyboardInterrupt()), "broken-dist", "1.0")],
    )
    with pytest.raises(KeyboardInterrupt):
        manager.new_plugin_manager(load_entry_points=True, environ={})
