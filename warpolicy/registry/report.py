"""Rendering decisions, explanations, tables, diffs and plugin lists as text, JSON or markdown.

One table renderer (`render_table`) serves every tabular output; every JSON document carries
``schema_version`` (`JSON_SCHEMA_VERSION`), bumped when a field is removed or changes meaning.
Output is ASCII apart from what registry files themselves contain.
"""

from __future__ import annotations

import json
import textwrap
from collections.abc import Collection, Mapping, Sequence

from warpolicy.registry.cells import CellSpace
from warpolicy.registry.compare import CHANGES, Diff, DiffCell, LayerChange
from warpolicy.registry.decision import Decision, Explanation, GateCheck
from warpolicy.registry.vocabulary import ForwardMode, WarReadDonePolicy

#: Every output format a command may offer.
FORMATS = ("text", "json", "markdown")
#: Formats of commands whose output is not a table (benchmarks, audit).
DATA_FORMATS = tuple(f for f in FORMATS if f != "markdown")
#: The ``schema_version`` of every JSON document the CLI prints.
JSON_SCHEMA_VERSION = 1


def json_document(body: Mapping[str, object]) -> str:
    """A JSON document: ``schema_version`` first, then ``body``."""
    return json.dumps({"schema_version": JSON_SCHEMA_VERSION, **body}, indent=2, default=str)


def _md(text: object) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


#: Detail values a fitted text table leaves out of its continuation lines (nothing to say).
EMPTY_CELLS = frozenset({"-", ""})
#: How far a continuation line is indented under its row or line.
HANG = "    "


def render_table(
    header: Sequence[str],
    rows: Sequence[Sequence[object]],
    fmt: str = "text",
    records: Sequence[Mapping[str, object]] | None = None,
    extra: Mapping[str, object] | None = None,
    *,
    width: int | None = None,
    quiet: Collection[str] = EMPTY_CELLS,
) -> str:
    """``rows`` under ``header`` as an aligned text grid, a markdown table, or a JSON document
    ``{"schema_version", **extra, "rows": records}`` (records default to dicts of the header).

    ``width`` (text only; None: no limit) fits the grid to a terminal: when the whole grid is
    wider, the leading columns that fit stay the grid and each row's other cells follow it on
    indented ``name: value`` lines wrapped to ``width`` (values in ``quiet`` are left out)."""
    if fmt == "json":
        if records is None:
            records = [dict(zip(header, row)) for row in rows]
        return json_document({**(extra or {}), "rows": list(records)})
    if fmt == "markdown":
        lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        lines += ["| " + " | ".join(_md(x) for x in r) + " |" for r in rows]
        return "\n".join(lines)
    cells = [[str(x) for x in r] for r in rows]
    widths = [max(len(x) for x in col) for col in zip(header, *cells)]
    shown = _columns_that_fit(widths, width)
    fmt_line = "  ".join(f"{{:<{w}}}" for w in widths[:shown])
    lines = [fmt_line.format(*header[:shown]), fmt_line.format(*("-" * w for w in widths[:shown]))]
    for row in cells:
        lines.append(fmt_line.format(*row[:shown]))
        for name, value in zip(header[shown:], row[shown:]):
            if value not in quiet:
                lines += fit_lines([f"{HANG}{name}: {value}"], width)
    return "\n".join(line.rstrip() for line in lines)


def _columns_that_fit(widths: Sequence[int], width: int | None) -> int:
    """How many leading columns the grid keeps: all without a limit or when they fit, else as
    many as fit (at least one)."""
    if width is None:
        return len(widths)
    used = -2
    for count, column in enumerate(widths):
        used += column + 2
        if used > width:
            return max(count, 1)
    return len(widths)


def fit_lines(lines: Sequence[str], width: int | None) -> list[str]:
    """``lines`` wrapped to ``width`` columns (None: as they are): a long line breaks at
    blanks, its continuation indented `HANG` deeper than the line; a word longer than the width
    (a path) stays whole."""
    if width is None:
        return list(lines)
    out: list[str] = []
    for line in lines:
        if len(line) <= width:
            out.append(line)
            continue
        lead = line[: len(line) - len(line.lstrip(" "))]
        out += textwrap.wrap(
            line.strip(),
            width=width,
            initial_indent=lead,
            subsequent_indent=lead + HANG,
            break_long_words=False,
            break_on_hyphens=False,
        ) or [line]
    return out


# -- query, table ------------------------------------------------------------------------------


def format_decision(decision: Decision, fmt: str = "text", *, width: int | None = None) -> str:
    """The policy first (text: the first word), then the reasons that moved it (``width``:
    long text lines wrapped, `fit_lines`)."""
    if fmt == "json":
        return json_document(decision.to_json())
    ctx = decision.context
    if fmt == "markdown":
        head = (
            f"**{decision.policy.label}** for `{ctx.backend}` {ctx.mode.label} "
            f"(spec `{ctx.spec}`)\n\n"
        )
        return head + render_table(
            ("reason", "at least", "message", "origin"),
            [(r.id, r.policy.label, r.message, r.origin or "-") for r in decision.reasons],
            "markdown",
        )
    lines = [decision.policy.label]
    lines += [
        f"  {r.id}: {r.message}" + (f" [{r.origin}]" if r.origin else "") for r in decision.reasons
    ]
    return "\n".join(fit_lines(lines, width))


def format_table(
    decisions: Sequence[Decision],
    fmt: str = "text",
    classes: Mapping[tuple[str, ForwardMode, str], Mapping[str, WarReadDonePolicy]] | None = None,
    *,
    width: int | None = None,
) -> str:
    """One row per (backend, mode, spec); ``because`` names the reasons beyond the declaration.

    A cell whose policy varies with per-batch facts is marked ``*`` after its policy (the
    policy for a batch that reports none of them, or the facts given) and its cases are the
    ``per batch`` column (text and markdown: ``pre_replay when num_qo_tokens <= 11673; ...``,
    cut at `MAX_CELL`; JSON: ``per_batch``, every case whole). The column appears only when
    some cell varies. ``classes`` (`PolicyEngine.class_table`): where each buffer class's reads
    end, for the rows whose backend declares classes (the ``classes`` column, JSON
    ``classes``), shown only when some row has them. ``width`` fits the text to a terminal
    (`render_table`); the reasons of a row that only has its declaration are then left out."""
    varies = any(d.cases for d in decisions)
    classes = classes or {}
    classed = any(_key(d) in classes for d in decisions)
    header = ("backend", "mode", "spec", "policy", "because") + (("per batch",) if varies else ())
    header += ("classes",) if classed else ()
    rows, records = [], []
    for d in decisions:
        why = ",".join(r.id for r in d.reasons[1:]) or "declared"
        policy = d.policy.label + ("*" if d.cases else "")
        row: tuple[str, ...] = (
            d.context.backend,
            d.context.mode.label,
            d.context.spec,
            policy,
            why,
        )
        if varies:
            row += (_cut("; ".join(c.text for c in d.cases)) if d.cases else "-",)
        per_class = classes.get(_key(d), {})
        if classed:
            row += (", ".join(f"{n} {p.label}" for n, p in per_class.items()) or "-",)
        rows.append(row)
        record: dict[str, object] = {
            "backend": d.context.backend,
            "mode": d.context.mode.label,
            "spec": d.context.spec,
            "policy": d.policy.label,
            "reasons": [r.id for r in d.reasons],
        }
        if d.cases:
            record["per_batch"] = [c.to_json() for c in d.cases]
        if per_class:
            record["classes"] = {n: p.label for n, p in per_class.items()}
        records.append(record)
    quiet = EMPTY_CELLS | {"declared"}
    table = render_table(header, rows, fmt, records, width=width, quiet=quiet)
    if varies and fmt != "json":
        note = (
            "* varies per batch: the policy shown is for a batch that reports none of the "
            "per-batch facts (--fact NAME=VALUE gives one); 'per batch' lists every case (cut at "
            f"{MAX_CELL} characters: explain or --format json give them whole)"
        )
        table += "\n\n" + (
            f"_{note}_" if fmt == "markdown" else "\n".join(fit_lines([note], width))
        )
    return table


def _key(decision: Decision) -> tuple[str, ForwardMode, str]:
    ctx = decision.context
    return (ctx.backend, ctx.mode, ctx.spec)


# -- explain -----------------------------------------------------------------------------------


def _yes(value: bool) -> str:
    return "yes" if value else "no"


def _context_lines(exp: Explanation) -> list[tuple[str, str]]:
    ctx = exp.decision.context
    caps = ", ".join(f"{k}={_yes(v)}" for k, v in sorted(exp.spec.capabilities.items()))
    return [
        ("backend", f"{ctx.backend}, mode {ctx.mode.label}"),
        ("spec", f"{ctx.spec} (family {exp.spec.family or '-'}; {caps or 'no capabilities'})"),
        (
            "platform",
            f"{ctx.platform}: external events {_yes(ctx.external_events)}, "
            f"{'eager' if ctx.eager else 'captured graph'}, node "
            f"{'planted' if ctx.planted else 'not planted'}",
        ),
        (
            "flags",
            ", ".join(f"{f.name}={str(f.value).lower()} ({f.source})" for f in exp.flags) or "-",
        ),
    ]


def _gate_mark(check: GateCheck) -> str:
    return "raised" if check.raised else ("matched, no effect" if check.matched else "skipped")


def format_explanation(exp: Explanation, fmt: str = "text", *, width: int | None = None) -> str:
    """Every input considered: context, flags, spec, every declaration and child that took part,
    every gate, the built-ins, the result. A child shared by several parents is shown once.
    ``width`` wraps the text's long lines to a terminal (`fit_lines`)."""
    if fmt == "json":
        return json_document(exp.to_json())
    if fmt == "markdown":
        return _explanation_markdown(exp)
    return "\n".join(fit_lines(_explanation_text(exp, "", set()), width))


def _explanation_text(exp: Explanation, indent: str, seen: set[str]) -> list[str]:
    seen.add(exp.backend)
    ctx = exp.decision.context
    lines = [f"{indent}{exp.decision.policy.label}"]
    lines += [
        f"{indent}  {name} {value}"
        if name in ("backend", "spec", "platform")
        else f"{indent}  {name}: {value}"
        for name, value in _context_lines(exp)
    ]
    if not indent:
        lines.append(f"  placement: {exp.placement_text}")
    lines.append(f"{indent}  declared: {exp.declared.label}")
    lines += [f"{indent}    {step}" for step in exp.chain]
    lines += [
        f"{indent}    ({d.backend} declares {ctx.mode.label} at {d.origin})"
        for d in exp.declarations
    ]
    for child in exp.children:
        if child.backend in seen:
            lines.append(
                f"{indent}    child {child.backend}: {child.decision.policy.label} "
                "(explained above)"
            )
            continue
        lines.append(f"{indent}    child {child.backend}:")
        lines += _explanation_text(child, indent + "      ", seen)
    lines.append(f"{indent}  gates:")
    for check in exp.gates:
        lines.append(
            f"{indent}    [{_gate_mark(check)}] {check.gate.id} (at_least "
            f"{check.gate.at_least.label}): {check.why}"
            + (f" -- {check.gate.because}" if check.matched else "")
            + f" [{check.gate.origin}]"
        )
    if not exp.gates:
        lines.append(f"{indent}    (none)")
    if not indent:  # the facts the whole decision read, its cases, its buffer classes
        lines += [f"  {line}" for line in exp.fact_lines()]
        lines += [f"  {line}" for line in exp.class_lines()]
    if exp.force_coarse is not None:
        lines.append(f"{indent}  kill switch: {exp.force_coarse.message}")
    if exp.demotion is not None:
        lines.append(f"{indent}  sound demotion: {exp.demotion.message}")
    lines.append(f"{indent}  result: {exp.decision.policy.label}")
    return lines


def _walk(exp: Explanation) -> list[Explanation]:
    """``exp`` and every distinct backend it runs, parents before children."""
    out, seen, todo = [], set(), [exp]
    while todo:
        node = todo.pop(0)
        if node.backend in seen:
            continue
        seen.add(node.backend)
        out.append(node)
        todo.extend(node.children)
    return out


def _explanation_markdown(exp: Explanation) -> str:
    """For a pull-request comment: a heading with the result, then tables."""
    ctx = exp.decision.context
    parts = [
        f"### warpolicy: `{ctx.backend}` {ctx.mode.label} (spec `{ctx.spec}`) -> "
        f"**{exp.decision.policy.label}**",
        "",
        render_table(
            ("input", "value"),
            _context_lines(exp) + [("placement", exp.placement_text)],
            "markdown",
        ),
        "",
        "**Reasons**",
        "",
        render_table(
            ("reason", "at least", "message", "origin"),
            [(r.id, r.policy.label, r.message, r.origin or "-") for r in exp.decision.reasons],
            "markdown",
        ),
        "",
    ]
    nodes = _walk(exp)
    declarations = [
        (n.backend, d.backend, d.policy.label, d.via, d.origin)
        for n in nodes
        for d in n.declarations
    ]
    parts += ["**Declarations that took part**", ""]
    if declarations:
        parts.append(
            render_table(
                ("for", "declared by", ctx.mode.label, "how", "origin"), declarations, "markdown"
            )
        )
    else:
        parts.append(f"None: `{ctx.backend}` does not declare {ctx.mode.label} (not audited).")
    runs = [
        (n.backend, c.backend, c.declared.label, c.decision.policy.label)
        for n in nodes
        for c in n.children
    ]
    if runs:
        parts += [
            "",
            "**Backends it runs**",
            "",
            render_table(("backend", "runs", "declared", "decided"), runs, "markdown"),
        ]
    facts = exp.fact_lines()
    if facts:
        parts += ["", "**Per-batch facts**", ""] + [f"- {_md(line)}" for line in facts]
    if exp.classes:
        parts += [
            "",
            "**Buffer classes**",
            "",
            render_table(
                ("class", "reads end", "reasons"),
                [(n, d.policy.label, ",".join(r.id for r in d.reasons)) for n, d in exp.classes],
                "markdown",
            ),
        ]
    parts += ["", "**Gates**", ""]
    if exp.gates:
        parts.append(
            render_table(
                ("gate", "at least", "result", "why", "origin"),
                [
                    (c.gate.id, c.gate.at_least.label, _gate_mark(c), c.why, str(c.gate.origin))
                    for c in exp.gates
                ],
                "markdown",
            )
        )
    else:
        parts.append("None.")
    return "\n".join(parts)


# -- diff, layers, plugins ---------------------------------------------------------------------

#: ``schema_version`` of `diff` documents: 2 since ``cells`` holds at most ``--limit`` rows
#: (``summary`` counts every change) and ``when`` may hold ``default``; 3 since cells are
#: compared per class of batch: a cell's ``when`` may name per-batch fact classes, its
#: ``settings`` list flags and runner facts only, and its ``batches`` the
#: per-batch classes under which it differs for each of them (fact -> class label, e.g.
#: ``"num_qo_tokens >= 11674"``; empty: every class; null: the classes depend on the setting,
#: ``when`` says which),
#: ``compared.batch_facts`` lists the facts enumerated, and ``summary.uncompared`` the columns
#: that could not be compared (``needs_audit`` is then true).
DIFF_SCHEMA_VERSION = 3
#: Rows a report lists unless told otherwise (``--limit``; 0 lists every row).
DEFAULT_LIMIT = 100
#: Widest text or markdown cell; longer values (a long ``when``) are cut, JSON keeps them.
MAX_CELL = 120
_ORDER = {kind: i for i, kind in enumerate(CHANGES)}


def _cut(text: object, width: int = MAX_CELL) -> str:
    text = str(text)
    return text if len(text) <= width else text[: width - 3] + "..."


def sorted_cells(diff: Diff) -> list[DiffCell]:
    """Changed cells in report order: what needs an audit first."""
    return sorted(
        diff.cells,
        key=lambda c: (_ORDER[c.change], c.backend, c.mode, c.spec, c.plugins or "", c.when),
    )


def _names(names: Sequence[str], most: int = 8) -> str:
    shown = ", ".join(names[:most])
    return shown + (f", ... ({len(names)} in all)" if len(names) > most else "")


def diff_summary(diff: Diff, shown: int) -> list[str]:
    """Lines that count every change, whatever the listing left out."""
    counts = diff.counts()
    parts = [f"{counts[k]} {k}" for k in CHANGES if counts[k]]
    lines = [f"summary: {', '.join(parts) or 'no'} cell(s)"]
    for what, names in (
        ("added backends", diff.added_backends),
        ("removed backends", diff.removed_backends),
        ("added spec algorithms", diff.added_specs),
        ("removed spec algorithms", diff.removed_specs),
    ):
        if names:
            lines.append(f"{what}: {_names(list(names))}")
    total = len(diff.cells) + sum(diff.unlisted.values())
    if shown < total:
        lines.append(
            f"listed: {shown} of {total} row(s); --limit 0 lists every row "
            "(--format json keeps long values whole)"
        )
    for what in diff.uncompared:
        lines.append(f"cannot compare {what} (counts as needing an audit)")
    for flag in diff.flags:
        lines.append(
            f"flag {flag.name}: env [{', '.join(flag.old_env)}] -> [{', '.join(flag.new_env)}] "
            f"({flag.change}: a deployment that sets these may resolve it differently)"
            + (f" [plugins {flag.plugins}]" if flag.plugins else "")
        )
    return lines


def format_diff(
    diff: Diff,
    space: CellSpace,
    fmt: str = "text",
    plugins: str | None = None,
    limit: int | None = DEFAULT_LIMIT,
    *,
    width: int | None = None,
) -> str:
    """Changed cells (``earlier`` first, at most ``limit`` rows; None or 0: all), a summary
    that counts every change, and what was compared and held fixed. ``width`` (text only):
    the grid fits a terminal as `render_table` fits it, the summary lines are wrapped."""
    cells = sorted_cells(diff)
    listed = cells if not limit else cells[:limit]
    with_plugins = any(c.plugins for c in cells) or plugins == "both"
    if fmt == "json":
        records = [
            {
                "backend": c.backend,
                "mode": c.mode,
                "spec": c.spec,
                "when": c.when,
                **c.settings_json(),
                "old": c.old,
                "new": c.new,
                "change": c.change,
                "plugins": c.plugins,
            }
            for c in listed
        ]
        summary = {
            "cells": diff.counts(),
            "rows": len(cells) + sum(diff.unlisted.values()),
            "listed": len(records),
            "added_backends": list(diff.added_backends),
            "removed_backends": list(diff.removed_backends),
            "added_specs": list(diff.added_specs),
            "removed_specs": list(diff.removed_specs),
            "needs_audit": diff.needs_audit,
            "uncompared": list(diff.uncompared),
        }
        flags = [
            {
                "flag": f.name,
                "old_env": list(f.old_env),
                "new_env": list(f.new_env),
                "change": f.change,
                "plugins": f.plugins,
            }
            for f in diff.flags
        ]
        return json.dumps(
            {
                "schema_version": DIFF_SCHEMA_VERSION,
                "compared": space.to_json(),
                "plugins": plugins,
                "summary": summary,
                "flags": flags,
                "cells": records,
            },
            indent=2,
            default=str,
        )
    header = ("backend", "mode", "spec", "when", "old", "new", "change") + (
        ("plugins",) if with_plugins else ()
    )
    rows = [
        (c.backend, c.mode, c.spec, _cut(c.when), c.old, c.new, c.change)
        + ((c.plugins or "-",) if with_plugins else ())
        for c in listed
    ]
    about = diff_summary(diff, len(listed)) + space.describe()
    about += [f"plugins: {plugins}"] if plugins else []
    if fmt == "markdown":
        body = render_table(header, rows, "markdown") if rows else "No policy changes."
        return body + "\n\n" + "\n".join(f"- {line}" for line in about)
    body = render_table(header, rows, width=width) if rows else "no policy changes"
    return body + "\n\n" + "\n".join(fit_lines(about, width))


def layer_warnings(changes: Sequence[LayerChange]) -> list[str]:
    """One line per layer that makes cells earlier (or could not be compared)."""
    lines = []
    for change in changes:
        if change.note and not change.cells and not change.flags:
            lines.append(f"layer {change.layer}: {change.note}")
            continue
        parts = [change.note] if change.note else []
        if change.cells:
            first = change.cells[0]
            parts.append(
                f"makes {len(change.cells)} cell(s) earlier than the layers below it, e.g. "
                f"{first.backend} {first.mode} spec {first.spec} "
                f"({_cut(first.when)}): {first.old} -> {first.new}"
                + ("" if first.change == "earlier" else f" ({first.change})")
            )
        for flag in change.flags:
            parts.append(
                f"changes the environment names of flag {flag.name} "
                f"([{', '.join(flag.old_env)}] -> [{', '.join(flag.new_env)}])"
            )
        lines.append(f"layer {change.layer} " + "; ".join(parts))
    return lines


def _plugin_of(layer: str) -> str | None:
    """``plugin:NAME``, ``plugin:NAME[i]`` or ``plugin:NAME:PATH`` -> NAME."""
    if not layer.startswith("plugin:"):
        return None
    return layer[len("plugin:") :].split("[", 1)[0].split(":", 1)[0] or None


def _strings(value: object) -> list[str]:
    return [str(v) for v in value] if isinstance(value, (list, tuple)) else []


def format_plugins(
    plugins: Sequence[Mapping[str, object]],
    fmt: str = "text",
    layers: Sequence[LayerChange] = (),
    *,
    width: int | None = None,
) -> str:
    """Every plugin, and how many cells its registry fragment makes earlier (``width``: the
    text grid fits a terminal, `render_table`)."""
    earlier: dict[str, list[str]] = {}
    for change in layers:
        name = _plugin_of(change.layer)
        if name is not None:
            earlier.setdefault(name, []).extend(layer_warnings([change]))
    records = [{**p, "earlier": earlier.get(str(p["name"]), [])} for p in plugins]
    header = ("name", "version", "source", "status", "hooks", "earlier cells")
    rows = []
    for p in plugins:  # text drops the common warpolicy_ prefix; json keeps full names
        hooks = [str(h).removeprefix("warpolicy_") for h in _strings(p.get("hooks"))]
        found = earlier.get(str(p["name"]), [])
        rows.append(
            (
                p["name"],
                p.get("version") or "-",
                p["source"],
                p.get("status", "active"),
                ", ".join(hooks) or "-",
                "; ".join(found) if found else "-",
            )
        )
    return render_table(header, rows, fmt, records, width=width)
