"""The fenced code blocks of README.md and docs/*.md, with the marks docs/README.md documents.

Read by `tests/docs/test_code_blocks.py`; `tests/docs/session.py` runs one file's blocks as
one session."""

from __future__ import annotations

import pathlib
import re

import attrs

ROOT = pathlib.Path(__file__).resolve().parents[1]

#: languages whose blocks run; every other language (yaml, toml, text, json, ...) is shown only
PYTHON = frozenset({"python", "py"})
SHELL = frozenset({"console", "bash", "sh", "shell"})

#: the marks a block may carry (docs/README.md, "Code blocks in these docs run")
SKIP_MARKS = {"cuda": "needs a CUDA device", "fragment": "a fragment of a larger program"}

_FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})(?P<info>[^`\n]*)$")
_MARK = re.compile(r"^\s*<!--\s*docs:\s*(?P<kind>[a-z-]+)\s*(?P<arg>.*?)\s*-->\s*$")


class MarkError(ValueError):
    """A `<!-- docs: ... -->` comment this test does not know (named by file and line)."""


@attrs.frozen
class Block:
    path: str  # relative to the repository root
    line: int  # of the opening fence, 1-based
    language: str
    text: str
    skip: str | None = None  # the reason, for a marked block
    write: str | None = None  # `docs: write PATH`

    @property
    def where(self) -> str:
        return f"{self.path}:{self.line}"

    @property
    def runs(self) -> bool:
        return self.skip is None and (self.write is not None or self.language in PYTHON | SHELL)


def _mark(path: str, number: int, line: str) -> tuple[str, str] | None:
    found = _MARK.match(line)
    if found is None:
        if re.match(r"^\s*<!--\s*docs:", line):
            raise MarkError(f"{path}:{number}: malformed docs mark: {line.strip()}")
        return None
    kind, arg = found["kind"], found["arg"]
    if kind in SKIP_MARKS and not arg:
        return kind, SKIP_MARKS[kind]
    if kind == "skip" and arg:
        return kind, arg
    if kind == "write" and arg and " " not in arg and not arg.startswith(("/", "..")):
        return kind, arg
    raise MarkError(
        f"{path}:{number}: unknown docs mark: {line.strip()} (docs/README.md lists them)"
    )


def blocks_of(path: pathlib.Path) -> list[Block]:
    rel = path.relative_to(ROOT).as_posix() if path.is_relative_to(ROOT) else path.as_posix()
    lines = path.read_text(encoding="utf-8").split("\n")
    found: list[Block] = []
    i = 0
    while i < len(lines):
        opening = _FENCE.match(lines[i])
        if opening is None:
            i += 1
            continue
        indent, fence = opening["indent"], opening["fence"]
        language = opening["info"].strip().split(" ")[0].lower()
        mark = None
        back = i - 1
        while back >= 0 and not lines[back].strip():
            back -= 1
        if back >= 0:
            mark = _mark(rel, back + 1, lines[back])
        end = i + 1
        while end < len(lines) and not (
            lines[end].strip().startswith(fence[0] * len(fence))
            and lines[end].strip().strip(fence[0]) == ""
        ):
            end += 1
        body = [
            line[len(indent) :] if line.startswith(indent) else line for line in lines[i + 1 : end]
        ]
        text = "\n".join(body) + "\n"
        skip = write = None
        if mark is not None:
            kind, arg = mark
            if kind == "write":
                write = arg
            else:
                skip = f"{kind}: {arg}" if kind in SKIP_MARKS else arg
        found.append(Block(rel, i + 1, language, text, skip, write))
        i = end + 1
    return found


def documents() -> list[pathlib.Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def console_commands(text: str) -> list[tuple[str, list[str]]]:
    """A console block's commands, each with the output lines shown after it."""
    commands: list[tuple[str, list[str]]] = []
    lines = text.rstrip("\n").split("\n")
    i = 0
    while i < len(lines):
        line = lines[i]
        if not line.startswith("$ "):
            if commands:
                commands[-1][1].append(line)
            elif line.strip():
                raise ValueError(f"output before the first command: {line!r}")
            i += 1
            continue
        command = line[2:]
        while command.endswith("\\") and i + 1 < len(lines):
            i += 1
            command = command[:-1] + "\n" + lines[i]
        commands.append((command, []))
        i += 1
    return commands
