"""``--format json`` errors: one JSON object on stderr with the error, its location and the
exit code the text mode returns; stdout stays empty."""

from __future__ import annotations

import json
import sys

import pytest

from warpolicy.cli import failure
from warpolicy.cli.failure import Failure, wants_json
from warpolicy.cli.main import TORCH_HINT, ExitCode, main
from warpolicy.errors import Problem

BAD_REGISTRY = "backends:\n  x: 3\n"

#: (argv without --format, what the JSON error must say) for each kind of failure
CASES = {
    "usage": (["query", "--backend", "fa3"], {"kind": "usage", "location": {"argument": "--mode"}}),
    "bad choice": (
        ["query", "--backend", "fa3", "--mode", "decode", "--platform", "cuda", "--spec"],
        {"kind": "usage", "location": {"argument": "--spec"}},
    ),
    "unknown name": (
        ["query", "--backend", "fa33", "--mode", "decode"],
        {"kind": "unknown_name", "name": "fa33", "name_kind": "backend"},
    ),
    "bad value": (
        ["query", "--backend", "fa3", "--mode", "decode", "--flag", "force_coarse=maybe"],
        {"kind": "input"},
    ),
}


def run(capsys, argv):
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("name", sorted(CASES))
def test_json_errors_keep_the_text_modes_exit_code(capsys, name):
    argv, expected = CASES[name]
    text_code, text_out, text_err = run(capsys, argv)
    code, out, err = run(capsys, [*argv, "--format", "json"])
    assert text_code == code == ExitCode.USAGE
    assert out == "" == text_out
    assert text_err.count("\n") == 1 and not text_err.startswith("{")
    doc = json.loads(err)
    assert doc["schema_version"] == failure.SCHEMA_VERSION
    error = doc["error"]
    assert error["exit_code"] == code and error["command"].startswith("warpolicy")
    assert error["message"] and error["message"] in text_err
    for key, value in expected.items():
        assert error[key] == value, (key, error)


def test_registry_problems_are_located(capsys, tmp_path):
    path = tmp_path / "caps.yaml"
    path.write_text(BAD_REGISTRY)
    argv = ["table", "--capabilities", str(path)]
    text_code, _, text_err = run(capsys, argv)
    code, out, err = run(capsys, [*argv, "--format=json"])
    assert code == text_code == ExitCode.USAGE and out == ""
    error = json.loads(err)["error"]
    assert error["kind"] == "registry"
    assert error["location"] == {"file": str(path), "line": 1, "col": 1}
    problems = error["problems"]
    assert len(problems) == len(text_err.strip().splitlines()) == 2
    assert {(p["line"], p["col"]) for p in problems} == {(1, 1), (2, 6)}
    assert all(f"{p['file']}:{p['line']}:{p['col']}: {p['message']}" in text_err for p in problems)


def test_an_unreadable_registry_has_no_line(capsys, tmp_path):
    code, _, err = run(
        capsys, ["table", "--capabilities", str(tmp_path / "absent.yaml"), "--format", "json"]
    )
    error = json.loads(err)["error"]
    assert code == ExitCode.USAGE and error["location"]["line"] is None


def test_a_missing_torch_is_a_json_error_too(capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)  # import torch raises ModuleNotFoundError
    code, out, err = run(
        capsys, ["audit", "--synthetic", "in_graph", "--device", "sim", "--format", "json"]
    )
    error = json.loads(err)["error"]
    assert code == ExitCode.USAGE and out == ""
    assert error["kind"] == "missing_dependency" and error["message"] == TORCH_HINT


def test_an_interrupt_keeps_exit_130(capsys, monkeypatch):
    from warpolicy.cli import decide

    def interrupted(args):
        raise KeyboardInterrupt

    monkeypatch.setattr(decide, "cmd_query", interrupted)
    code, _, err = run(
        capsys, ["query", "--backend", "fa3", "--mode", "decode", "--format", "json"]
    )
    assert code == ExitCode.INTERRUPTED == json.loads(err)["error"]["exit_code"]
    assert json.loads(err)["error"]["kind"] == "interrupted"


def test_a_bug_keeps_its_traceback(monkeypatch):
    from warpolicy.cli import decide

    def broken(args):
        raise ZeroDivisionError("a bug")

    monkeypatch.setattr(decide, "cmd_query", broken)
    with pytest.raises(ZeroDivisionError):
        main(["query", "--backend", "fa3", "--mode", "decode", "--format", "json"])


@pytest.mark.parametrize(
    "argv, expected",
    [
        (["--format", "json"], True),
        (["--format=json"], True),
        (["--format", "json", "--format", "text"], False),
        (["--format", "text", "--format=json"], True),
        (["--", "--format", "json"], False),
        (["--format"], False),
        (["query"], False),
    ],
)
def test_wants_json_reads_the_last_format_before_operands(argv, expected):
    assert wants_json(argv) is expected


def test_failure_json_carries_every_problem():
    problems = [Problem("a.yaml", 3, 5, "bad"), Problem("<plugin x>", 0, 0, "worse")]
    doc = json.loads(Failure.registry("warpolicy validate", problems, 2).json())
    assert doc["error"]["location"] == {"file": "a.yaml", "line": 3, "col": 5}
    assert doc["error"]["problems"][1] == {
        "file": "<plugin x>",
        "line": None,
        "col": None,
        "message": "worse",
    }
    assert "2 problems" in doc["error"]["message"]
    with pytest.raises(ValueError):
        Failure("nonsense", "warpolicy", 2, "x", "x")


def test_a_broken_plugin_is_a_located_json_error(capsys, broken_plugin):
    for argv in (["plugins"], ["query", "--backend", "fa3", "--mode", "decode"]):
        text_code, _, text_err = run(capsys, argv)
        code, out, err = run(capsys, [*argv, "--format", "json"])
        assert code == text_code == ExitCode.USAGE
        (line,) = err.splitlines()
        error = json.loads(line)["error"]
        assert error["kind"] == "plugin" and error["location"]["plugin"] == "raises"
        assert "no fragment today" in error["message"] and "no fragment today" in text_err
        assert (out == "") == (argv[0] == "query")  # plugins still lists every plugin
