"""Per-batch facts on the command line: ``--fact NAME=VALUE`` on query, explain, table and diff
(one-line errors, exit 2), table's ``per batch`` column and JSON ``per_batch``, explain's fact
lines, and validate's router warning under ``--each`` (the pre-commit hook)."""

from __future__ import annotations

import json

import pytest

from warpolicy.cli.main import ExitCode, main

PREFILL = ("--flag", "prefill_read_done=1")


def run_cli(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def query(capsys, *argv) -> str:
    code, out, err = run_cli(capsys, "query", "--backend", "dsv4", "--mode", "extend", *argv)
    assert code == ExitCode.OK, err
    return out.split()[0]


def test_query_decides_for_the_batch_given(capsys):
    """DeepSeek-V4's prefill (SGLang 0.5.23): pre_replay up to 11673 query tokens, above only
    after its sparse-prefill snapshot; a batch that reports nothing is none (fail closed)."""
    assert query(capsys, *PREFILL) == "none"
    assert query(capsys, *PREFILL, "--fact", "num_qo_tokens=11673") == "pre_replay"
    assert query(capsys, *PREFILL, "--fact", "num_qo_tokens=11674") == "none"
    both = ("--fact", "num_qo_tokens=20000", "--fact", "sparse_prefill_snapshot=true")
    assert query(capsys, *PREFILL, *both) == "pre_replay"


@pytest.mark.parametrize(
    "item, message",
    [
        ("num_qo_token=5", "unknown fact 'num_qo_token'; did you mean 'num_qo_tokens'?"),
        ("num_qo_tokens=many", "fact num_qo_tokens='many': expected an integer"),
        ("num_qo_tokens", "--fact 'num_qo_tokens': expected NAME=VALUE"),
        ("num_qo_tokens=", "--fact 'num_qo_tokens=': empty value; expected NAME=VALUE"),
        ("image_prefill_route=video", "expected a name among image, text"),
        ("sparse_prefill_snapshot=maybe", "is not a boolean"),
    ],
)
@pytest.mark.parametrize("command", ["query", "explain", "table", "diff"])
def test_a_bad_fact_is_one_line_and_exit_2(capsys, command, item, message):
    argv = {
        "query": ["query", "--backend", "dsv4", "--mode", "extend"],
        "explain": ["explain", "--backend", "dsv4", "--mode", "extend"],
        "table": ["table", "--backend", "dsv4"],
        "diff": ["diff", "default", "default", "--mode", "extend"],
    }[command]
    code, out, err = run_cli(capsys, *argv, "--fact", item)
    assert code == ExitCode.USAGE
    assert out == "" and len(err.splitlines()) == 1 and "Traceback" not in err
    assert message in err, err


def test_table_shows_per_batch_cells_as_a_condition(capsys):
    argv = ("table", "--backend", "dsv4", "--backend", "fa3", "--mode", "extend", "--spec", "none")
    code, out, err = run_cli(capsys, *argv, *PREFILL)
    assert code == ExitCode.OK, err
    assert "per batch" in out.splitlines()[0]
    dsv4 = next(line for line in out.splitlines() if line.startswith("dsv4"))
    assert "none*" in dsv4 and "pre_replay when num_qo_tokens <= 11673" in dsv4
    fa3 = next(line for line in out.splitlines() if line.startswith("fa3"))
    assert fa3.split()[3] in ("none", "pre_replay") and fa3.rstrip().endswith("-")
    assert "* varies per batch" in out
    code, out, _ = run_cli(capsys, *argv, *PREFILL, "--format", "json")
    rows = {r["backend"]: r for r in json.loads(out)["rows"]}
    assert {"policy": "pre_replay", "when": ["num_qo_tokens <= 11673"]} in rows["dsv4"]["per_batch"]
    assert "per_batch" not in rows["fa3"]
    # markdown keeps the column too
    code, out, _ = run_cli(capsys, *argv, *PREFILL, "--format", "markdown")
    assert "| per batch |" in out.splitlines()[0]


def test_table_with_facts_decides_for_that_batch(capsys):
    argv = ("table", "--backend", "dsv4", "--mode", "extend", "--spec", "none", *PREFILL)
    code, out, _ = run_cli(capsys, *argv, "--fact", "num_qo_tokens=100", "--format", "json")
    (row,) = json.loads(out)["rows"]
    assert row["policy"] == "pre_replay" and "per_batch" not in row
    code, out, _ = run_cli(capsys, *argv, "--fact", "num_qo_tokens=20000", "--format", "json")
    (row,) = json.loads(out)["rows"]
    assert row["policy"] == "none"
    assert [c["when"] for c in row["per_batch"]] == [
        ["sparse_prefill_snapshot succeeded"],
        ["sparse_prefill_snapshot did not succeed"],
    ]
    code, out, _ = run_cli(capsys, "table", "--backend", "fa3", "--mode", "decode")
    assert "per batch" not in out  # no cell varies: no column


@pytest.mark.parametrize("fmt", ["text", "markdown"])
def test_explain_prints_the_facts_read_and_the_cases(capsys, fmt):
    argv = ("explain", "--backend", "dsv4", "--mode", "extend", *PREFILL, "--format", fmt)
    code, out, err = run_cli(capsys, *argv, "--fact", "num_qo_tokens=20000")
    assert code == ExitCode.OK, err
    assert "fact num_qo_tokens is 20000" in out
    assert "fact sparse_prefill_snapshot did not succeed" in out
    assert "per batch: pre_replay when sparse_prefill_snapshot succeeded" in out
    code, out, _ = run_cli(capsys, "explain", "--backend", "fa3", "--mode", "decode")
    assert "per batch:" not in out and "fact " not in out


def test_diff_holds_a_given_fact(capsys, tmp_path):
    """A raised threshold is an earlier cell for the batches in between; holding the fact at a
    value outside them compares only those batches."""
    layer = tmp_path / "raise.yaml"
    text = (
        "version: 1\nbackends:\n  dsv4:\n    override: true\n    inherits: base\n"
        "    reads_end: {extend: pre_replay}\n    gates:\n"
        "      - id: big\n        when: {mode: extend, facts: {num_qo_tokens: {gt: 20000}}}\n"
        "        at_least: none\n        because: x\n    doc: x\n"
    )
    layer.write_text(text.replace("20000", "11673"))
    old = f"default:{layer}"
    new_layer = tmp_path / "raised.yaml"
    new_layer.write_text(text)
    new = f"default:{new_layer}"
    base = ("diff", old, new, "--mode", "extend", *PREFILL, "--plugins", "none")
    code, out, err = run_cli(capsys, *base, "--fail-on", "earlier")
    assert code == ExitCode.CHECK_FAILED, out + err
    assert "11674 <= num_qo_tokens <= 20000" in out
    code, out, err = run_cli(capsys, *base, "--fact", "num_qo_tokens=100", "--fail-on", "earlier")
    assert code == ExitCode.OK, out + err
    assert "held: num_qo_tokens = 100: given" in out


ROUTER = """\
version: 1
facts:
  route:
    type: name
    doc: which child runs this batch
backends:
  text_only:
    reads_end: {extend: pre_replay}
    doc: x
  images:
    reads_end: {extend: none}
    doc: x
  router:
    routes: {fact: route, children: {text: text_only, image: images}}
    doc: a per-batch router that does not declare pinned
"""


@pytest.mark.parametrize("each", [False, True])
def test_validate_warns_about_an_unpinned_router(capsys, tmp_path, each):
    """Issue 21 item 3: the router warning reaches the pre-commit hook's `validate --each`."""
    path = tmp_path / "router.yaml"
    path.write_text(ROUTER)
    argv = ("validate", "--each", str(path)) if each else ("validate", str(path))
    code, out, err = run_cli(capsys, *argv)
    assert code == ExitCode.OK, err
    (line,) = err.splitlines()
    assert line.startswith(f"warpolicy: warning: {path}:")
    assert "backends.router.routes" in line and "pinned: true" in line
    code, out, _ = run_cli(capsys, *argv, "--format", "json")
    (check,) = json.loads(out)["checks"]
    (warning,) = check["warnings"]
    assert warning["file"] == str(path) and "pinned: true" in warning["message"]
    pinned = tmp_path / "pinned.yaml"
    pinned.write_text(ROUTER.replace("image: images}", "image: images}, pinned: true"))
    code, out, err = run_cli(capsys, "validate", "--each", str(pinned))
    assert code == ExitCode.OK and err == "", err


MANY = """\
version: 1
facts:
{facts}
backends:
  only:
    reads_end: {{decode: {policy}}}
    doc: x
gates:
  - id: many
    when: {{mode: decode, facts: {{{tests}}}}}
    at_least: none
    because: x
"""


def many_actions(tmp_path, name: str, policy: str) -> str:
    names = [f"a{i}" for i in range(9)]  # 2**9 = 512 combinations of classes > 256
    text = MANY.format(
        facts="\n".join(f"  {n}: {{type: action, doc: x}}" for n in names),
        policy=policy,
        tests=", ".join(f"{n}: false" for n in names),
    )
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_a_column_that_cannot_be_compared_fails_the_gate(capsys, tmp_path):
    """Fail closed: a change in a column with too many classes of batch fails the gate (never
    a pass), even a later one; holding facts compares it, and then it passes."""
    old = many_actions(tmp_path, "old.yaml", "post_replay")
    new = many_actions(tmp_path, "new.yaml", "none")  # later for every batch
    argv = ("diff", old, new, "--plugins", "none", "--mode", "decode")
    code, out, err = run_cli(capsys, *argv, "--fail-on", "earlier")
    assert code == ExitCode.CHECK_FAILED, out + err
    assert "cannot compare decode spec none: 512 combinations of per-batch fact classes" in out
    code, out, _ = run_cli(capsys, *argv, "--format", "json")
    summary = json.loads(out)["summary"]
    assert summary["needs_audit"] and summary["uncompared"]
    held = [x for i in range(2) for x in ("--fact", f"a{i}=false")]
    code, out, err = run_cli(capsys, *argv, *held, "--fail-on", "earlier")
    assert code == ExitCode.OK, out + err
    # validate's layer report names the layer instead of calling it safe
    layer = tmp_path / "layer.yaml"
    layer.write_text(
        "version: 1\nbackends:\n  only:\n    override: true\n"
        "    reads_end: {decode: none}\n    doc: x\n"
    )
    code, out, err = run_cli(capsys, "validate", old, str(layer))
    assert code == ExitCode.OK
    assert f"warpolicy: warning: layer {layer}: cannot be compared" in err
