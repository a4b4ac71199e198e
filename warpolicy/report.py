"""Rendering decisions, explanations, tables, diffs and plugin lists for the CLI."""

from __future__ import annotations

import json
from typing import Iterable, Mapping, Optional, Sequence

import attrs

from warpolicy.engine import Context, Decision, Explanation, PolicyEngine
from warpolicy.policy import TABLE_MODES, ForwardMode


def _grid(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows)]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    lines = [fmt.format(*header), fmt.format(*("-" * w for w in widths))]
    lines += [fmt.format(*r) for r in rows]
    return "\n".join(line.rstrip() for line in lines)


def _markdown(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(x) for x in r) + " |" for r in rows]
    return "\n".join(lines)


def _render(header: Sequence[str], rows: Sequence[Sequence[str]], records: list[dict],
            fmt: str) -> str:
    if fmt == "json":
        return json.dumps(records, indent=2)
    if fmt == "markdown":
        return _markdown(header, rows)
    return _grid(header, rows)


def format_table(decisions: Sequence[Decision], fmt: str = "text") -> str:
    """One row per (backend, mode, spec); ``gates`` names the reasons beyond the declaration."""
    header = ("backend", "mode", "spec", "policy", "because")
    rows, records = [], []
    for d in decisions:
        why = ",".join(r.id for r in d.reasons[1:]) or "declared"
        rows.append((d.context.backend, d.context.mode.label, d.context.spec, d.policy.label, why))
        records.append({"backend": d.context.backend, "mode": d.context.mode.label,
                        "spec": d.context.spec, "policy": d.policy.label,
                        "reasons": [r.id for r in d.reasons]})
    return _render(header, rows, records, fmt)


def format_explanation(exp: Explanation, indent: str = "") -> str:
    """Every input considered: context, flags, spec, declared chain, gates, demotion, result."""
    ctx = exp.decision.context
    lines = [f"{indent}{exp.decision.policy.label}",
             f"{indent}  backend {ctx.backend}, mode {ctx.mode.label}, spec {ctx.spec} "
             f"(family {exp.spec.family or '-'}; "
             + ", ".join(f"{k}={'yes' if v else 'no'}" for k, v in
                         sorted(exp.spec.capabilities.items())) + ")",
             f"{indent}  platform {ctx.platform}: external events "
             f"{'yes' if ctx.external_events else 'no'}, "
             f"{'eager' if ctx.eager else 'captured graph'}, node "
             f"{'planted' if ctx.planted else 'not planted'}",
             f"{indent}  flags: " + ", ".join(
                 f"{f.name}={'true' if f.value else 'false'} ({f.source})" for f in exp.flags),
             f"{indent}  declared: {exp.declared.label}"]
    lines += [f"{indent}    {step}" for step in exp.chain]
    for child in exp.children:
        lines.append(f"{indent}    child {child.decision.context.backend}:")
        lines.append(format_explanation(child, indent + "      "))
    lines.append(f"{indent}  gates:")
    for check in exp.gates:
        mark = "raised" if check.raised else ("matched, no effect" if check.matched else "skipped")
        lines.append(f"{indent}    [{mark}] {check.gate.id} (at_least {check.gate.at_least.label})"
                     f": {check.why}" + (f" -- {check.gate.because}" if check.matched else "")
                     + f" [{check.gate.origin}]")
    if not exp.gates:
        lines.append(f"{indent}    (none)")
    if exp.demotion is not None:
        lines.append(f"{indent}  sound demotion: {exp.demotion.message}")
    lines.append(f"{indent}  result: {exp.decision.policy.label}")
    return "\n".join(lines)


@attrs.frozen
class DiffCell:
    backend: str
    mode: ForwardMode
    spec: str
    old: str  # policy label, or "absent" when the backend/spec is missing on that side
    new: str


def _cells(engine: PolicyEngine, backends: Iterable[str], specs: Iterable[str],
           modes: Sequence[ForwardMode], flags: Mapping[str, bool], facts: dict) -> dict:
    reg = engine.registry
    known_specs = set(engine.spec_names())
    cells = {}
    for b in backends:
        for s in specs:
            for m in modes:
                if b in reg.backends and s in known_specs:
                    ctx = Context(b, m, s, {k: v for k, v in flags.items() if k in reg.flags},
                                  **facts)
                    cells[(b, m, s)] = engine.decision(ctx).policy.label
                else:
                    cells[(b, m, s)] = "absent"
    return cells


def diff_engines(old: PolicyEngine, new: PolicyEngine, modes: Optional[Iterable[str]] = None,
                 flags: Optional[Mapping[str, bool]] = None, **facts) -> list[DiffCell]:
    """Every (backend, mode, spec) cell whose policy differs between two registries."""
    mode_list = [ForwardMode.parse(m) for m in modes] if modes else list(TABLE_MODES)
    backends = sorted(set(old.registry.concrete_backends()) | set(new.registry.concrete_backends()))
    specs = sorted(set(old.spec_names()) | set(new.spec_names()))
    for name in flags or {}:
        if name not in old.registry.flags and name not in new.registry.flags:
            new.registry.flag(name)  # raises UnknownNameError with suggestions
    a = _cells(old, backends, specs, mode_list, flags or {}, facts)
    b = _cells(new, backends, specs, mode_list, flags or {}, facts)
    return [DiffCell(k[0], k[1], k[2], a[k], b[k]) for k in a if a[k] != b[k]]


def format_diff(cells: Sequence[DiffCell], fmt: str = "text") -> str:
    if not cells and fmt == "text":
        return "no policy changes"
    header = ("backend", "mode", "spec", "old", "new", "change")
    rows, records = [], []
    for c in cells:
        change = _change(c.old, c.new)
        rows.append((c.backend, c.mode.label, c.spec, c.old, c.new, change))
        records.append({"backend": c.backend, "mode": c.mode.label, "spec": c.spec,
                        "old": c.old, "new": c.new, "change": change})
    return _render(header, rows, records, fmt)


def _change(old: str, new: str) -> str:
    """``earlier`` is what a reviewer must audit: the fence now releases sooner."""
    from warpolicy.policy import WarReadDonePolicy

    if "absent" in (old, new):
        return "added" if old == "absent" else "removed"
    return "earlier" if WarReadDonePolicy.parse(new) < WarReadDonePolicy.parse(old) else "later"


def format_plugins(plugins: Sequence[Mapping], fmt: str = "text") -> str:
    if fmt == "json":
        return json.dumps(list(plugins), indent=2)
    header = ("name", "version", "source", "status", "hooks")
    rows = [(p["name"], p.get("version") or "-", p["source"], p.get("status", "active"),
             ", ".join(h.removeprefix("warpolicy_") for h in p.get("hooks", ())) or "-")
            for p in plugins]  # text drops the common warpolicy_ prefix; json keeps full names
    return _grid(header, rows)
