"""Every code block in README.md and docs/*.md runs as written, on the CPU (issue 27 item 8).

One test per block: a runnable block passes when its document's session ran it without error
(`session.py`, one fresh interpreter per document, blocks in order); a block marked
`cuda`/`fragment`/`skip` is reported as skipped with its reason, so the summary counts them.
docs/README.md, "Code blocks in these docs run", is the user-facing contract."""

from __future__ import annotations

import functools
import importlib.util
import json
import os
import pathlib
import subprocess
import sys
import tempfile

import pytest

from warpolicy.cli.main import TORCH_HINT

from doc_blocks import (
    ROOT,
    Block,
    MarkError,
    blocks_of,
    console_commands,
    documents,
)

SESSION = pathlib.Path(__file__).with_name("session.py")
SESSION_TIMEOUT_S = 900
HAS_TORCH = importlib.util.find_spec("torch") is not None


def _all_blocks() -> list[Block]:
    return [b for doc in documents() for b in blocks_of(doc)]


def _scratch(tmp: pathlib.Path) -> pathlib.Path:
    """A directory holding the repository's top-level entries (links), a `warpolicy` command
    that runs this interpreter, and room for the files a session writes."""
    work = tmp / "work"
    work.mkdir()
    for entry in ROOT.iterdir():
        if entry.name not in {".git", ".nox", ".venv"}:
            (work / entry.name).symlink_to(entry)
    bindir = tmp / "bin"
    bindir.mkdir()
    shim = bindir / "warpolicy"
    shim.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m warpolicy "$@"\n')
    shim.chmod(0o755)
    (bindir / "python").symlink_to(sys.executable)
    (bindir / "python3").symlink_to(sys.executable)
    return work


@functools.cache
def session(doc: str) -> dict[str, dict[str, object]]:
    with tempfile.TemporaryDirectory(prefix="warpolicy-docs-") as tmp:
        work = _scratch(pathlib.Path(tmp))
        env = {k: v for k, v in os.environ.items() if not k.startswith("WARPOLICY_")}
        if "WARPOLICY_SGLANG_DIR" in os.environ:  # where the kernel files are, not a setting
            env["WARPOLICY_SGLANG_DIR"] = os.environ["WARPOLICY_SGLANG_DIR"]
        env["PATH"] = f"{work.parent / 'bin'}{os.pathsep}{env.get('PATH', '')}"
        env["PYTHONPATH"] = os.pathsep.join(  # the repository, and tests/ for doc_blocks
            [str(ROOT), str(ROOT / "tests"), *filter(None, [os.environ.get("PYTHONPATH")])]
        )
        env["COLUMNS"] = "250"  # wide enough for every table the docs show
        result = pathlib.Path(tmp) / "result.json"
        done = subprocess.run(
            [sys.executable, str(SESSION), doc, str(result)],
            cwd=work,
            env=env,
            capture_output=True,
            text=True,
            timeout=SESSION_TIMEOUT_S,
            check=False,
        )
        if done.returncode != 0 or not result.exists():
            raise AssertionError(f"the session of {doc} crashed:\n{done.stdout}{done.stderr}")
        return json.loads(result.read_text(encoding="utf-8"))


BLOCKS = _all_blocks()


@pytest.mark.parametrize("block", [b for b in BLOCKS if b.runs or b.skip], ids=lambda b: b.where)
def test_the_block_runs_as_written(block: Block) -> None:
    if block.skip is not None:
        pytest.skip(f"marked in the document: {block.skip}")
    results = session(block.path)
    outcome = results.get(block.where)
    stopped_by_torch = not HAS_TORCH and any(_needs_torch(r) for r in results.values())
    if stopped_by_torch and (outcome is None or _needs_torch(outcome)):
        pytest.skip("needs torch, which is not installed (this block or one before it)")
    assert outcome is not None, f"{block.where}: not reached (an earlier block failed)"
    assert outcome["ok"], f"{block.where}:\n{outcome['error']}"


def _needs_torch(outcome: dict[str, object]) -> bool:
    """The block stopped for want of torch: an import, or a CLI command's one-line hint."""
    error = str(outcome["error"])
    return not outcome["ok"] and ("No module named 'torch'" in error or TORCH_HINT in error)


def test_every_document_has_blocks_that_run() -> None:
    """The collection itself: a reader of these guides gets code that CI ran."""
    runnable = {b.path for b in BLOCKS if b.runs}
    assert {"README.md", "docs/integrating.md", "docs/canary.md"} <= runnable


# -- the parser: positive controls (a block it misses would never fail) ----------------------


def _doc(tmp_path: pathlib.Path, text: str) -> list[Block]:
    path = tmp_path / "doc.md"
    path.write_text(text, encoding="utf-8")
    return blocks_of(path)


def test_marks_and_languages_are_read(tmp_path: pathlib.Path) -> None:
    found = _doc(
        tmp_path,
        "x\n\n```python\nprint(1)\n```\n\n<!-- docs: cuda -->\n```python\nimport torch\n```\n"
        "<!-- docs: fragment -->\n\n```console\n$ x\n```\n<!-- docs: write a/b.yaml -->\n"
        "```yaml\nversion: 1\n```\n\n```yaml\nshown: only\n```\n"
        "   ```bash\n   echo indented\n   ```\n<!-- docs: skip installs packages -->\n```sh\npip\n```\n",
    )
    assert [(b.language, b.skip, b.write, b.runs) for b in found] == [
        ("python", None, None, True),
        ("python", "cuda: needs a CUDA device", None, False),
        ("console", "fragment: a fragment of a larger program", None, False),
        ("yaml", None, "a/b.yaml", True),
        ("yaml", None, None, False),
        ("bash", None, None, True),
        ("sh", "installs packages", None, False),
    ]
    assert found[5].text == "echo indented\n"
    assert found[0].line == 3


@pytest.mark.parametrize(
    "mark",
    ["<!-- docs: cdua -->", "<!-- docs: skip -->", "<!-- docs: write /etc/x -->", "<!-- docs:-->"],
)
def test_an_unknown_mark_is_an_error(tmp_path: pathlib.Path, mark: str) -> None:
    with pytest.raises(MarkError, match=r"\.md:1: "):
        _doc(tmp_path, f"{mark}\n```python\npass\n```\n")


def test_console_blocks_split_commands_and_output() -> None:
    text = "$ warpolicy table \\\n  --backend x\nrow 1\nrow 2\n$ true\n"
    assert console_commands(text) == [
        ("warpolicy table \n  --backend x", ["row 1", "row 2"]),
        ("true", []),
    ]
    with pytest.raises(ValueError, match="output before"):
        console_commands("output\n$ cmd\n")


def test_a_failing_block_fails_its_test(tmp_path: pathlib.Path) -> None:
    """The negative control: a block that raises, a command that exits 1 and a command whose
    output differs from the document are each reported as failures, and the session stops."""
    doc = tmp_path / "doc.md"
    doc.write_text(
        "```python\nx = 1\n```\n```python\nassert x == 2, 'x is 1'\n```\n```python\npass\n```\n",
        encoding="utf-8",
    )
    rel = doc.as_posix()
    results = session.__wrapped__(rel)
    assert results[f"{rel}:1"]["ok"] is True
    assert results[f"{rel}:4"]["ok"] is False and "x is 1" in str(results[f"{rel}:4"]["error"])
    assert f"{rel}:7" not in results  # not reached
    doc.write_text(
        "```console\n$ echo hello\nhullo\n```\n```console\n$ false\n```\n", encoding="utf-8"
    )
    results = session.__wrapped__(rel)
    assert results[f"{rel}:1"]["ok"] is False and "the document shows" in str(
        results[f"{rel}:1"]["error"]
    )
    doc.write_text(
        "```console\n$ echo hello\nhello\n```\n```sh\nfalse\necho after\n```\n", encoding="utf-8"
    )
    results = session.__wrapped__(rel)
    assert results[f"{rel}:1"]["ok"] is True
    assert results[f"{rel}:5"]["ok"] is False
    doc.write_text("```console\n$ false  # exit 1\n$ true  # exit 1\n```\n", encoding="utf-8")
    results = session.__wrapped__(rel)
    assert results[f"{rel}:1"]["ok"] is False  # true exited 0 where the document says 1
    assert "the document expects 1" in str(results[f"{rel}:1"]["error"])
