"""How wide the text a command prints may be: the terminal's width, ``COLUMNS`` when the shell
sets it, or no limit (``--wide``, or output that goes to a file or a pipe with no ``COLUMNS``:
nothing to fit, and scripts get one line per row)."""

from __future__ import annotations

import argparse
import os
import sys

from warpolicy import environment

__all__ = ["add_wide", "output_width"]


def add_wide(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--wide",
        action="store_true",
        help="text at full width, one line per row (default: fit the terminal or $COLUMNS)",
    )


def output_width(wide: bool = False) -> int | None:
    """The columns text output should fit: None for no limit (``wide``); else a positive
    ``COLUMNS``; else the size of the terminal stdout is, if it is one; else None."""
    if wide:
        return None
    raw = environment.COLUMNS.get().strip()
    if raw.isdigit() and int(raw) > 0:
        return int(raw)
    stream = sys.stdout
    try:
        if stream is not None and stream.isatty():
            return os.get_terminal_size(stream.fileno()).columns or None
    except (OSError, ValueError, AttributeError):  # closed, redirected or not a real file
        pass
    return None
