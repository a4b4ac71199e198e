"""What a long operation (an audit, a benchmark) tells its caller as it goes.

The operation calls a `Progress` it was given: `Progress.planned` once with how many items it
will run (when it knows), `Progress.started` before each item, `Progress.finished` after it
with a one-word-or-so outcome, and `Progress.note` for a slow phase that is not an item
(building subjects, compiling kernels). `NO_PROGRESS` ignores everything; the CLI renders the
calls on stderr (`warpolicy.cli.progress`). Depends on nothing in the package.
"""

from __future__ import annotations

from typing import Protocol

__all__ = ["NO_PROGRESS", "Progress", "Silent"]


class Progress(Protocol):
    """Receives an operation's progress; must not raise (the operation does not catch)."""

    def planned(self, total: int | None) -> None:
        """The number of items the operation will run (None: not known)."""

    def started(self, label: str) -> None:
        """Item ``label`` (``"fa3 decode"``, ``"in_graph"``) starts."""

    def finished(self, label: str, outcome: str) -> None:
        """Item ``label`` ended with ``outcome`` (``"SAFE"``, ``"1.42x"``)."""

    def note(self, text: str) -> None:
        """A slow phase that is not an item (``"compiling SGLang's Triton kernels"``)."""


class Silent:
    """A `Progress` that says nothing (the API's default)."""

    def planned(self, total: int | None) -> None:
        pass

    def started(self, label: str) -> None:
        pass

    def finished(self, label: str, outcome: str) -> None:
        pass

    def note(self, text: str) -> None:
        pass


NO_PROGRESS: Progress = Silent()
