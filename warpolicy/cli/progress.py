"""Progress of a long command on stderr (stdout carries only the result).

Without a terminal (a log, a pipe, CI) each finished item is one line, ``warpolicy audit:
[3/12] fa3 decode: safe (2.1 s)``, and a slow phase one line once it is over (``... (12.0 s)``),
so a command that fails during it still says only its one error line. On a terminal, a slow
phase is said when it begins, a bar is redrawn in place while an item runs, and the same
finished line stays when it ends. ``--quiet`` prints nothing.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from typing import TextIO

from warpolicy.progress import NO_PROGRESS, Progress

__all__ = ["BAR_WIDTH", "StderrProgress", "add_quiet", "progress_for"]

#: Cells of the terminal bar.
BAR_WIDTH = 20


def add_quiet(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "-q",
        "--quiet",
        action="store_true",
        help="no progress lines on stderr (the result on stdout is the same)",
    )


def progress_for(command: str, quiet: bool) -> Progress:
    """The progress a command reports to: none under ``--quiet``, else `StderrProgress`."""
    return NO_PROGRESS if quiet else StderrProgress(command)


class StderrProgress:
    """A `warpolicy.progress.Progress` that writes to stderr (see the module docstring).
    ``stream``, ``terminal`` and ``clock`` default to sys.stderr, its isatty() and
    time.monotonic (tests pass their own)."""

    def __init__(
        self,
        command: str,
        *,
        stream: TextIO | None = None,
        terminal: bool | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.command = command
        self._stream = stream
        self._terminal = terminal
        self._clock = clock
        self.total: int | None = None
        self.done = 0
        self._since: dict[str, float] = {}
        self._drawn = False  # a bar is on the terminal's current line
        self._phase: tuple[str, float] | None = None  # a slow phase not said yet (no terminal)

    def planned(self, total: int | None) -> None:
        self.total = total

    def started(self, label: str) -> None:
        self._phase_over()
        self._since[label] = self._clock()
        if self._is_terminal():
            self._draw(f"{self._bar()} {self._count(self.done + 1)}{label} ...")

    def finished(self, label: str, outcome: str) -> None:
        self.done += 1
        began = self._since.pop(label, None)
        took = f" ({self._clock() - began:.1f} s)" if began is not None else ""
        self._line(f"{self.command}: {self._count(self.done)}{label}: {outcome}{took}")

    def note(self, text: str) -> None:
        self._phase_over()
        if self._is_terminal():
            self._line(f"{self.command}: {text} ...")
        else:
            self._phase = (text, self._clock())

    def _phase_over(self) -> None:
        """Say the slow phase that just ended, with how long it took (no terminal)."""
        if self._phase is not None:
            text, began = self._phase
            self._phase = None
            self._line(f"{self.command}: {text} ({self._clock() - began:.1f} s)")

    # -- output ------------------------------------------------------------------------------

    def _out(self) -> TextIO | None:
        return self._stream if self._stream is not None else sys.stderr

    def _is_terminal(self) -> bool:
        if self._terminal is not None:
            return self._terminal
        stream = self._out()
        try:
            return bool(stream is not None and stream.isatty())
        except (OSError, ValueError):  # closed
            return False

    def _count(self, n: int) -> str:
        return f"[{n}/{self.total}] " if self.total else f"[{n}] "

    def _bar(self) -> str:
        if not self.total:
            return ""
        filled = min(BAR_WIDTH, BAR_WIDTH * self.done // self.total)
        return "[" + "#" * filled + "-" * (BAR_WIDTH - filled) + "]"

    def _draw(self, text: str) -> None:
        self._write("\r\x1b[2K" + text)
        self._drawn = True

    def _line(self, text: str) -> None:
        prefix = "\r\x1b[2K" if self._drawn else ""
        self._drawn = False
        self._write(prefix + text + "\n")

    def _write(self, text: str) -> None:
        stream = self._out()
        try:
            if stream is not None:
                stream.write(text)
                stream.flush()
        except (OSError, ValueError):  # stderr gone: progress is not worth failing for
            pass
