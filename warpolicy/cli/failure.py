"""How a command that could not finish says so: one line of text on stderr, or, when the command
line asked for ``--format json``, one JSON object on stderr (stdout stays the data's alone).

The object (``schema_version`` 1)::

    {"schema_version": 1,
     "error": {"kind": "registry", "message": "...", "command": "warpolicy query",
               "exit_code": 2, "location": {"file": "caps.yaml", "line": 3, "col": 5},
               "problems": [{"file": ..., "line": ..., "col": ..., "message": ...}]}}

``kind`` is one of `KINDS`; ``location`` is the first problem's place in a registry file, the
argument argparse refused (``{"argument": "--format"}``) or the plugin that failed
(``{"plugin": NAME, "entry_point": ...}``), else null. The exit code is the one the text mode
returns (`warpolicy.cli.common.ExitCode`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

import attrs

from warpolicy.errors import Problem

__all__ = ["KINDS", "SCHEMA_VERSION", "Failure", "wants_json"]

SCHEMA_VERSION = 1

#: What went wrong, coarsely: ``usage`` (the command line), ``unknown_name`` (a backend, mode,
#: flag, fact or plugin that does not exist), ``input`` (a malformed value or variable),
#: ``registry`` (located problems in registry files), ``plugin`` (a plugin failed), ``cuda``
#: (no CUDA device), ``missing_dependency`` (no torch), ``error`` (another known error),
#: ``output`` (stdout could not take the output), ``interrupted``, ``exit_called`` (a plugin
#: hook called sys.exit).
KINDS = (
    "usage",
    "unknown_name",
    "input",
    "registry",
    "plugin",
    "cuda",
    "missing_dependency",
    "error",
    "output",
    "interrupted",
    "exit_called",
)

#: argparse's messages that name the argument they refuse: "argument --format: invalid choice",
#: "the following arguments are required: --mode, --backend" (the first is the location).
_ARGUMENT = re.compile(
    r"^(?:argument |the following arguments are required: |unrecognized arguments: )([^\s,:]+)"
)


@attrs.frozen
class Failure:
    """One failed command: what the text mode prints (``text``) and the JSON mode's fields."""

    kind: str = attrs.field(validator=attrs.validators.in_(KINDS))
    command: str
    exit_code: int
    text: str  # the line(s) the text mode prints, without the trailing newline
    message: str  # the message alone (no command prefix)
    problems: tuple[Problem, ...] = ()
    location: dict[str, Any] | None = None
    details: dict[str, Any] = attrs.field(factory=dict)

    @classmethod
    def usage(cls, prog: str, message: str, exit_code: int) -> Failure:
        """argparse refused the command line; the location is the argument it names."""
        named = _ARGUMENT.match(message)
        where = {"argument": named.group(1)} if named else None
        return cls("usage", prog, exit_code, f"{prog}: {message}", message, location=where)

    @classmethod
    def registry(cls, command: str, problems: Sequence[Problem], exit_code: int) -> Failure:
        first = problems[0] if problems else None
        where = (
            {"file": first.file, "line": first.line or None, "col": first.col or None}
            if first is not None
            else None
        )
        text = "\n".join(str(p) for p in problems)
        message = (
            str(first)
            if len(problems) == 1
            else f"{len(problems)} problems in the registry; the first: {first}"
        )
        return cls("registry", command, exit_code, text, message, tuple(problems), where)

    def render(self, as_json: bool) -> str:
        """The text lines, or the JSON object on one line."""
        return self.json() if as_json else self.text

    def json(self) -> str:
        error: dict[str, Any] = {
            "kind": self.kind,
            "message": self.message,
            "command": self.command,
            "exit_code": int(self.exit_code),
            "location": self.location,
        }
        if self.problems:
            error["problems"] = [
                {"file": p.file, "line": p.line or None, "col": p.col or None, "message": p.message}
                for p in self.problems
            ]
        error.update(self.details)
        return json.dumps({"schema_version": SCHEMA_VERSION, "error": error}, default=str)


def wants_json(argv: Sequence[str]) -> bool:
    """The command line asks for JSON output (its last ``--format json`` or ``--format=json``),
    read from the words themselves so a line argparse refuses is answered in JSON too. Words
    after ``--`` are operands, not options."""
    words = list(argv)
    chosen = None
    for i, word in enumerate(words):
        if word == "--":
            break
        if word.startswith("--format="):
            chosen = word.partition("=")[2]
        elif word == "--format" and i + 1 < len(words):
            chosen = words[i + 1]
    return chosen == "json"
