"""Errors the CLI turns into one line and a documented exit code.

Everything a user can cause (bad names, bad files, broken plugins, no CUDA) raises a
subclass of `WarpolicyError`; anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Sequence

import attrs

from warpolicy import environment


class WarpolicyError(Exception):
    """Base of every error that is the user's input, not our bug."""


class UnknownNameError(WarpolicyError, KeyError):
    """A backend, mode, spec algorithm, flag, policy or plugin name that does not exist."""

    def __init__(
        self,
        kind: str,
        name: str,
        candidates: Iterable[str] = (),
        suggestions: Sequence[str] | None = None,
    ) -> None:
        self.kind = kind
        self.name = name
        self.candidates = sorted(set(candidates))
        if suggestions is None:  # a caller reporting many names passes cached ones
            suggestions = difflib.get_close_matches(name, self.candidates, n=3, cutoff=0.6)
        self.suggestions = list(suggestions)
        super().__init__(str(self))

    def __str__(self) -> str:
        msg = f"unknown {self.kind} {self.name!r}"
        if self.suggestions:
            msg += "; did you mean " + ", ".join(repr(s) for s in self.suggestions) + "?"
        elif self.candidates and len(self.candidates) <= 12:
            msg += "; known: " + ", ".join(self.candidates)
        return msg


class InputError(WarpolicyError):
    """A malformed command-line value or environment variable."""


@attrs.frozen
class Problem:
    """One located registry problem, printed as ``FILE:LINE:COL: message``."""

    file: str
    line: int  # 1-based
    col: int  # 1-based
    message: str
    #: the source could not be read at all (missing, a directory, a FIFO, too large): a usage
    #: error (exit 2) rather than a problem in its content
    unreadable: bool = False

    def __str__(self) -> str:
        if not self.line:  # e.g. a mapping contributed by a plugin: no text, no marks
            return f"{self.file}: {self.message}"
        return f"{self.file}:{self.line}:{self.col}: {self.message}"


class RegistryError(WarpolicyError):
    """A registry (or fragment) with one or more problems; all are reported at once."""

    def __init__(self, problems: Sequence[Problem]) -> None:
        self.problems = tuple(problems)
        super().__init__(str(self))

    def __str__(self) -> str:
        return "\n".join(str(p) for p in self.problems)


class UnreadableSourceError(RegistryError, InputError):
    """A registry source could not be read at all; carries every problem found, like
    `RegistryError`, and is an `InputError` (exit 2)."""


class PluginError(WarpolicyError):
    """A plugin that failed to import, register or contribute; names the plugin and its entry point."""

    def __init__(self, plugin: str, message: str, entry_point: str | None = None) -> None:
        self.plugin = plugin
        self.entry_point = entry_point
        self.message = message
        super().__init__(str(self))

    def __str__(self) -> str:
        where = f"plugin {self.plugin!r}"
        if self.entry_point:
            where += f" (entry point {self.entry_point})"
        return (
            f"{where}: {self.message}; disable it with "
            f"{environment.DISABLE_PLUGINS.name}={self.plugin}"
        )


class CudaUnavailableError(WarpolicyError):
    """A command that needs a CUDA device ran where there is none."""
