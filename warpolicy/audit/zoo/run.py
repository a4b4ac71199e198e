"""Run the zoo: every fixture's buggy and fixed variant through the audit and the canary.

Per variant (`run_variant`): the dynamic and static audits of its declaration
(`warpolicy.audit.dynamic.audit_mode`, no audit stalls: only the race widener widens), then a
WAR canary trial of a freshly built copy (`warpolicy.audit.zoo.canary`). A buggy variant is
**detected** when any of the three flags it; a fixed variant **passes** when none does and the
dynamic audit proves it SAFE. `ZooReport.exit_code`:

* `EXIT_OK` (0): every buggy variant detected, every fixed variant passed;
* `EXIT_UNSAFE` (1): a buggy variant escaped, or a fixed variant was flagged (a false alarm);
* `EXIT_INCONCLUSIVE` (3): some variant could not be judged (the audit failed, or a fixed
  variant's audit stayed inconclusive), or no variant ran.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from typing import Any

import attrs

from warpolicy.audit.api import platform_for
from warpolicy.audit.dynamic import audit_mode
from warpolicy.audit.isolation import IsolatedJob, audit_isolated, lost_entries
from warpolicy.audit.report import (
    EXIT_INCONCLUSIVE,
    EXIT_OK,
    EXIT_UNSAFE,
    SAFE,
    UNSAFE,
    AuditEntry,
)
from warpolicy.audit.zoo.canary import CanaryOutcome, canary_trial
from warpolicy.audit.zoo.fixture import FIXTURES, ZooFixture, make_subject, zoo_fixture
from warpolicy.errors import InputError
from warpolicy.registry import report as report_formats
from warpolicy.runtime.platforms import is_simulated
from warpolicy.runtime.runners.widen import RaceWidener

#: Canary steps per variant (the first step the race fires in is caught; later ones run coarse).
CANARY_STEPS = 4


@attrs.frozen
class ZooRow:
    """One variant's result."""

    fixture: ZooFixture
    buggy: bool
    entry: AuditEntry
    canary: CanaryOutcome | None
    seconds: float

    @property
    def variant(self) -> str:
        return "buggy" if self.buggy else "fixed"

    @property
    def dynamic(self) -> bool:
        return self.entry.dynamic.verdict is UNSAFE

    @property
    def static(self) -> bool:
        return self.entry.static.verdict is UNSAFE or self.entry.refuted is not None

    @property
    def by_canary(self) -> bool:
        return self.canary is not None and self.canary.detected

    @property
    def detected_by(self) -> tuple[str, ...]:
        found = (("dynamic", self.dynamic), ("static", self.static), ("canary", self.by_canary))
        return tuple(name for name, hit in found if hit)

    @property
    def failed(self) -> bool:
        return self.entry.dynamic.failed

    @property
    def as_expected(self) -> bool:
        """Buggy: detected by something. Fixed: flagged by nothing and proven SAFE."""
        if self.buggy:
            return bool(self.detected_by)
        return not self.detected_by and self.entry.dynamic.verdict is SAFE

    def readers(self) -> list[str]:
        """The late readers the static audit or a refutation named: ``kernel (file.py:line)``."""
        offenders = list(self.entry.static.offenders)
        if self.entry.refuted is not None:
            offenders += list(self.entry.refuted.late)
        return list(dict.fromkeys(o.describe() for o in offenders))

    def to_json(self) -> dict:
        return {
            "fixture": self.fixture.name,
            "report": self.fixture.report,
            "shape": self.fixture.shape,
            "variant": self.variant,
            "mode": self.fixture.mode.label,
            "declared": self.entry.declared.label if self.entry.declared is not None else None,
            "detected_by": list(self.detected_by),
            "as_expected": self.as_expected,
            "trials": self.entry.dynamic.trials,
            "seconds": round(self.seconds, 3),
            "audit": self.entry.to_json(),
            "canary": attrs.asdict(self.canary) if self.canary is not None else None,
            "readers": self.readers(),
        }


def _rows(value: Iterable[ZooRow]) -> tuple[ZooRow, ...]:
    return tuple(value)


@attrs.frozen
class ZooReport:
    """Every variant of one ``warpolicy audit --zoo`` run."""

    rows: tuple[ZooRow, ...] = attrs.field(converter=_rows)
    device: str = ""
    trials: int = 0
    widener: str = "off"

    @property
    def exit_code(self) -> int:
        if not self.rows or any(r.failed for r in self.rows):
            return EXIT_INCONCLUSIVE
        if any(not r.as_expected and (r.buggy or r.detected_by) for r in self.rows):
            return EXIT_UNSAFE
        if any(not r.as_expected for r in self.rows):
            return EXIT_INCONCLUSIVE  # a fixed variant the audit could not prove SAFE
        return EXIT_OK

    def summary(self) -> str:
        buggy = [r for r in self.rows if r.buggy]
        fixed = [r for r in self.rows if not r.buggy]
        detected = sum(1 for r in buggy if r.detected_by)
        alarms = sum(1 for r in fixed if r.detected_by)
        return (
            f"buggy detected {detected}/{len(buggy)}, fixed flagged {alarms}/{len(fixed)} "
            f"(widener {self.widener})"
        )

    def to_json(self) -> dict:
        return {
            "device": self.device,
            "trials": self.trials,
            "widener": self.widener,
            "exit_code": self.exit_code,
            "summary": self.summary(),
            "rows": [r.to_json() for r in self.rows],
        }


def parse_fixtures(text: str | None) -> list[ZooFixture]:
    """``NAME,NAME`` (None or ``all``: every fixture) -> fixtures; unknown names raise."""
    if text is None or text.strip() in ("", "all"):
        return list(FIXTURES)
    names = [n.strip() for n in text.split(",") if n.strip()]
    return [zoo_fixture(n) for n in dict.fromkeys(names)]


def run_variant(
    fixture: ZooFixture,
    buggy: bool,
    platform: Any,
    trials: int,
    widener: RaceWidener,
    *,
    canary_steps: int = CANARY_STEPS,
) -> ZooRow:
    """Audit one variant, then run the canary on a fresh copy of it."""
    start = time.perf_counter()
    built = make_subject(fixture, buggy, platform, widener)
    entry = audit_mode(built.subject, fixture.mode, trials, stall_us=0.0)
    canary = None
    if canary_steps:
        try:
            canary = canary_trial(make_subject(fixture, buggy, platform, widener), canary_steps)
        except Exception as exc:  # noqa: BLE001 - reported in the row, never a crash
            canary = CanaryOutcome(0, 0, 0, f"canary trial failed: {type(exc).__name__}: {exc}")
    return ZooRow(fixture, buggy, entry, canary, time.perf_counter() - start)


def run_zoo(
    platform: Any,
    fixtures: Iterable[ZooFixture] | None = None,
    trials: int | None = None,
    widener: RaceWidener | None = None,
    *,
    device: str = "",
    canary_steps: int = CANARY_STEPS,
    isolate: bool = False,
) -> ZooReport:
    """Every variant of ``fixtures`` (default: all) on ``platform``. ``trials`` None: 2 on the
    simulated platform (its window is deterministic; two trials replay both buckets), 10 on a
    GPU (`warpolicy.audit.dynamic.MIN_TRIALS`). ``widener`` None: resolved from the environment
    (``WARPOLICY_WIDEN_RACE_US``). ``isolate``: the variants run in a child process opened on
    ``platform``'s device, so one that loses the device fails alone
    (`warpolicy.audit.isolation`)."""
    from warpolicy.audit.dynamic import MIN_TRIALS  # noqa: PLC0415 - one constant, no cycle

    chosen = tuple(fixtures) if fixtures is not None else FIXTURES
    if trials is None:
        trials = 2 if is_simulated(platform.name) else MIN_TRIALS
    if trials < 1:
        raise InputError(f"--trials must be >= 1, got {trials}")
    widen = widener if widener is not None else RaceWidener.resolve()
    auditor = VariantAuditor(trials, widen, canary_steps)
    if isolate:
        job = IsolatedJob(platform.name, Variants(chosen), auditor, platform_for)
        rows = audit_isolated(job)
    else:
        rows = [r for item in Variants(chosen)(platform) for r in auditor(item)]
    return ZooReport(tuple(rows), device=device, trials=trials, widener=widen.describe())


@attrs.frozen
class Variant:
    """One variant to run in (a possibly isolated) process: what `VariantAuditor` runs."""

    fixture: ZooFixture
    buggy: bool
    platform: Any

    @property
    def name(self) -> str:
        return f"{self.fixture.name}:{'buggy' if self.buggy else 'fixed'}"


@attrs.frozen
class Variants:
    """Every variant of ``fixtures`` on a platform, buggy first (picklable)."""

    fixtures: tuple[ZooFixture, ...]

    def __call__(self, platform: Any) -> list[Variant]:
        return [Variant(f, buggy, platform) for f in self.fixtures for buggy in (True, False)]


@attrs.frozen
class VariantAuditor:
    """Runs one variant (`run_variant`); a variant whose process was lost is one failed row."""

    trials: int
    widener: RaceWidener
    canary_steps: int = CANARY_STEPS

    def __call__(self, item: Variant) -> list[ZooRow]:
        return [
            run_variant(
                item.fixture,
                item.buggy,
                item.platform,
                self.trials,
                self.widener,
                canary_steps=self.canary_steps,
            )
        ]

    def describe(self, item: Variant) -> tuple[ZooFixture, bool]:
        return item.fixture, item.buggy

    def lost(self, described: tuple[ZooFixture, bool], why: str) -> list[ZooRow]:
        fixture, buggy = described
        name = f"{fixture.name}:{'buggy' if buggy else 'fixed'}"
        (entry,) = lost_entries(name, (fixture.mode,), "none", why)
        return [ZooRow(fixture, buggy, entry, None, 0.0)]


# ---------------------------------------------------------------------------------------------
# Rendering
# ---------------------------------------------------------------------------------------------

_COLUMNS = ("fixture", "report", "variant", "dynamic", "static", "canary", "detected by", "ok")
_COLUMNS_TAIL = ("trials", "time")


def format_zoo(report: ZooReport, fmt: str = "text") -> str:
    """The zoo table (text) or a JSON document."""
    if fmt == "json":
        return report_formats.json_document(report.to_json())
    if fmt != "text":
        raise InputError(f"unknown zoo format {fmt!r}; use text or json")
    rows = [
        [
            r.fixture.name,
            r.fixture.report,
            r.variant,
            r.entry.dynamic.summary(),
            _static_cell(r),
            _canary_cell(r),
            ", ".join(r.detected_by) or "-",
            "yes" if r.as_expected else "NO",
            str(r.entry.dynamic.trials),
            f"{r.seconds:.1f}s",
        ]
        for r in report.rows
    ]
    lines = [
        f"warpolicy audit --zoo on {report.device or '?'}: {report.trials} trials per variant, "
        f"race widener {report.widener}"
    ]
    lines += report_formats.render_table(_COLUMNS + _COLUMNS_TAIL, rows).splitlines()
    notes = [(r, r.readers(), _problems(r)) for r in report.rows]
    notes = [(r, readers, problems) for r, readers, problems in notes if readers or problems]
    if notes:
        lines.append("")
        for row, readers, problems in notes:
            lines.append(f"{row.fixture.name}:{row.variant}:")
            lines += [f"  late reader: {text}" for text in readers]
            lines += [f"  {text}" for text in problems]
    lines += ["", report.summary()]
    return "\n".join(lines)


def _static_cell(row: ZooRow) -> str:
    if row.entry.refuted is not None and row.entry.static.verdict is not UNSAFE:
        return "refuted"
    return row.entry.static.verdict.label if not row.static else "unsafe"


def _canary_cell(row: ZooRow) -> str:
    if row.canary is None:
        return "-"
    if row.canary.detected:
        return f"caught {row.canary.caught}/{row.canary.checked}"
    if row.canary.first:  # the trial itself failed
        return "failed"
    return f"clean {row.canary.checked}/{row.canary.steps}"


def _problems(row: ZooRow) -> Sequence[str]:
    """Why a variant is not as expected (or failed)."""
    if row.as_expected:
        return ()
    out = [f"dynamic: {row.entry.dynamic.reason}"] if row.entry.dynamic.reason else []
    if row.entry.dynamic.first is not None:
        out.append(f"dynamic: {row.entry.dynamic.first.describe()}")
    if row.canary is not None and row.canary.first:
        out.append(f"canary: {row.canary.first}")
    return out
