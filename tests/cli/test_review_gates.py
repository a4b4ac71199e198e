"""Issue 22: the review gates (``validate``, ``diff``, ``plugins``) catch every earlier
decision, at the scale of a real layer, and the CLI's smaller edges (items 5, 13-16)."""

from __future__ import annotations

import json
import os
import stat
import sys

import pytest

from warpolicy.cli.main import ExitCode, main
from warpolicy.registry.engine import PolicyEngine

FLIP = (
    "version: 1\nflags:\n  prefill_read_done:\n    override: true\n    default: true\n"
    "    env: [WARPOLICY_PREFILL_READ_DONE, SGLANG_ENABLE_PREFILL_WAR_READ_DONE]\n"
    "    doc: flipped\n"
)


def run_cli(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def layered(*paths) -> str:
    return os.pathsep.join(["default", *map(str, paths)])


# -- item 1: a layer that flips a flag's default ---------------------------------------------


def test_diff_fails_on_a_flipped_default(capsys, tmp_path):
    flip = tmp_path / "flip.yaml"
    flip.write_text(FLIP)
    code, out, err = run_cli(
        capsys, "diff", "default", layered(flip), "--fail-on", "earlier", "--format", "json"
    )
    assert code == ExitCode.CHECK_FAILED, err
    doc = json.loads(out)
    cells = {(c["backend"], c["mode"], c["spec"]): c for c in doc["cells"]}
    cell = cells[("trtllm_mha", "extend", "none")]
    assert (cell["old"], cell["new"], cell["change"]) == ("none", "pre_replay", "earlier")
    assert "prefill_read_done=default" in cell["when"]
    assert all(s["prefill_read_done"] == "default" for s in cell["settings"])


def test_validate_warns_about_a_flipped_default(capsys, tmp_path):
    flip = tmp_path / "flip.yaml"
    flip.write_text(FLIP)
    code, out, err = run_cli(capsys, "validate", "default", str(flip))
    assert code == ExitCode.OK and out.startswith("ok:")
    (line,) = err.splitlines()
    assert line.startswith(f"warpolicy: warning: layer {flip} makes ")
    assert "none -> pre_replay" in line


def test_plugins_lists_a_fragment_that_flips_a_default(capsys, monkeypatch):
    from warpolicy import hookimpl
    from warpolicy.runtime import manager

    class Flipper:
        @hookimpl
        def warpolicy_capabilities(self):
            return FLIP

    pm = manager.new_plugin_manager(load_entry_points=False, environ={})
    pm.register(Flipper(), name="flipper")
    monkeypatch.setattr(manager, "get_plugin_manager", lambda: pm)
    code, out, err = run_cli(capsys, "plugins", "--format", "json")
    assert code == ExitCode.OK, err
    rows = {r["name"]: r for r in json.loads(out)["rows"]}
    assert rows["flipper"]["earlier"] and "none -> pre_replay" in rows["flipper"]["earlier"][0]


# -- item 2: every field that moves a release, last_reader included --------------------------

STEP_OLD = (
    "version: 1\nspec_algorithms:\n  eagle:\n    family: eagle\n"
    "    capabilities: {target_verify_read_done: true}\n    last_reader: draft_extend\n"
    "    doc: x\nbackends:\n  mine:\n"
    "    reads_end: {target_verify: in_graph, draft_extend: nothing}\n    doc: x\n"
)


def test_diff_fails_when_a_spec_gains_last_reader_target_verify(capsys, tmp_path):
    old = tmp_path / "old.yaml"
    old.write_text(STEP_OLD)
    new = tmp_path / "new.yaml"
    new.write_text(STEP_OLD.replace("last_reader: draft_extend", "last_reader: target_verify"))
    code, out, err = run_cli(
        capsys, "diff", str(old), str(new), "--fail-on", "earlier", "--plugins", "none"
    )
    assert code == ExitCode.CHECK_FAILED, err
    (line,) = [x for x in out.splitlines() if x.startswith("mine ")]
    assert line.split()[:3] == ["mine", "step", "eagle"]
    # the draft extend reads nothing: the step released at its pre_replay event, now at verify's
    assert line.split()[3:6] == ["any", "pre_replay", "at"] and "in_graph at target_verify" in line
    assert line.split()[-1] == "earlier"


def test_an_undeclared_draft_extend_keeps_the_step_coarse_whatever_last_reader_says(
    capsys, tmp_path
):
    """Issue 26 finding 3: ``none`` is unknown, so naming verify the last reader while the
    draft extend is undeclared moves no release (the runtime step stays coarse)."""
    undeclared = STEP_OLD.replace(", draft_extend: nothing", "")
    old = tmp_path / "old.yaml"
    old.write_text(undeclared)
    new = tmp_path / "new.yaml"
    new.write_text(undeclared.replace("last_reader: draft_extend", "last_reader: target_verify"))
    code, out, err = run_cli(
        capsys, "diff", str(old), str(new), "--fail-on", "earlier", "--plugins", "none"
    )
    assert code == ExitCode.OK, out
    assert not [x for x in out.splitlines() if x.startswith("mine ")]


STAGED = (
    "version: 1\nfacts: {draft_extend_staged: {type: action, doc: x}}\n"
    "spec_algorithms:\n  eagle: {family: eagle, last_reader: draft_extend, doc: x}\n"
    "backends:\n  mine:\n    reads_end: {target_verify: in_graph, draft_extend: in_graph}\n"
    "    doc: x\n"
)


def test_diff_fails_on_a_later_only_gate_that_reads_the_staging_action(capsys, tmp_path):
    """Issue 26 finding 4 (0.3.0: exit 0): the gate makes verify later, but its runner now
    reports draft_extend_staged, and a staged batch's step releases at verify."""
    old = tmp_path / "old.yaml"
    old.write_text(STAGED)
    new = tmp_path / "new.yaml"
    new.write_text(
        STAGED + "gates:\n  - id: unstaged-verify-late\n    when:\n      mode: target_verify\n"
        "      facts: {draft_extend_staged: false}\n    at_least: post_replay\n"
        "    because: x\n"
    )
    code, out, err = run_cli(
        capsys, "diff", str(old), str(new), "--fail-on", "earlier", "--plugins", "none"
    )
    assert code == ExitCode.CHECK_FAILED, out
    (line,) = [x for x in out.splitlines() if x.startswith("mine ") and " step " in x]
    assert "draft_extend_staged" in line and line.split()[-1] == "earlier"


# -- item 4: scale -----------------------------------------------------------------------------


def layer(n: int) -> str:
    lines = ["version: 1", "backends:"]
    for i in range(n):
        lines += [
            f"  be_{i:04d}:",
            "    inherits: base",
            "    reads_end: {extend: pre_replay}",
            f"    doc: Backend number {i} of the scale test, layered over the default's base.",
        ]
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("n", [200, 1000])
def test_a_large_layer_is_validated_and_diffed_with_bounded_output(capsys, tmp_path, n):
    """0.2: 27-33 s and 423 MiB to validate 200 backends, 37-43 s, 2.0 GiB and 354 MB of JSON
    to diff them; 1,000 backends 169 s. Only what changed is evaluated now (see
    test_compare.py) and the listing stops at --limit."""
    path = tmp_path / "layer.yaml"
    path.write_text(layer(n))
    code, out, err = run_cli(capsys, "validate", "default", str(path))
    assert code == ExitCode.OK and err == "", err
    code, out, err = run_cli(capsys, "diff", "default", layered(path), "--format", "json")
    assert code == ExitCode.OK, err
    assert len(out) < 500_000
    doc = json.loads(out)
    assert len(doc["cells"]) == 100 and doc["summary"]["listed"] == 100
    assert len(doc["summary"]["added_backends"]) == n
    specs = PolicyEngine.load(["default"], environ={}).spec_names()
    assert doc["summary"]["cells"]["added"] == n * 9 * len(specs)  # every mode, every spec
    code, text, _ = run_cli(capsys, "diff", "default", layered(path))
    assert code == ExitCode.OK
    assert "added backends: be_0000" in text and f"({n} in all)" in text
    assert "listed: 100 of " in text and "--limit 0" in text


# -- item 5: the smaller ones ----------------------------------------------------------------


def test_platform_is_case_folded(capsys, tmp_path):
    caps = tmp_path / "caps.yaml"
    caps.write_text(
        "version: 1\nbackends:\n  b:\n    reads_end: {decode: in_graph}\n    doc: x\n"
        "gates:\n  - id: cuda-coarse\n    when: {platform: cuda}\n    at_least: none\n"
        "    because: x\n"
    )
    for spelled in ("cuda", "CUDA", " Cuda "):
        code, out, err = run_cli(
            capsys, "query", "--backend", "b", "--mode", "decode", "--capabilities", str(caps),
            "--platform", spelled,
        )  # fmt: skip
        assert code == ExitCode.OK, err
        assert out.split()[0] == "none", spelled


def test_diff_accepts_the_built_in_force_coarse_flag(capsys, tmp_path):
    mine = tmp_path / "mine.yaml"
    mine.write_text("version: 1\nbackends:\n  b:\n    reads_end: {decode: in_graph}\n    doc: x\n")
    code, out, err = run_cli(
        capsys, "diff", str(mine), str(mine), "--flag", "force_coarse=1", "--plugins", "none"
    )
    assert code == ExitCode.OK, err
    assert "held: force_coarse = true: given" in out
    code, _, err = run_cli(capsys, "diff", str(mine), str(mine), "--flag", "forse_coarse=1")
    assert code == ExitCode.USAGE and "unknown flag 'forse_coarse'" in err


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
@pytest.mark.parametrize(
    "argv",
    [
        ["validate", "{fifo}"],
        ["validate", "--each", "{fifo}"],
        ["table", "--capabilities", "{fifo}"],
    ],
)
def test_a_fifo_is_exit_2_everywhere(capsys, tmp_path, argv):
    fifo = tmp_path / "caps.yaml"
    os.mkfifo(fifo)
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)
    code, out, err = run_cli(capsys, *[a.format(fifo=fifo) for a in argv])
    assert code == ExitCode.USAGE, err
    assert f"{fifo}: not a regular file (a FIFO)" in err


def test_an_audit_factory_returning_nothing_audits_nothing_exit_3(capsys, tmp_path, monkeypatch):
    pytest.importorskip("torch")
    (tmp_path / "empty_factory.py").write_text("def make(platform):\n    return []\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    code, out, err = run_cli(
        capsys, "audit", "--factory", "empty_factory:make", "--device", "sim", "--format", "json"
    )
    assert code == ExitCode.INCONCLUSIVE, err
    assert json.loads(out)["exit_code"] == 3
    sys.modules.pop("empty_factory", None)


# -- items 13-16 -------------------------------------------------------------------------------


def test_wide_when_values_are_cut_in_text_and_whole_in_json(capsys, tmp_path):
    """0.2 padded every row to the longest `when` (7,689 characters in the walk-through)."""
    mine = tmp_path / "my.yaml"  # README's onboarding walk-through, step 2
    mine.write_text(
        "version: 1\nbackends:\n  my_attn:\n    inherits: base\n"
        "    reads_end: {extend: pre_replay}\n    doc: x\n"
    )
    code, out, err = run_cli(capsys, "diff", "default", layered(mine), "--mode", "extend")
    assert code == ExitCode.OK, err
    assert max(len(line) for line in out.splitlines()) < 250
    code, out, _ = run_cli(
        capsys, "diff", "default", layered(mine), "--mode", "extend", "--format", "json"
    )
    whens = [c["when"] for c in json.loads(out)["cells"]]
    assert max(len(w) for w in whens) > 80 and not any(w.endswith("...") for w in whens)


def test_a_plugin_whose_fragment_does_not_load_is_broken_exit_2(capsys, monkeypatch):
    from warpolicy import hookimpl
    from warpolicy.runtime import manager

    class Bad:
        @hookimpl
        def warpolicy_capabilities(self):
            return "version: 1\nbackends:\n  x:\n    reads_end: {decode: soonish}\n    doc: x\n"

    class Good:
        @hookimpl
        def warpolicy_on_fallback(self, where, error):
            pass

    pm = manager.new_plugin_manager(load_entry_points=False, environ={})
    pm.register(Bad(), name="bad")
    pm.register(Good(), name="good")
    monkeypatch.setattr(manager, "get_plugin_manager", lambda: pm)
    code, out, err = run_cli(capsys, "plugins", "--format", "json")
    assert code == ExitCode.USAGE
    rows = {r["name"]: r for r in json.loads(out)["rows"]}
    assert rows["bad"]["status"] == "broken" and "soonish" in rows["bad"]["error"]
    assert rows["good"]["status"] == "active"
    assert "plugin 'bad'" in err and "soonish" in err
    code, _, _ = run_cli(capsys, "query", "--backend", "fa3", "--mode", "decode")
    assert code == ExitCode.USAGE  # as plugins says


def test_a_plugin_whose_hook_raises_is_broken_exit_2(capsys, broken_plugin):
    code, out, err = run_cli(capsys, "plugins")
    assert code == ExitCode.USAGE
    (row,) = [line for line in out.splitlines() if line.startswith("raises ")]
    assert " broken " in row
    assert "no fragment today" in err


def test_a_file_over_the_default_validated_alone_says_how_to_layer_it(capsys, tmp_path):
    mine = tmp_path / "my.yaml"
    mine.write_text("version: 1\nbackends:\n  my_attn:\n    inherits: base\n    doc: x\n")
    code, _, err = run_cli(capsys, "validate", str(mine))
    assert code == ExitCode.CHECK_FAILED
    (line,) = err.splitlines()
    assert "unknown backend 'base'" in line
    assert f"warpolicy validate default {mine}" in line and "--base, default" in line
    code, _, err = run_cli(capsys, "validate", "default", str(mine))
    assert code == ExitCode.OK, err
    code, _, err = run_cli(
        capsys, "query", "--backend", "my_attn", "--mode", "decode", "--capabilities", str(mine)
    )
    assert code == ExitCode.USAGE and "--capabilities default --capabilities" in err


@pytest.mark.parametrize(
    "argv, start",
    [
        (["frobnicate"], "warpolicy: argument COMMAND: invalid choice"),
        (["query", "--mode", "decode"], "warpolicy query: the following arguments are required"),
        (["bench", "decide", "--iterations", "0"], "warpolicy bench decide: argument --iterations"),
        (["diff", "default"], "warpolicy diff: expected OLD NEW"),
        (["validate", "--base", "default", "x.yaml"], "warpolicy validate: --base applies"),
    ],
)
def test_usage_errors_name_the_command_once(capsys, argv, start):
    code, out, err = run_cli(capsys, *argv)
    assert code == ExitCode.USAGE and out == ""
    (line,) = err.splitlines()
    assert line.startswith(start), line
    assert "warpolicy: warpolicy" not in line


def test_validate_json(capsys, tmp_path):
    good = tmp_path / "good.yaml"
    good.write_text("version: 1\n")
    bad = tmp_path / "bad.yaml"
    bad.write_text("version: 1\nbackends:\n  x:\n    reads_end: {decode: soon}\n    doc: x\n")
    code, out, err = run_cli(capsys, "validate", str(good), "--format", "json")
    doc = json.loads(out)
    assert code == ExitCode.OK and err == ""
    assert doc["schema_version"] == 1 and doc["valid"] and doc["exit_code"] == 0
    code, out, _ = run_cli(capsys, "validate", "--each", str(good), str(bad), "--format", "json")
    doc = json.loads(out)
    assert code == ExitCode.CHECK_FAILED and doc["exit_code"] == 1 and not doc["valid"]
    assert [len(c["problems"]) for c in doc["checks"]] == [0, 1]
    problem = doc["checks"][1]["problems"][0]
    assert (problem["file"], problem["line"], problem["unreadable"]) == (str(bad), 4, False)
    code, out, _ = run_cli(capsys, "validate", str(tmp_path / "missing.yaml"), "--format", "json")
    assert code == ExitCode.USAGE and json.loads(out)["checks"][0]["problems"][0]["unreadable"]
