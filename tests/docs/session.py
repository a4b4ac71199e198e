"""Run one document's code blocks as one session: ``python session.py DOC RESULT_JSON``.

Run by `test_code_blocks.py` (with ``tests/`` on ``PYTHONPATH``) in a fresh interpreter whose
working directory is the session's scratch directory: the `python` blocks share one namespace,
in order, with the shell blocks between them; the first block that fails ends the session
(later blocks are "not reached"). Writes ``{where: {"ok": bool, "error": str}}`` for every
block it ran."""

from __future__ import annotations

import json
import pathlib
import re
import subprocess
import sys
import traceback

from doc_blocks import PYTHON, ROOT, blocks_of, console_commands

SHELL_TIMEOUT_S = 300
#: a console command's expected exit status, when not 0: a trailing ``# exit N``
_EXIT = re.compile(r"#\s*exit (?P<code>\d+)\s*$")


def _normalized(lines: list[str]) -> list[str]:
    out = [line.rstrip() for line in lines]
    while out and not out[-1]:
        out.pop()
    return out


#: commands a document may show but a test must never run: they change the environment
_INSTALLS = re.compile(r"\b(pip3?|uv|pre-commit)\s+(install|uninstall)\b|\bpython3?\s+-m\s+pip\b")


def run_shell(language: str, text: str) -> None:
    if _INSTALLS.search(text):
        raise AssertionError(
            "the block installs or removes packages; mark it "
            "<!-- docs: skip installs packages --> (docs/README.md)"
        )
    if language != "console":
        done = subprocess.run(
            ["bash", "-euo", "pipefail", "-c", text],
            capture_output=True,
            text=True,
            timeout=SHELL_TIMEOUT_S,
            check=False,
        )
        if done.returncode != 0:
            raise AssertionError(f"exit {done.returncode}\n{done.stdout}{done.stderr}")
        return
    for command, shown in console_commands(text):
        expected_exit = _EXIT.search(command)
        want = int(expected_exit["code"]) if expected_exit else 0
        done = subprocess.run(
            ["bash", "-euo", "pipefail", "-c", command],
            capture_output=True,
            text=True,
            timeout=SHELL_TIMEOUT_S,
            check=False,
        )
        if done.returncode != want:
            raise AssertionError(
                f"$ {command}\nexit {done.returncode} (the document expects {want})\n"
                f"{done.stdout}{done.stderr}"
            )
        expected = _normalized(shown)
        if expected and _normalized(done.stdout.split("\n")) != expected:
            raise AssertionError(
                f"$ {command}\nprinted:\n{done.stdout}\nthe document shows:\n" + "\n".join(shown)
            )


def main(doc: str, result_path: str) -> int:
    results: dict[str, dict[str, object]] = {}
    namespace: dict[str, object] = {"__name__": "__docs__"}
    for block in blocks_of(ROOT / doc):
        if not block.runs:
            continue
        try:
            if block.write is not None:
                target = pathlib.Path(block.write)
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_text(block.text, encoding="utf-8")
            elif block.language in PYTHON:
                # the line numbers of a traceback are the document's
                code = compile("\n" * block.line + block.text, block.where, "exec")
                exec(code, namespace)
            else:
                run_shell(block.language, block.text)
        except BaseException:  # noqa: BLE001 - reported per block; the session ends here
            results[block.where] = {"ok": False, "error": traceback.format_exc(limit=-8)}
            break
        results[block.where] = {"ok": True, "error": ""}
    pathlib.Path(result_path).write_text(json.dumps(results), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
