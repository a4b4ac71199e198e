"""The CLI through `main(argv)`: outputs, the default registry's table, exit codes, one-line errors."""

from __future__ import annotations

import json
import os
import re

import pytest

from warpolicy.cli.main import TORCH_HINT, ExitCode, main

FLAG_ENVS = (
    "WARPOLICY_PREFILL_READ_DONE",
    "SGLANG_ENABLE_PREFILL_WAR_READ_DONE",
    "WARPOLICY_FORCE_COARSE",
    "SGLANG_FORCE_COARSE_WAR_BARRIER",
    "WARPOLICY_HIERARCHICAL_CACHE",
    "WARPOLICY_CAPABILITIES",
)


def run_cli(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def query(capsys, *argv) -> str:
    code, out, err = run_cli(capsys, "query", *argv)
    assert code == ExitCode.OK, err
    return out.split()[0]


def table_json(capsys, *argv) -> list[dict]:
    code, out, err = run_cli(capsys, "table", "--format", "json", *argv)
    assert code == ExitCode.OK, err
    doc = json.loads(out)
    assert doc["schema_version"] == 1
    return doc["rows"]


def test_query_text_starts_with_policy(capsys):
    code, out, _ = run_cli(capsys, "query", "--backend", "fa3", "--mode", "decode")
    assert code == 0
    assert out.splitlines()[0] == "in_graph"
    assert "declared" in out


def test_query_json_shape(capsys):
    code, out, _ = run_cli(
        capsys,
        "query",
        "--backend",
        "dsv4",
        "--mode",
        "verify",
        "--spec",
        "dflash",
        "--format",
        "json",
    )
    data = json.loads(out)
    assert code == 0
    assert data["policy"] == "post_replay"
    assert (data["backend"], data["mode"], data["spec"]) == ("dsv4", "target_verify", "dflash")
    assert all({"id", "message"} <= set(r) for r in data["reasons"])


def test_default_table_decode_in_graph_everywhere(capsys):
    rows = table_json(capsys, "--mode", "decode")
    # minimax sparse NVFP4 snapshots every shared input before replay (SGLang 0.5.23); hybrid
    # linear's linear-attention layers read recurrent state to the end (metadata: in_graph); a
    # decoupled drafter (another process, sglang #27634) makes every cell coarse
    special = {"minimax_sparse_nvfp4": "pre_replay", "hybrid_linear": "post_replay"}
    assert rows and all(
        r["policy"]
        == ("none" if r["spec"] == "decoupled" else special.get(r["backend"], "in_graph"))
        for r in rows
    )
    hybrid = [r for r in rows if r["backend"] == "hybrid_linear" and r["spec"] != "decoupled"]
    assert hybrid and all(
        r["classes"] == {"metadata": "in_graph", "recurrent_state": "post_replay"} for r in hybrid
    )
    assert {
        "flashinfer",
        "triton",
        "torch_native",
        "fa3",
        "fa4",
        "flashmla",
        "cutlass_mla",
        "trtllm_mla",
        "trtllm_mha",
        "aiter",
        "dsv4",
    } <= {r["backend"] for r in rows}


def test_unknown_modes_are_none(capsys):
    rows = table_json(capsys, "--mode", "mixed", "--mode", "idle", "--mode", "draft_extend")
    # draft extend is unknown unless a backend declares it (minimax sparse NVFP4 and trtllm_mha,
    # which image_prefill_trtllm_mha routes it to)
    declared = {r["backend"] for r in rows if r["policy"] != "none"}
    assert rows and {r["mode"] for r in rows if r["policy"] != "none"} == {"draft_extend"}
    assert declared == {"minimax_sparse_nvfp4", "trtllm_mha", "image_prefill_trtllm_mha"}


def test_target_verify_in_graph_only_when_verify_is_the_last_reader(capsys):
    rows = table_json(capsys, "--mode", "target_verify")
    for r in rows:
        if r["policy"] == "in_graph":
            assert r["spec"] in ("dflash", "dspark", "ngram", "uno")
        if r["backend"] == "dsv4" and r["spec"] in ("dflash", "ngram", "uno"):
            assert r["policy"] == "post_replay"
        if r["backend"] == "dsv4" and r["spec"] == "dspark":
            assert r["policy"] == "in_graph"
    assert any(r["policy"] == "in_graph" for r in rows)


def test_trtllm_mha_prefill_needs_the_flag(capsys, monkeypatch):
    args = ("--backend", "trtllm_mha", "--mode", "extend")
    assert query(capsys, *args) == "none"
    assert query(capsys, *args, "--flag", "prefill_read_done=1") == "pre_replay"
    assert query(capsys, *args, "--spec", "eagle", "--flag", "prefill_read_done=1") == "none"
    monkeypatch.setenv("SGLANG_ENABLE_PREFILL_WAR_READ_DONE", "1")
    assert query(capsys, *args) == "pre_replay"
    monkeypatch.setenv("WARPOLICY_HIERARCHICAL_CACHE", "1")
    assert query(capsys, *args) == "none"
    monkeypatch.delenv("SGLANG_ENABLE_PREFILL_WAR_READ_DONE")
    monkeypatch.delenv("WARPOLICY_HIERARCHICAL_CACHE")
    monkeypatch.setenv("WARPOLICY_PREFILL_READ_DONE", "true")
    assert query(capsys, *args) == "pre_replay"
    rows = table_json(capsys, "--mode", "extend", "--spec", "none")
    early = {r["backend"] for r in rows if r["policy"] == "pre_replay"}
    assert early == {  # dsv4 too, for a batch that reports its query count or snapshot
        "trtllm_mha",
        "minimax_sparse_nvfp4",
        "hybrid_attention",
        "hybrid_trtllm_mha_flashinfer",
    }


def test_force_coarse_makes_everything_none(capsys, monkeypatch):
    rows = table_json(capsys, "--flag", "force_coarse=true", "--flag", "prefill_read_done=1")
    assert rows and all(r["policy"] == "none" for r in rows)
    monkeypatch.setenv("SGLANG_FORCE_COARSE_WAR_BARRIER", "1")
    assert all(r["policy"] == "none" for r in table_json(capsys))


@pytest.mark.parametrize("facts", [["--no-plant"], ["--eager"], ["--no-external-events"]])
def test_sound_demotion_from_the_cli(capsys, facts):
    assert query(capsys, "--backend", "fa3", "--mode", "decode", *facts) == "post_replay"


def test_explain_shows_chain_and_gates(capsys):
    code, out, _ = run_cli(capsys, "explain", "--backend", "trtllm_mha", "--mode", "prefill")
    assert code == 0
    assert out.splitlines()[0] == "none"
    # trtllm_mha declares extend itself: its own line, not the inherited one
    assert "    trtllm_mha declares extend: pre_replay" in out.splitlines()
    assert "inherited" not in out
    assert "prefill-opt-in" in out and "[raised]" in out


def test_explain_names_an_inherited_declaration(capsys):
    code, out, _ = run_cli(capsys, "explain", "--backend", "trtllm_mha", "--mode", "decode")
    assert code == 0
    assert out.splitlines()[0] == "in_graph"
    assert "    trtllm_mha declares decode: in_graph (inherited from base)" in out.splitlines()


def test_explain_json(capsys):
    code, out, _ = run_cli(
        capsys, "explain", "--backend", "fa3", "--mode", "decode", "--no-plant", "--format", "json"
    )
    data = json.loads(out)
    assert data["policy"] == "post_replay" and data["declared"] == "in_graph"
    assert any(r["id"] == "sound-demotion" for r in data["reasons"])
    assert data["gates"]


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["query", "--backend", "fa33", "--mode", "decode"], "did you mean 'fa3'"),
        (["query", "--backend", "fa3", "--mode", "decod"], "unknown mode 'decod'"),
        (["query", "--backend", "fa3", "--mode", "decode", "--spec", "dflsh"], "'dflash'"),
        (
            ["query", "--backend", "fa3", "--mode", "decode", "--flag", "force_corse=1"],
            "force_coarse",
        ),
        (["query", "--backend", "fa3", "--mode", "decode", "--flag", "force_coarse"], "NAME=VALUE"),
        (
            ["query", "--backend", "fa3", "--mode", "decode", "--flag", "force_coarse=maybe"],
            "not a boolean",
        ),
        (["query", "--mode", "decode"], "--backend"),
        (["frobnicate"], "invalid choice"),
        (["table", "--capabilities", "/nonexistent/caps.yaml"], "/nonexistent/caps.yaml"),
    ],
)
def test_input_errors_are_one_line_exit_2(capsys, argv, needle):
    code, out, err = run_cli(capsys, *argv)
    assert code == ExitCode.USAGE
    assert needle in err
    assert len(err.strip().splitlines()) == 1
    assert "Traceback" not in err


def test_validate_default_ok(capsys):
    code, out, err = run_cli(capsys, "validate")
    assert code == 0, err


def test_validate_reports_every_problem_located(capsys, tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "version: 1\nbackends:\n  x:\n    reads_end: {decode: sometimes}\n"
        "    inherits: nope\n    colour: red\n"
    )
    code, out, err = run_cli(capsys, "validate", str(bad))
    assert code == ExitCode.CHECK_FAILED
    lines = err.strip().splitlines()
    assert len(lines) >= 3
    for line in lines:
        path, lineno, col, _msg = line.split(":", 3)
        assert path == str(bad) and int(lineno) >= 1 and int(col) >= 1


def test_query_with_invalid_registry_exits_2_with_located_lines(capsys, tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("version: 2\n")
    code, _, err = run_cli(
        capsys, "query", "--backend", "fa3", "--mode", "decode", "--capabilities", str(bad)
    )
    assert code == ExitCode.USAGE
    assert f"{bad}:1:" in err and "Traceback" not in err


def test_layered_capabilities_and_default_token(capsys, tmp_path):
    extra = tmp_path / "extra.yaml"
    extra.write_text(
        "version: 1\nbackends:\n  mybackend:\n    inherits: base\n"
        "    reads_end: {extend: pre_replay}\n    doc: mine\n"
    )
    argv = [
        "--backend",
        "mybackend",
        "--mode",
        "extend",
        "--flag",
        "prefill_read_done=1",
        "--capabilities",
        "default",
        "--capabilities",
        str(extra),
    ]
    assert query(capsys, *argv) == "pre_replay"


def test_capabilities_from_env(capsys, tmp_path, monkeypatch):
    extra = tmp_path / "extra.yaml"
    extra.write_text(
        "version: 1\nbackends:\n  fa3:\n    override: true\n"
        "    reads_end: {decode: post_replay}\n    doc: overridden\n"
    )
    monkeypatch.setenv("WARPOLICY_CAPABILITIES", os.pathsep.join(["default", str(extra)]))
    assert query(capsys, "--backend", "fa3", "--mode", "decode") == "post_replay"


def diff_json(capsys, *argv, code=ExitCode.OK):
    got, out, err = run_cli(capsys, "diff", *argv, "--format", "json")
    assert got == code, err
    doc = json.loads(out)
    assert doc["schema_version"] == 3  # cells bounded by --limit; per-batch classes (3)
    return doc


def test_diff_lists_changed_cells(capsys, tmp_path):
    new = tmp_path / "new.yaml"
    new.write_text(
        "version: 1\nbackends:\n  fa3:\n    override: true\n    inherits: base\n"
        "    reads_end: {target_verify: post_replay}\n    doc: rereads\n"
        "  newbe:\n    inherits: base\n    doc: new\n"
    )
    layered = os.pathsep.join(["default", str(new)])
    doc = diff_json(capsys, "default", layered)
    cells = {(c["backend"], c["mode"], c["spec"]): c for c in doc["cells"]}
    assert cells[("fa3", "target_verify", "dflash")]["old"] == "in_graph"
    assert cells[("fa3", "target_verify", "dflash")]["new"] == "post_replay"
    assert cells[("fa3", "target_verify", "dflash")]["change"] == "later"
    assert cells[("fa3", "target_verify", "dflash")]["when"] == "any"
    assert cells[("newbe", "decode", "none")]["change"] == "added"
    assert not any(b == "fa3" and m == "decode" for b, m, _ in cells)
    # every flag some gate tests (the extend gates of the 0.5.23 registry included)
    assert set(doc["compared"]["flags"]) == {
        "prefill_read_done",
        "hierarchical_cache",
        "hicache_storage",
        "lmcache",
        "context_parallel",
        "hisparse",
        "flashmla_sparse_prefill",
    }
    assert "force_coarse" in doc["compared"]["held"]
    fast = ("--mode", "target_verify", "--mode", "decode")
    code, _, _ = run_cli(capsys, "diff", "default", layered, "--exit-code", *fast)
    assert code == ExitCode.CHECK_FAILED
    code, _, _ = run_cli(capsys, "diff", "default", layered, "--fail-on", "earlier", *fast)
    assert code == ExitCode.OK  # later and added only
    code, out, _ = run_cli(capsys, "diff", "default", "default", "--exit-code", *fast)
    assert code == ExitCode.OK and "no policy changes" in out
    assert "held: force_coarse" in out and "compared:" in out


def test_diff_sees_other_modes_and_changes_behind_a_flag(capsys, tmp_path):
    """0.1.0 compared three modes under the default flags: both changes printed nothing."""
    new = tmp_path / "new.yaml"
    new.write_text(
        "version: 1\nbackends:\n  fa3:\n    override: true\n    inherits: base\n"
        "    reads_end: {draft_extend: in_graph, extend: pre_replay}\n    doc: x\n"
    )
    layered = os.pathsep.join(["default", str(new)])
    doc = diff_json(capsys, "default", layered)
    cells = {(c["backend"], c["mode"], c["spec"]): c for c in doc["cells"]}
    assert cells[("fa3", "draft_extend", "none")]["change"] == "earlier"
    behind = cells[("fa3", "extend", "none")]
    assert (behind["old"], behind["new"], behind["change"]) == ("none", "pre_replay", "earlier")
    assert behind["when"] == (
        "prefill_read_done=true, hicache_storage=false, hierarchical_cache=false, lmcache=false"
    )
    assert all(s["prefill_read_done"] for s in behind["settings"])
    code, out, _ = run_cli(capsys, "diff", "default", layered, "--fail-on", "earlier")
    assert code == ExitCode.CHECK_FAILED and "earlier" in out
    code, out, _ = run_cli(
        capsys,
        "diff",
        "default",
        layered,
        "--flag",
        "prefill_read_done=0",
        "--mode",
        "extend",
        "--exit-code",
    )
    assert code == ExitCode.OK and "held: prefill_read_done = false: given" in out


def test_diff_enumerates_platform_facts_a_gate_tests(capsys, tmp_path):
    old = tmp_path / "old.yaml"
    old.write_text(
        "version: 1\nbackends:\n  b:\n    reads_end: {decode: pre_replay}\n"
        "    doc: x\ngates:\n  - id: hip-late\n    when: {platform: hip}\n"
        "    at_least: post_replay\n    because: hip\n"
    )
    new = tmp_path / "new.yaml"
    new.write_text("version: 1\nbackends:\n  b:\n    reads_end: {decode: pre_replay}\n    doc: x\n")
    doc = diff_json(capsys, str(old), str(new), "--plugins", "none", "--mode", "decode")
    assert doc["compared"]["platforms"] == ["cuda", "hip", "other"]
    (cell,) = doc["cells"]
    assert (cell["when"], cell["change"]) == ("platform=hip", "earlier")


@pytest.fixture
def speedy_plugin(monkeypatch):
    """An installed plugin whose fragment makes fa3 decode earlier (pre_replay)."""
    from warpolicy import hookimpl
    from warpolicy.runtime import manager as plugins

    class Speedy:
        @hookimpl
        def warpolicy_capabilities(self):
            return (
                "version: 1\nbackends:\n  fa3:\n    override: true\n"
                "    reads_end: {decode: pre_replay, target_verify: in_graph}\n"
                "    doc: claims a snapshot\n"
            )

    pm = plugins.new_plugin_manager(load_entry_points=False, environ={})
    pm.register(Speedy(), name="speedy")
    monkeypatch.setattr(plugins, "get_plugin_manager", lambda: pm)
    return pm


def test_diff_with_and_without_plugins(capsys, speedy_plugin):
    """0.1.0 loaded plugins on both sides: a plugin's own effect printed nothing."""
    decode = ("--mode", "decode")  # the plugin changes decode only; every mode is tested above
    doc = diff_json(capsys, "default", "default", "--plugins", "new", *decode)
    assert {(c["backend"], c["mode"], c["change"]) for c in doc["cells"]} == {
        ("fa3", "decode", "earlier"),
        ("tbo_fa3", "decode", "earlier"),  # and its wrappers
        ("minimax_sparse", "decode", "earlier"),
        ("dots_hybrid", "decode", "earlier"),
    }
    assert diff_json(capsys, "default", "default", "--plugins", "on", *decode)["cells"] == []
    assert diff_json(capsys, "default", "default", "--plugins", "none", *decode)["cells"] == []


def test_layer_report_names_the_plugin(capsys, speedy_plugin):
    code, out, err = run_cli(capsys, "plugins", "--format", "json")
    assert code == ExitCode.OK, err
    rows = {r["name"]: r for r in json.loads(out)["rows"]}
    # the example cell is fa3's decode or that of a wrapper running fa3 for decode
    assert rows["speedy"]["earlier"] and re.search(
        r"\b(fa3|tbo_fa3|minimax_sparse|dots_hybrid) decode", rows["speedy"]["earlier"][0]
    )
    assert not any(r["earlier"] for n, r in rows.items() if n != "speedy")
    code, out, err = run_cli(capsys, "validate")
    assert code == ExitCode.OK
    assert "warning: layer plugin:speedy makes" in err and "in_graph -> pre_replay" in err
    with pytest.warns(RuntimeWarning, match="layer plugin:speedy"):
        from warpolicy.registry.engine import PolicyEngine
        from warpolicy.runtime.manager import collect_fragments

        PolicyEngine.load(fragments=collect_fragments(speedy_plugin), environ={}).compile("fa3")


def test_table_markdown_and_text(capsys):
    code, out, _ = run_cli(capsys, "table", "--backend", "fa3", "--format", "markdown")
    assert code == 0 and out.startswith("| backend |")
    code, out, _ = run_cli(capsys, "table", "--backend", "fa3")
    assert code == 0 and out.splitlines()[0].split()[:4] == ["backend", "mode", "spec", "policy"]


def test_schema_is_json(capsys):
    code, out, _ = run_cli(capsys, "schema")
    schema = json.loads(out)
    assert code == 0 and "backends" in schema["properties"]


def test_bench_decide_json(capsys):
    code, out, _ = run_cli(capsys, "bench", "decide", "--iterations", "2000", "--format", "json")
    data = json.loads(out)
    assert code == 0
    assert {"engine_ns", "baseline_ns", "ratio"} <= set(data) and data["schema_version"] == 1
    assert data["engine_ns"] > 0 and data["baseline_ns"] > 0


@pytest.mark.parametrize(
    "argv",
    [
        ["bench", "decide", "--iterations", "0"],
        ["bench", "decide", "--iterations", "-3"],
        ["bench", "fence", "--iterations", "x"],
        ["bench", "overlap", "--steps", "0"],
    ],
)
def test_bench_counts_must_be_positive(capsys, argv):
    code, _, err = run_cli(capsys, *argv)
    assert code == ExitCode.USAGE
    assert "expected a positive integer" in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("argv", [["--version"], ["--help"], ["table", "-h"]])
def test_help_and_version_return_ok(capsys, argv):
    code, out, _ = run_cli(capsys, *argv)
    assert code == ExitCode.OK and out


def test_bench_decide_text_without_a_ratio():
    from warpolicy.bench.decide import format_decide

    result = {
        "engine_ns": 1.0,
        "lookup_ns": 1.0,
        "baseline_ns": 0.0,
        "ratio": None,
        "load": {"backends": 1, "gates": 1, "load_s": 0.0, "table_s": 0.0, "table_rows": 1},
    }
    assert "n/a" in format_decide(result)


def test_validate_given_files_does_not_load_plugins(capsys, tmp_path, monkeypatch):
    from warpolicy.errors import PluginError
    from warpolicy.runtime import manager as plugins

    def broken():
        raise PluginError("broken", "fails to import")

    monkeypatch.setattr(plugins, "get_plugin_manager", broken)
    good = tmp_path / "good.yaml"
    good.write_text("version: 1\n")
    code, out, err = run_cli(capsys, "validate", str(good))
    assert code == ExitCode.OK, err
    code, _, err = run_cli(capsys, "validate")  # the registry in use includes plugin fragments
    assert code == ExitCode.USAGE and "broken" in err


def test_external_events_default_follows_the_platform(capsys):
    args = ("--backend", "fa3", "--mode", "decode")
    assert query(capsys, *args, "--platform", "hip") == "post_replay"
    assert query(capsys, *args, "--platform", "hip", "--external-events") == "in_graph"
    assert query(capsys, *args, "--platform", "cuda") == "in_graph"


def test_a_registry_without_spec_algorithms_still_answers_for_spec_none(capsys, tmp_path):
    mine = tmp_path / "mine.yaml"
    mine.write_text(
        "version: 1\nbackends:\n  solo:\n    reads_end: {decode: in_graph, "
        "extend: pre_replay}\n    doc: standalone\n"
    )
    args = ("--backend", "solo", "--capabilities", str(mine))
    assert query(capsys, *args, "--mode", "decode") == "in_graph"
    rows = table_json(capsys, "--capabilities", str(mine))
    assert {(r["mode"], r["spec"], r["policy"]) for r in rows} == {
        ("decode", "none", "in_graph"),
        ("extend", "none", "pre_replay"),
        ("target_verify", "none", "none"),
        ("draft_extend", "none", "none"),
    }
    code, _, err = run_cli(capsys, "query", *args, "--mode", "decode", "--spec", "eagle")
    assert code == ExitCode.USAGE and "unknown spec algorithm 'eagle'" in err


@pytest.mark.parametrize("argv", [["bench", "overlap"], ["audit", "--synthetic", "all"]])
def test_runtime_commands_without_torch_are_one_line(capsys, monkeypatch, argv):
    import sys

    for name in [
        m
        for m in sys.modules
        if m == "torch"
        or m.startswith("torch.")
        or m.startswith("warpolicy.testing")
        or m.startswith("warpolicy.bench.")
        or m.startswith("warpolicy.audit")
        or m in ("warpolicy.runtime.fence", "warpolicy.cuda")
    ]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "torch", None)  # import torch -> ModuleNotFoundError
    code, _, err = run_cli(capsys, *argv)
    assert code == ExitCode.USAGE
    assert err.strip() == f"warpolicy: {TORCH_HINT}"
    assert "download.pytorch.org/whl/cpu" in TORCH_HINT  # never a multi-GB CUDA build by accident


# -- output that cannot be written, hooks that exit, GPU commands without CUDA -------------------

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run_process(*argv, stdout=None, env_extra=None, close_stdout=False):
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k not in FLAG_ENVS}
    env.update({"PYTHONPATH": REPO, **(env_extra or {})})
    return subprocess.run(
        [sys.executable, "-m", "warpolicy", *argv],
        env=env,
        text=True,
        stdout=stdout if stdout is not None else subprocess.PIPE,
        stderr=subprocess.PIPE,
        timeout=120,
        preexec_fn=(lambda: os.close(1)) if close_stdout else None,
    )


def one_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert "Traceback" not in err and "Exception ignored" not in err
    return lines[0]


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
def test_full_disk_is_one_line_and_exit_3():
    with open("/dev/full", "w") as full:
        proc = run_process("table", stdout=full)
    assert proc.returncode == ExitCode.OUTPUT
    assert "cannot write the output: No space left on device" in one_line(proc.stderr)


def test_closed_stdout_is_one_line_and_exit_3():
    proc = run_process("query", "--backend", "fa3", "--mode", "decode", close_stdout=True)
    assert proc.returncode == ExitCode.OUTPUT
    assert "stdout is closed" in one_line(proc.stderr)


def test_ascii_terminal_is_one_line_and_exit_3(tmp_path):
    caps = tmp_path / "caps.yaml"
    caps.write_text(
        "version: 1\nbackends:\n  b:\n    reads_end: {decode: in_graph}\n"
        "    doc: x\ngates:\n  - id: g\n    when: {mode: decode}\n"
        "    at_least: post_replay\n    because: na\u00efve reader \u2013 late\n",
        encoding="utf-8",
    )
    proc = run_process(
        "query",
        "--backend",
        "b",
        "--mode",
        "decode",
        "--capabilities",
        str(caps),
        env_extra={"LANG": "C", "LC_ALL": "C", "PYTHONIOENCODING": "ascii"},
    )
    assert proc.returncode == ExitCode.OUTPUT
    line = one_line(proc.stderr)
    assert "cannot encode" in line and "PYTHONIOENCODING=utf-8" in line
    assert proc.stdout == ""


@pytest.mark.parametrize(
    "raise_it, code, needle",
    [
        (lambda: __import__("sys").exit(0), ExitCode.USAGE, "sys.exit(0) was called"),
        (lambda: __import__("sys").exit(), ExitCode.USAGE, "sys.exit(None) was called"),
        (lambda: (_ for _ in ()).throw(KeyboardInterrupt), ExitCode.INTERRUPTED, "interrupted"),
    ],
)
def test_a_hook_that_exits_is_not_a_silent_success(capsys, monkeypatch, raise_it, code, needle):
    from warpolicy import hookimpl
    from warpolicy.runtime import manager as plugins

    class Exits:
        @hookimpl
        def warpolicy_capabilities(self):
            raise_it()

    pm = plugins.new_plugin_manager(load_entry_points=False, environ={})
    pm.register(Exits(), name="exits")
    monkeypatch.setattr(plugins, "get_plugin_manager", lambda: pm)
    got, out, err = run_cli(capsys, "query", "--backend", "fa3", "--mode", "decode")
    assert got == code and out == ""
    assert needle in one_line(err)


@pytest.mark.parametrize(
    "argv",
    [
        ["query", "--backend", "fa3", "--mode", "decode", "--flag", "force_coarse="],
        ["table", "--flag", "prefill_read_done= "],
        ["diff", "default", "default", "--flag", "prefill_read_done="],
    ],
)
def test_empty_flag_value_is_an_error(capsys, argv):
    code, out, err = run_cli(capsys, *argv)
    assert code == ExitCode.USAGE and out == ""
    assert "empty value" in one_line(err)


def test_gpu_commands_without_cuda_are_one_line():
    import importlib.util

    if importlib.util.find_spec("torch") is None:
        pytest.skip("needs torch installed")
    import torch

    if torch.cuda.is_available():
        pytest.skip("has CUDA")
    for argv in (
        ["bench", "overlap", "--steps", "1"],
        ["audit", "--synthetic", "all"],
        ["bench", "fence", "--iterations", "10"],
        ["bench", "overlap", "--tp", "1"],
        ["bench", "overlap", "--spec-step"],
    ):
        proc = run_process(*argv)
        assert proc.returncode == ExitCode.USAGE, proc.stderr
        assert "CUDA" in one_line(proc.stderr)


def test_json_outputs_carry_a_schema_version(capsys):
    for argv in (
        ["query", "--backend", "fa3", "--mode", "decode"],
        ["explain", "--backend", "tbo_fa3", "--mode", "decode"],
        ["table", "--backend", "fa3"],
        ["plugins"],
        ["diff", "default", "default", "--mode", "decode"],
        ["validate"],
    ):
        code, out, err = run_cli(capsys, *argv, "--format", "json")
        assert code == ExitCode.OK, err
        assert json.loads(out)["schema_version"] == (3 if argv[0] == "diff" else 1), argv


def test_explain_markdown_for_pull_requests(capsys, tmp_path):
    caps = tmp_path / "caps.yaml"
    caps.write_text(
        "version: 1\nbackends:\n  slow_base:\n    abstract: true\n"
        "    reads_end: {decode: post_replay}\n    doc: late\n"
        "  fast:\n    reads_end: {decode: in_graph}\n    doc: fast\n"
        "  w:\n    inherits: slow_base\n    latest_of: [fast]\n    doc: w\n"
    )
    code, out, err = run_cli(
        capsys,
        "explain",
        "--backend",
        "w",
        "--mode",
        "decode",
        "--capabilities",
        str(caps),
        "--format",
        "markdown",
    )
    assert code == ExitCode.OK, err
    assert out.startswith("### warpolicy: `w` decode (spec `none`) -> **post_replay**")
    assert "| w | slow_base | post_replay | inherited from slow_base |" in out
    assert "| w | fast | in_graph | in_graph |" in out
    code, out, _ = run_cli(
        capsys,
        "query",
        "--backend",
        "w",
        "--mode",
        "decode",
        "--capabilities",
        str(caps),
        "--format",
        "markdown",
    )
    assert code == ExitCode.OK and out.startswith("**post_replay** for `w`")


# -- bench wiring: simulated device, observer plugins, --tp and --spec-step -------------------------


def test_bench_fence_metrics_without_the_plugin_is_one_line(capsys, monkeypatch):
    pytest.importorskip("torch")  # the benchmark runs the runtime
    import sys

    monkeypatch.setitem(sys.modules, "warpolicy_metrics", None)  # import -> ImportError
    code, out, err = run_cli(capsys, "bench", "fence", "--device", "sim", "--metrics")
    assert code == ExitCode.USAGE and out == ""
    assert "warpolicy-metrics plugin" in one_line(err)


def test_bench_overlap_tp_on_sim(capsys):
    pytest.importorskip("torch")  # the benchmark runs the runtime
    code, out, err = run_cli(
        capsys, "bench", "overlap", "--tp", "1", "--device", "sim", "--format", "json"
    )
    assert code == ExitCode.OK, err
    doc = json.loads(out)
    assert doc["world_size"] == 1 and doc["targets"]["consistency_ok_every_rank"]
    assert doc["schema_version"] == 1
    assert [r["resolved"] for r in doc["ranks"][0]["rows"]] == [
        "none",
        "post_replay",
        "in_graph",
        "none",
    ]


def test_bench_overlap_spec_step_on_sim(capsys):
    pytest.importorskip("torch")  # the benchmark runs the runtime
    code, out, err = run_cli(capsys, "bench", "overlap", "--spec-step", "--device", "sim")
    assert code == ExitCode.OK, err
    assert "draft_extend" in out and "sound_runs_zero_corrupted=yes" in out


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--tp", "1", "--window-us", "5"], "--window-us is not supported with --tp"),
        (["--tp", "1", "--trace", "t.json"], "--trace is not supported with --tp"),
        (["--tp", "1", "--spec-step"], "--spec-step is not supported with --tp"),
        (["--strict"], "--strict only applies with --tp"),
        (["--mismatch-rank", "1"], "--mismatch-rank only applies with --tp"),
        (["--tp", "1", "--mismatch-rank", "3"], "mismatch rank 3"),
        (["--tp", "2", "--mismatch-env", "NOEQUALS"], "NAME=VALUE"),
    ],
)
def test_bench_overlap_option_errors_are_one_line(capsys, argv, message):
    pytest.importorskip("torch")  # the bench command asks for torch before it reads its options
    code, out, err = run_cli(capsys, "bench", "overlap", "--device", "sim", *argv)
    assert code == ExitCode.USAGE and out == ""
    assert message in one_line(err)


@pytest.mark.parametrize("spec, verify", [("eagle", "none"), ("dflash", "pre_replay")])
def test_table_for_a_spec_shows_draft_extend(capsys, spec, verify):
    """The EAGLE family's last reader is draft extend: a table per spec must show it."""
    rows = table_json(capsys, "--spec", spec, "--backend", "minimax_sparse_nvfp4")
    by_mode = {r["mode"]: r["policy"] for r in rows}
    assert set(by_mode) == {"decode", "extend", "target_verify", "draft_extend"}
    assert (by_mode["target_verify"], by_mode["draft_extend"]) == (verify, "pre_replay")
    code, out, _ = run_cli(capsys, "table", "--spec", spec, "--backend", "fa3")
    assert code == ExitCode.OK and "draft_extend" in out


def test_tp_worker_ranks_print_no_numpy_warning():
    """Issue 22 item 18: the spawned ranks imported torch with its "Failed to initialize NumPy"
    warning on; the parent's quiet import does not reach them."""
    import importlib.util

    if importlib.util.find_spec("torch") is None:
        pytest.skip("needs torch installed")
    proc = run_process("bench", "overlap", "--tp", "2", "--device", "sim", "--steps", "4")
    assert proc.returncode == ExitCode.OK, proc.stderr
    assert "NumPy" not in proc.stderr and "Warning" not in proc.stderr, proc.stderr
