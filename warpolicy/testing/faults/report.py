"""The matrix's report: one row per target (and the fault-free baselines), a total, and the
targets that never fired.

A configuration (scenario/variant) that releases early with no fault at all is a finding of
its own: its fault cases would repeat it whatever the fault. The per-target table therefore
counts early releases only in configurations whose fault-free run is clean (``dirty``
configurations are listed, and the per-scenario table shows everything).

Columns: ``cases``; ``fired`` (cases whose fault was hit); ``early_silent`` /
``early_warned`` / ``early_error`` (cases with an early release, by how the engine learnt of
trouble before it: not at all, a warning, an exception); ``early_writes`` (scheduler writes
released early, all cases); ``stale`` (cases with a stale read); ``errors`` (cases where an
exception reached the engine).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import attrs

from warpolicy.testing.faults.matrix import TARGETS, CaseResult

COLUMNS = (
    "target",
    "cases",
    "fired",
    "early_silent",
    "early_warned",
    "early_error",
    "early_writes",
    "stale",
    "errors",
)


@attrs.frozen
class MatrixResult:
    results: tuple[CaseResult, ...]

    @property
    def early(self) -> list[CaseResult]:
        """Cases with an early release."""
        return [r for r in self.results if r.early]

    @property
    def stale(self) -> list[CaseResult]:
        return [r for r in self.results if r.outcome.stale_reads]

    @property
    def fired(self) -> int:
        """Cases whose fault fired."""
        return sum(1 for r in self.results if r.fired)

    @property
    def both_fired(self) -> int:
        """Two-fault cases whose second fault fired too."""
        return sum(1 for r in self.results if r.both_fired)

    @property
    def two_faults(self) -> int:
        """Cases of the two-fault mode."""
        return sum(1 for r in self.results if r.case.second is not None)

    def never_fired(self, targets: Iterable[str] = TARGETS) -> list[str]:
        """Targets that never fired in any case here."""
        fired = {r.case.target for r in self.results if r.fired}
        return [t for t in targets if t not in fired]

    def dirty(self) -> list[str]:
        """Configurations (``scenario/variant``) that release early with no fault."""
        return [
            f"{r.case.scenario}/{r.case.variant}"
            for r in self.results
            if r.case.fault is None and r.early
        ]

    def clean(self) -> list[CaseResult]:
        """The cases of configurations that do not release early without a fault."""
        dirty = set(self.dirty())
        return [r for r in self.results if f"{r.case.scenario}/{r.case.variant}" not in dirty]

    def rows(self, results: Sequence[CaseResult] | None = None) -> list[dict[str, Any]]:
        """One row per target, then the total (``results``: default `clean`)."""
        groups: dict[str, list[CaseResult]] = {}
        chosen = self.clean() if results is None else results
        for result in chosen:
            groups.setdefault(result.case.target, []).append(result)
        order = [t for t in ("(no fault)", *TARGETS) if t in groups]
        return [_row(t, groups[t]) for t in order] + [_row("total", list(chosen))]

    def by_scenario(self) -> list[dict[str, Any]]:
        groups: dict[str, list[CaseResult]] = {}
        for result in self.results:
            groups.setdefault(f"{result.case.scenario}/{result.case.variant}", []).append(result)
        return [_row(name, items) for name, items in groups.items()]


def _row(name: str, items: Sequence[CaseResult]) -> dict[str, Any]:
    kinds = [r.early_kind for r in items]
    return {
        "target": name,
        "cases": len(items),
        "fired": sum(1 for r in items if r.fired),
        "early_silent": kinds.count("silent"),
        "early_warned": kinds.count("warned"),
        "early_error": kinds.count("error"),
        "early_writes": sum(r.outcome.early_writes for r in items),
        "stale": sum(1 for r in items if r.outcome.stale_reads),
        "errors": sum(1 for r in items if r.outcome.errors),
    }


def format_rows(rows: Sequence[dict[str, Any]], first: str = "target") -> str:
    header = (first, *COLUMNS[1:])
    keys = COLUMNS
    widths = [max(len(h), *(len(str(r[k])) for r in rows)) for h, k in zip(header, keys)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(header, widths))]
    lines.append("  ".join("-" * w for w in widths))
    for row in rows:
        lines.append("  ".join(str(row[k]).ljust(w) for k, w in zip(keys, widths)))
    return "\n".join(lines)


def format_matrix(result: MatrixResult, *, scenarios: bool = False) -> str:
    """The table per target (``scenarios``: and per scenario/variant), then what never fired
    and the first early releases, described."""
    dirty = result.dirty()
    clean = len(result.clean())
    two = (
        f" ({result.two_faults} of them two-fault cases, {result.both_fired} with both faults "
        "fired)"
        if result.two_faults
        else ""
    )
    parts = [
        f"{len(result.results)} cases{two}, {result.fired} with the fault fired; "
        f"{len(result.early)} cases release early, {len(result.stale)} read stale",
        f"per target, over the {clean} cases of configurations clean without a fault:",
        format_rows(result.rows()),
        "configurations that release early with no fault: " + (", ".join(dirty) or "none"),
    ]
    if scenarios:
        parts.append(format_rows(result.by_scenario(), first="scenario/variant"))
    never = result.never_fired()
    parts.append("never fired: " + (", ".join(never) if never else "none"))
    shown = [r for r in result.clean() if r.early][:5] or result.early[:5]
    parts.extend(f"early: {r.case.describe()}: {r.outcome.first_early}" for r in shown)
    return "\n\n".join(parts)
