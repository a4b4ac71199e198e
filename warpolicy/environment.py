"""Every environment variable warpolicy and its plugins read: name, meaning, default, reader.

One list, so an operator finds them all in one place (docs/environment.md is generated from
it: ``warpolicy env --format markdown``, or ``scripts/gen-env-docs``) and a test can check that
the tree reads no variable this module does not declare. Reading goes through here too:
``PROFILE_RANGES.get(environ)`` instead of ``os.environ.get("WARPOLICY_PROFILE_RANGES")``.
Parsing stays with the reader (a switch, a count, a path list), which says what a bad value
does. Names a registry declares for its flags (``env:`` in a capabilities file) are data, not
code: `lookup` reads them.

Depends on nothing in the package, so every layer (and the plugins) may import it.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping

import attrs

__all__ = [
    "PROCESS",
    "Variable",
    "declare",
    "lookup",
    "variable",
    "variables",
]

#: The process environment: the default every reader falls back to when it is given none.
PROCESS: Mapping[str, str] = os.environ

#: What reads a variable: warpolicy itself, one of the plugins in this repository, or another
#: tool whose variable warpolicy honours (Triton, prometheus_client, torchrun).
OWNERS = ("warpolicy", "warpolicy-metrics", "warpolicy-trace", "external")


@attrs.frozen
class Variable:
    """One environment variable: ``name``; ``meaning`` (one or two sentences, Markdown);
    ``default`` (what unset means); ``read_by`` (the module that reads it, dotted); ``owner``
    (one of `OWNERS`: who defines it)."""

    name: str
    meaning: str
    default: str
    read_by: str
    owner: str = attrs.field(default="warpolicy")

    @owner.validator
    def _known_owner(self, attribute: object, value: str) -> None:
        if value not in OWNERS:
            raise ValueError(f"{self.name}: owner {value!r} is not one of {', '.join(OWNERS)}")

    def get(self, environ: Mapping[str, str] | None = None) -> str:
        """The raw value in ``environ`` (default: the process environment); "" when unset."""
        return (PROCESS if environ is None else environ).get(self.name, "")

    def is_set(self, environ: Mapping[str, str] | None = None) -> bool:
        """Present in ``environ`` at all (even empty), the test prometheus_client makes."""
        return self.name in (PROCESS if environ is None else environ)

    @contextlib.contextmanager
    def overridden(self, value: str) -> Iterator[None]:
        """Set the variable in this process's environment (so processes it starts inherit it)
        for the ``with`` block, then put back what was there (unset stays unset)."""
        before = os.environ.get(self.name)
        os.environ[self.name] = value
        try:
            yield
        finally:
            if before is None:
                os.environ.pop(self.name, None)
            else:
                os.environ[self.name] = before


_DECLARED: dict[str, Variable] = {}


def declare(
    name: str, meaning: str, *, default: str, read_by: str, owner: str = "warpolicy"
) -> Variable:
    """Add a variable to the list (a name declared twice is a bug: `ValueError`)."""
    if name in _DECLARED:
        raise ValueError(f"environment variable {name} is declared twice")
    var = Variable(name, meaning, default, read_by, owner)
    _DECLARED[name] = var
    return var


def variable(name: str) -> Variable:
    """The declared variable called ``name`` (`KeyError` when none is)."""
    return _DECLARED[name]


def variables() -> tuple[Variable, ...]:
    """Every declared variable, in declaration order (the docs table's order)."""
    return tuple(_DECLARED.values())


def lookup(name: str, environ: Mapping[str, str] | None = None) -> str:
    """The raw value of a variable a registry declares for a flag (its ``env:`` names), which
    no code can list in advance; "" when unset."""
    return (PROCESS if environ is None else environ).get(name, "")


# -- the registry ------------------------------------------------------------------------------

CAPABILITIES = declare(
    "WARPOLICY_CAPABILITIES",
    "Registry files to load, separated by `os.pathsep` (`:` on Linux) and layered in order; "
    "`default` names the packaged registry. `--capabilities` on the command line wins.",
    default="the packaged registry",
    read_by="warpolicy.registry.loader",
)
FORCE_COARSE = declare(
    "WARPOLICY_FORCE_COARSE",
    "The kill switch: a true value (1/true/yes/on) makes every release the coarse barrier; a "
    "value that is not a boolean counts as on (fail closed). Built into the engine: no registry "
    "or plugin can remove it.",
    default="off",
    read_by="warpolicy.registry.vocabulary",
)
SGLANG_FORCE_COARSE = declare(
    "SGLANG_FORCE_COARSE_WAR_BARRIER",
    "SGLang's spelling of `WARPOLICY_FORCE_COARSE`, honoured the same way.",
    default="off",
    read_by="warpolicy.registry.vocabulary",
)

# -- plugins -----------------------------------------------------------------------------------

DISABLE_PLUGINS = declare(
    "WARPOLICY_DISABLE_PLUGINS",
    "Comma-separated plugin names (as `warpolicy plugins` lists them) never to register, "
    "built-ins included.",
    default="none disabled",
    read_by="warpolicy.runtime.manager",
)
DISABLE_PLUGIN_AUTOLOAD = declare(
    "WARPOLICY_DISABLE_PLUGIN_AUTOLOAD",
    "A true value loads no plugin from the `warpolicy` entry-point group (installed "
    "distributions); the built-in platforms still register. The CLI's "
    "`--disable-plugin-autoload` does the same for one command.",
    default="off (installed plugins load)",
    read_by="warpolicy.runtime.manager",
)
TRACE_HOOKS = declare(
    "WARPOLICY_TRACE_HOOKS",
    "A true value writes pluggy's trace of every hook call to stderr (plugin debugging).",
    default="off",
    read_by="warpolicy.runtime.manager",
)

# -- the runtime -------------------------------------------------------------------------------

NVTX = declare(
    "WARPOLICY_NVTX",
    "A true value registers the built-in NVTX observer: publishes, barriers and fallbacks "
    "appear as ranges in Nsight Systems.",
    default="off",
    read_by="warpolicy.runtime.nvtx",
)
PROFILE_RANGES = declare(
    "WARPOLICY_PROFILE_RANGES",
    "A true value wraps every publish and barrier in a torch profiler range "
    "(`warpolicy.publish`, `warpolicy.barrier`); off by default because the range costs more "
    "than the fence itself. `ReadDoneFence(profile_ranges=...)` overrides it.",
    default="off",
    read_by="warpolicy.runtime.fence",
)
WIDEN_RACE_US = declare(
    "WARPOLICY_WIDEN_RACE_US",
    "Microseconds of GPU spin at the release points (the graph's start and right after the "
    "in-graph marker) to widen WAR race windows for the audit, the zoo and the canary; "
    "unset, empty or 0: off; not a number from 0 to 1000000: off, with one log line.",
    default="0 (off)",
    read_by="warpolicy.runtime.runners.widen",
)
CANARY_RATE = declare(
    "WARPOLICY_CANARY_RATE",
    "Share of each runner's steps the WAR canary checks (`0.001` or `1/1000`).",
    default="0 (canary off)",
    read_by="warpolicy.runtime.canary.core",
)
CANARY_BUDGET = declare(
    "WARPOLICY_CANARY_BUDGET",
    "At most this many canary checks in the process.",
    default="no limit",
    read_by="warpolicy.runtime.canary.core",
)
CANARY_MAX_BYTES = declare(
    "WARPOLICY_CANARY_MAX_BYTES",
    "The most one canary sample may hold, in bytes; larger samples are skipped.",
    default="268435456 (256 MiB)",
    read_by="warpolicy.runtime.canary.core",
)
CANARY_LEAD_RATE = declare(
    "WARPOLICY_CANARY_LEAD_RATE",
    "Share of overlap-loop steps whose release lead is measured.",
    default="0 (never)",
    read_by="warpolicy.runtime.canary.core",
)
CANARY_SEED = declare(
    "WARPOLICY_CANARY_SEED",
    "Seed of the canary's sampling, for reproducible runs.",
    default="random",
    read_by="warpolicy.runtime.canary.core",
)

# -- conformance and benchmarks ----------------------------------------------------------------

SGLANG_DIR = declare(
    "WARPOLICY_SGLANG_DIR",
    "Directory of the pinned SGLang kernel files the conformance suite and its audit "
    "subjects load "
    "(`scripts/fetch-sglang-kernels` fills it).",
    default="`.sglang` at the top of the source tree",
    read_by="warpolicy.conformance.wheels",
)

# -- the plugins in this repository ------------------------------------------------------------

TRACE_FILE = declare(
    "WARPOLICY_TRACE_FILE",
    "Where the trace plugin writes its Chrome trace at exit (or on `flush()`).",
    default="no file written",
    read_by="warpolicy_trace",
    owner="warpolicy-trace",
)
TRACE_MAX_EVENTS = declare(
    "WARPOLICY_TRACE_MAX_EVENTS",
    "The most events the trace plugin keeps in memory (an integer >= 1; a bad value keeps the "
    "default).",
    default="200000",
    read_by="warpolicy_trace",
    owner="warpolicy-trace",
)
METRICS_SAMPLE_EVERY = declare(
    "WARPOLICY_METRICS_SAMPLE_EVERY",
    "Removed in 0.3: no longer read; setting it logs one warning. The release lead comes from "
    "`WARPOLICY_CANARY_LEAD_RATE`.",
    default="unused",
    read_by="warpolicy_metrics",
    owner="warpolicy-metrics",
)

# -- other tools' variables warpolicy honours --------------------------------------------------

PROMETHEUS_MULTIPROC_DIR = declare(
    "PROMETHEUS_MULTIPROC_DIR",
    "prometheus_client's multi-process directory: when set (or its deprecated lower-case "
    "spelling `prometheus_multiproc_dir`), the metrics plugin writes its counts there for the "
    "engine's `MultiProcessCollector`.",
    default="single-process metrics",
    read_by="warpolicy_metrics.flushing",
    owner="external",
)
PROMETHEUS_MULTIPROC_DIR_LEGACY = declare(
    "prometheus_multiproc_dir",
    "The deprecated spelling of `PROMETHEUS_MULTIPROC_DIR`, honoured like it.",
    default="single-process metrics",
    read_by="warpolicy_metrics.flushing",
    owner="external",
)
TRITON_INTERPRET = declare(
    "TRITON_INTERPRET",
    "Triton's interpreter switch: `1` lets the Triton kernels (conformance, `bench overlap "
    "--model llama`) run on the CPU.",
    default="compiled kernels (a GPU)",
    read_by="warpolicy.conformance.factories",
    owner="external",
)
WORLD_SIZE = declare(
    "WORLD_SIZE",
    "Set by torchrun: with `RANK`, `bench overlap --tp` joins the launched group instead of "
    "spawning its own ranks.",
    default="spawn the ranks",
    read_by="warpolicy.bench.overlap_tp",
    owner="external",
)
RANK = declare(
    "RANK",
    "Set by torchrun: this process's rank (see `WORLD_SIZE`).",
    default="spawn the ranks",
    read_by="warpolicy.bench.overlap_tp",
    owner="external",
)
LOCAL_RANK = declare(
    "LOCAL_RANK",
    "Set by torchrun: the device this rank uses.",
    default="the rank",
    read_by="warpolicy.bench.overlap_tp",
    owner="external",
)
PYTHONWARNINGS = declare(
    "PYTHONWARNINGS",
    "Python's warning filters: `bench overlap --tp` adds one for the ranks it spawns (torch's "
    "NumPy warning at import), keeping yours.",
    default="Python's default filters",
    read_by="warpolicy.bench.overlap_tp",
    owner="external",
)
COLUMNS = declare(
    "COLUMNS",
    "The terminal width `table`, `query`, `explain`, `env`, `diff` and `plugins` fit their text "
    "to (the shell sets it; without it, the terminal's size, else 80). `--wide` ignores it.",
    default="the terminal's width, else 80",
    read_by="warpolicy.cli.layout",
    owner="external",
)
