"""``warpolicy bench overlap``: the overlap benchmark's subcommand and its variants.

Each variant is declared by its own module (`warpolicy.bench.command.Variant`: the option
that selects it, its own options, the shared options below that it reads, how it measures):

* the synthetic decode (`warpolicy.bench.overlap`, the default);
* ``--tp N``: tensor parallel (`warpolicy.bench.overlap_tp`);
* ``--spec-step``: speculative steps (`warpolicy.bench.overlap_spec`);
* ``--factory MODULE:CALLABLE``: your own model (`warpolicy.bench.overlap_factory`).

The first variant in `VARIANTS` whose selector is given runs; an option that variant does not
read is one usage line. To add a row to a variant, change its module; to add an option, add
an `Option` to its variant's ``options`` (or, shared by several, to `SHARED` and their
``reads``); to add a variant, declare a `Variant` in its module and list it here.
"""

from __future__ import annotations

from warpolicy.bench import overlap, overlap_factory, overlap_spec, overlap_tp
from warpolicy.bench.command import Benchmark, device_option, option, variants
from warpolicy.bench.timing import SCHED_KINDS
from warpolicy.registry.inputs import positive_int_argument

#: Options several variants read (each variant names the ones it reads).
SHARED = (
    option("--steps", default=150, type=positive_int_argument),
    device_option(),
    option(
        "--sched-kind",
        default="copy",
        choices=SCHED_KINDS,
        help="scheduler GPU bookkeeping: a pinned host-to-device upload (default), "
        "a one-SM spin kernel, or a matmul competing for every SM",
    ),
    option(
        "--layers",
        default=32,
        type=positive_int_argument,
        help="synthetic model's layers (default 32)",
    ),
    option(
        "--batch",
        default=32,
        type=positive_int_argument,
        help="synthetic model's batch (default 32)",
    ),
    option("--trace", metavar="FILE", help="write a Chrome/Perfetto trace of the streams"),
)

#: The variants, the first whose selector is given winning; the default (no selector) last.
VARIANTS = (
    overlap_factory.VARIANT,
    overlap_tp.VARIANT,
    overlap_spec.VARIANT,
    overlap.VARIANT,
)

BENCHMARK: Benchmark = variants(
    "overlap",
    "scheduler overlap per policy on a synthetic decode model, or on your own model with "
    "--factory (GPU)",
    SHARED,
    VARIANTS,
)
