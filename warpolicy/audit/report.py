"""Audit results (frozen attrs models) and their text / JSON rendering.

One `AuditEntry` per audited (backend, mode, spec): a dynamic race result, a static graph
result and the combined verdict. `AuditReport.exit_code` is what ``warpolicy audit`` exits
with, so the audit cannot pass by default:

* `EXIT_UNSAFE` (1) when any entry is UNSAFE, a refuted declaration included (`Refutation`);
* else `EXIT_INCONCLUSIVE` (3) when the run proved nothing for some declaration: an
  INCONCLUSIVE entry (unless ``allow_inconclusive``), an audit that failed (always, even with
  ``allow_inconclusive``: a subject that crashes in every mode must not pass), or no entry;
* else 0: every audited declaration is SAFE.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Sequence
from typing import Any

import attrs

from warpolicy.errors import InputError
from warpolicy.registry import report as report_formats
from warpolicy.registry.vocabulary import ForwardMode, WarReadDonePolicy

#: Exit codes of ``warpolicy audit`` (2 is the CLI's usage error).
EXIT_OK = 0
EXIT_UNSAFE = 1
EXIT_INCONCLUSIVE = 3

#: What the static graph audit cannot see; printed once under every text report.
STATIC_BLIND_SPOTS = (
    "the static audit matches 8-byte kernel, memcpy and memset arguments against the shared "
    "buffers' address ranges; it cannot see pointers stored inside device-side structs or "
    "reached through indirection (an index read from another buffer), host-side work after "
    "replay, or work on other streams; the dynamic race audit covers those"
)


class Verdict(enum.Enum):
    """The outcome of auditing one declaration."""

    SAFE = "safe"  # no difference over every trial (and no late reader in the graph)
    UNSAFE = "unsafe"  # a difference was observed, or a reader follows the release point
    INCONCLUSIVE = "inconclusive"  # nothing could be proven either way; ``reason`` says why

    @property
    def label(self) -> str:
        return self.value


SAFE = Verdict.SAFE
UNSAFE = Verdict.UNSAFE
INCONCLUSIVE = Verdict.INCONCLUSIVE


def _pairs(value: Iterable[tuple[str, int]]) -> tuple[tuple[str, int], ...]:
    return tuple((str(k), int(v)) for k, v in value)


@attrs.frozen
class Mismatch:
    """The first output element that differed from the undisturbed reference."""

    trial: int  # 0-based trial number
    output: str  # which output: "out", "out[1]", "out['logits']"
    index: tuple[int, ...]  # index of the first differing element in that output
    expected: Any  # the reference value (a Python scalar)
    got: Any  # the value the step produced while the scheduler poisoned shared state
    count: int  # how many elements of that output differed in that trial
    poison: str = ""  # the poison whose step differed (`warpolicy.audit.poison`)

    def describe(self) -> str:
        idx = ", ".join(str(i) for i in self.index)
        by = f", poison {self.poison}" if self.poison else ""
        return (
            f"trial {self.trial}{by}: {self.output}[{idx}] = {_scalar(self.got)}, "
            f"expected {_scalar(self.expected)} ({self.count} element"
            f"{'s' if self.count != 1 else ''} differ)"
        )

    def to_json(self) -> dict:
        return {
            "trial": self.trial,
            "output": self.output,
            "index": list(self.index),
            "expected": self.expected,
            "got": self.got,
            "count": self.count,
            "poison": self.poison,
        }


@attrs.frozen
class DynamicResult:
    """The differential race test of one declaration."""

    verdict: Verdict
    trials: int = 0  # trials run
    corrupted: int = 0  # trials whose output differed from the reference
    first: Mismatch | None = None
    reason: str = ""  # why INCONCLUSIVE, or a note
    failed: bool = False  # the audit itself raised (the subject crashed): never passes
    #: per poison of the set (in order): the trials whose step under that poison differed
    caught: tuple[tuple[str, int], ...] = attrs.field(default=(), converter=_pairs)

    def caught_line(self) -> str:
        """``caught by half_turn 30/30, low 30/30, high 0/30`` (empty without poisons)."""
        if not self.caught:
            return ""
        parts = ", ".join(f"{name} {n}/{self.trials}" for name, n in self.caught)
        return f"caught by {parts}"

    def summary(self) -> str:
        if self.verdict is UNSAFE:
            return f"unsafe {self.corrupted}/{self.trials}"
        if self.verdict is SAFE:
            return f"safe 0/{self.trials}"
        return "failed" if self.failed else "inconclusive"

    def to_json(self) -> dict:
        return {
            "verdict": self.verdict.label,
            "trials": self.trials,
            "corrupted": self.corrupted,
            "first": self.first.to_json() if self.first else None,
            "reason": self.reason,
            "failed": self.failed,
            "poisons": {name: n for name, n in self.caught},
        }


@attrs.frozen
class Offender:
    """A graph node that touches a shared buffer but is not ordered before the release."""

    node: int  # position of the node in the graph's node list
    kind: str  # "kernel", "memcpy" or "memset"
    name: str  # short kernel name (demangled when possible), or the node kind
    buffers: tuple[str, ...]  # the shared buffers its arguments point into
    symbol: str = ""  # the full (demangled when possible) symbol, when known
    bucket: int | None = None  # the captured bucket whose graph holds the node
    #: ``file.py:line`` of the Python line that launched it during capture (empty: unknown;
    #: `warpolicy.audit.sites`)
    site: str = ""

    @property
    def label(self) -> str:
        """``kernel (file.py:line)``, or the kernel alone when the site is unknown."""
        return f"{self.name} ({self.site})" if self.site else self.name

    def describe(self) -> str:
        where = f"node {self.node}, {self.kind}"
        if self.bucket is not None:
            where = f"bucket {self.bucket} {where}"
        if self.site:
            return f"{self.label} at {where}, touches {', '.join(self.buffers)}"
        return f"{self.name} ({where}) touches {', '.join(self.buffers)}"

    def to_json(self) -> dict:
        return {
            "node": self.node,
            "kind": self.kind,
            "name": self.name,
            "buffers": list(self.buffers),
            "symbol": self.symbol,
            "bucket": self.bucket,
            "site": self.site,
        }


def _offenders(value: Iterable[Offender]) -> tuple[Offender, ...]:
    return tuple(value)


def _strs(value: Iterable[str]) -> tuple[str, ...]:
    return tuple(str(v) for v in value)


def _ints(value: Iterable[int]) -> tuple[int, ...]:
    return tuple(value)


def _entries(value: Iterable[AuditEntry]) -> tuple[AuditEntry, ...]:
    return tuple(value)


@attrs.frozen
class StaticResult:
    """The walk of the captured graph for one declaration."""

    verdict: Verdict
    offenders: tuple[Offender, ...] = attrs.field(default=(), converter=_offenders)
    nodes: int = 0  # nodes in the graph (summed over the buckets walked)
    readers: int = 0  # nodes whose arguments point into a shared buffer
    unreadable: int = 0  # nodes after the release whose memory accesses could not be read
    reason: str = ""
    buckets: tuple[int, ...] = attrs.field(default=(), converter=_ints)  # the graphs walked

    def summary(self) -> str:
        if self.verdict is UNSAFE:
            names = sorted({o.label for o in self.offenders})
            return "unsafe: " + ", ".join(names)
        return self.verdict.label

    def to_json(self) -> dict:
        return {
            "verdict": self.verdict.label,
            "offenders": [o.to_json() for o in self.offenders],
            "nodes": self.nodes,
            "readers": self.readers,
            "unreadable": self.unreadable,
            "reason": self.reason,
            "buckets": list(self.buckets),
        }


@attrs.frozen
class Refutation:
    """A declared ``in_graph`` that the runner's capture self-check refuted: shared readers
    after the marker, so the runner demoted the bucket(s) to ``post_replay``.

    The audit reports such a declaration UNSAFE, not INCONCLUSIVE: the demotion kept the
    running system safe, but the declaration itself is wrong, and honoured it would release the
    scheduler before those readers (the verdict stays ``unsafe`` so every consumer that fails
    on it keeps failing; this record says why)."""

    declared: WarReadDonePolicy
    published: WarReadDonePolicy | None
    buckets: tuple[int, ...] = attrs.field(converter=_ints)
    late: tuple[Offender, ...] = attrs.field(converter=_offenders)  # each tagged with its bucket
    detail: tuple[str, ...] = attrs.field(default=(), converter=_strs)  # the runner's lines

    def summary(self) -> str:
        names = sorted({o.label for o in self.late})
        return "refuted: " + ", ".join(names) if names else "refuted"

    def describe(self) -> str:
        readers = "; ".join(o.describe() for o in self.late)
        published = self.published.label if self.published is not None else "nothing"
        return (
            f"the capture self-check refuted the declared {self.declared.label}: {readers} "
            f"after the marker; the runner demoted bucket(s) "
            f"{', '.join(map(str, self.buckets))} and published {published}"
        )

    def to_json(self) -> dict:
        return {
            "declared": self.declared.label,
            "published": self.published.label if self.published is not None else None,
            "buckets": list(self.buckets),
            "late_readers": [o.to_json() for o in self.late],
            "detail": list(self.detail),
        }


def combine(dynamic: Verdict, static: Verdict) -> Verdict:
    """The entry's verdict: UNSAFE if either audit saw a race; otherwise the dynamic one.

    A clean static walk alone proves nothing (it is blind to indirection), so it never turns
    an inconclusive dynamic audit into SAFE; an unavailable static audit never blocks SAFE.
    """
    if UNSAFE in (dynamic, static):
        return UNSAFE
    return dynamic


@attrs.frozen
class AuditEntry:
    """The audit of one (backend, mode, spec) declaration."""

    backend: str
    mode: ForwardMode
    spec: str
    declared: WarReadDonePolicy | None  # the declaration under audit (None: not given)
    policy: WarReadDonePolicy | None  # what the runner actually published (None: not run)
    dynamic: DynamicResult
    static: StaticResult
    #: the runner's capture self-check refuted the declaration (None: it did not)
    refuted: Refutation | None = None

    @property
    def verdict(self) -> Verdict:
        """UNSAFE when the self-check refuted the declaration; else `combine`."""
        if self.refuted is not None:
            return UNSAFE
        return combine(self.dynamic.verdict, self.static.verdict)

    def reasons(self, skip_static: str = "") -> list[str]:
        """Every line worth printing under the table for this entry (``skip_static``: a static
        reason already printed once for the whole report)."""
        out = []
        if self.refuted is not None:
            out.append(f"self-check: {self.refuted.describe()}")
        if self.dynamic.first is not None:
            out.append(f"dynamic: {self.dynamic.first.describe()}")
            if self.dynamic.caught_line():
                out.append(f"dynamic: {self.dynamic.caught_line()}")
        if self.dynamic.reason:
            out.append(f"dynamic: {self.dynamic.reason}")
        for o in self.static.offenders:
            out.append(f"static: {o.describe()} after the release point")
        if self.static.reason and self.static.reason != skip_static:
            out.append(f"static: {self.static.reason}")
        return out

    def to_json(self) -> dict:
        return {
            "backend": self.backend,
            "mode": self.mode.label,
            "spec": self.spec,
            "declared": self.declared.label if self.declared is not None else None,
            "published": self.policy.label if self.policy is not None else None,
            "verdict": self.verdict.label,
            "dynamic": self.dynamic.to_json(),
            "static": self.static.to_json(),
            "refuted": self.refuted.to_json() if self.refuted is not None else None,
        }


@attrs.frozen
class AuditReport:
    """Every audited declaration of one ``warpolicy audit`` run."""

    entries: tuple[AuditEntry, ...] = attrs.field(converter=_entries)
    device: str = ""
    trials: int = 0
    stall_us: float = 0.0
    allow_inconclusive: bool = False  # INCONCLUSIVE entries do not fail the run

    @property
    def exit_code(self) -> int:
        """`EXIT_UNSAFE`, `EXIT_INCONCLUSIVE` or `EXIT_OK` (see the module docstring)."""
        if any(e.verdict is UNSAFE for e in self.entries):
            return EXIT_UNSAFE
        if not self.entries or any(e.dynamic.failed for e in self.entries):
            return EXIT_INCONCLUSIVE
        if not self.allow_inconclusive and self.count(INCONCLUSIVE):
            return EXIT_INCONCLUSIVE
        return EXIT_OK

    def count(self, verdict: Verdict) -> int:
        return sum(1 for e in self.entries if e.verdict is verdict)

    def to_json(self) -> dict:
        return {
            "device": self.device,
            "trials": self.trials,
            "stall_us": self.stall_us,
            "allow_inconclusive": self.allow_inconclusive,
            "exit_code": self.exit_code,
            "summary": {v.label: self.count(v) for v in Verdict},
            "entries": [e.to_json() for e in self.entries],
            "static_blind_spots": STATIC_BLIND_SPOTS,
        }


#: The audit's formats: the report's text and JSON (no markdown table of an audit).
FORMATS = tuple(f for f in report_formats.FORMATS if f != "markdown")


def format_audit(report: AuditReport, fmt: str = "text") -> str:
    """Render a report as an aligned text table with reasons, or as a JSON document (with
    ``schema_version``, like every JSON output)."""
    if fmt == "json":
        return report_formats.json_document(report.to_json())
    if fmt != "text":
        raise InputError(f"unknown audit format {fmt!r}; use one of: {', '.join(FORMATS)}")
    return _format_text(report)


_COLUMNS = ("backend", "mode", "spec", "declared", "published", "dynamic", "static", "verdict")


def _format_text(report: AuditReport) -> str:
    rows = [
        [
            e.backend,
            e.mode.label,
            e.spec,
            _label(e.declared),
            _label(e.policy),
            e.dynamic.summary(),
            _static_cell(e),
            e.verdict.name,
        ]
        for e in report.entries
    ]
    lines = [
        f"warpolicy audit on {report.device or '?'}: {report.trials} trials per "
        f"declaration, stall {report.stall_us:g} us"
    ]
    lines += report_formats.render_table(_COLUMNS, rows).splitlines()
    shared = _common_static_reason(report.entries)
    details = [(e, e.reasons(skip_static=shared)) for e in report.entries]
    details = [(e, r) for e, r in details if r]
    if details:
        lines.append("")
        for entry, reasons in details:
            lines.append(f"{entry.backend} {entry.mode.label} ({entry.verdict.name}):")
            lines += [f"  {r}" for r in reasons]
    lines.append("")
    failed = sum(1 for e in report.entries if e.dynamic.failed)
    lines.append(
        f"{report.count(SAFE)} safe, {report.count(UNSAFE)} unsafe, "
        f"{report.count(INCONCLUSIVE)} inconclusive" + (f" ({failed} failed)" if failed else "")
    )
    if shared:
        lines.append(f"static (every entry): {shared}")
    lines.append(f"note: {STATIC_BLIND_SPOTS}")
    return "\n".join(lines)


def _static_cell(entry: AuditEntry) -> str:
    """The static column: a refutation by the capture self-check names its late readers (the
    walk of the demoted graph at ``post_replay`` would say "safe")."""
    if entry.refuted is not None and entry.static.verdict is not UNSAFE:
        return entry.refuted.summary()
    return entry.static.summary()


def _common_static_reason(entries: Sequence[AuditEntry]) -> str:
    """The static reason every entry shares (e.g. no cuda-bindings), printed once."""
    reasons = {e.static.reason for e in entries}
    if len(entries) > 1 and len(reasons) == 1:
        return reasons.pop()
    return ""


def _label(policy: WarReadDonePolicy | None) -> str:
    return policy.label if policy is not None else "-"


def _scalar(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.6g}"
    return str(value)
