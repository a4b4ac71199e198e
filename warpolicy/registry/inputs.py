"""Parsers for operator-supplied values: booleans, environment switches and positive counts.

One place for both, so an environment variable, a ``--flag NAME=VALUE``, a ``--iterations`` and
an API argument accept and reject the same spellings. Depends only on `warpolicy.errors`, so any
layer may use it.
"""

from __future__ import annotations

import argparse
import logging
from collections.abc import Mapping

from warpolicy.environment import Variable
from warpolicy.errors import InputError

TRUE_WORDS = frozenset({"1", "true", "yes", "on"})
FALSE_WORDS = frozenset({"0", "false", "no", "off"})


def parse_bool(text: object, what: str) -> bool:
    """``1/true/yes/on`` or ``0/false/no/off`` (any case, surrounding blanks ignored).

    An empty value is an error, not ``false``: ``--flag NAME=`` is a typo, and an empty
    environment variable is treated as unset by the engine before it gets here.
    """
    if isinstance(text, bool):
        return text
    key = str(text).strip().lower()
    if key in TRUE_WORDS:
        return True
    if key in FALSE_WORDS:
        return False
    raise InputError(f"{what}={text!r} is not a boolean (use 1/0, true/false, yes/no, on/off)")


def env_switch(environ: Mapping[str, str] | None, variable: Variable) -> bool:
    """An opt-in switch from the environment (tracing, NVTX ranges, profiler ranges; ``environ``
    None: the process's): `parse_bool` words; unset or empty is off. A value that is not a
    boolean is off too, with one log line naming it: a diagnostics switch must never stop the
    process that reads it."""
    raw = variable.get(environ)
    if not raw.strip():
        return False
    try:
        return parse_bool(raw, variable.name)
    except InputError as exc:
        logging.getLogger("warpolicy").warning("warpolicy: %s; treated as off", exc)
        return False


def parse_positive_int(value: object, what: str) -> int:
    """A count (iterations, trials, steps): an int >= 1, from an int or its decimal text."""
    if isinstance(value, bool):  # True is an int; never a count
        number = 0
    elif isinstance(value, int):
        number = value
    else:
        try:
            number = int(str(value).strip())
        except ValueError:
            number = 0
    if number < 1:
        raise InputError(f"{what}: expected a positive integer, got {value!r}")
    return number


def positive_int_argument(text: str) -> int:
    """argparse type for counts (``--iterations``, ``--steps``): a traceback-free usage error."""
    try:
        return parse_positive_int(text, "count")
    except InputError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None


def non_negative_int_argument(text: str) -> int:
    """argparse type for a limit where 0 means none."""
    if text.strip() == "0":
        return 0
    return positive_int_argument(text)
