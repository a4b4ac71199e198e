"""`warpolicy.registry.loader.reading`: the alias bound counts what aliases add, never the
size of a document without them (issue 22: 25,000 plain backends, 2.1 MiB, were refused as
"expands to more than 200000 nodes through YAML aliases")."""

from __future__ import annotations

from warpolicy.registry.loader import Fragment, load_registry, reading, validate_sources


def plain(n: int) -> str:
    lines = ["version: 1", "backends:"]
    for i in range(n):
        lines += [
            f"  b{i}:",
            "    reads_end: {decode: in_graph, extend: post_replay}",
            "    doc: x",
        ]
    return "\n".join(lines) + "\n"


def test_a_large_document_without_aliases_is_not_an_alias_bomb(monkeypatch):
    monkeypatch.setattr(reading, "MAX_NODES", 1_000)
    text = plain(500)  # about 5,000 nodes, five times the bound, none of them through aliases
    assert validate_sources([Fragment("big.yaml", text)]) == []
    assert len(load_registry([Fragment("big.yaml", text)]).backends) == 500


def test_aliases_that_add_more_than_the_bound_are_refused_at_the_first_such_value(monkeypatch):
    monkeypatch.setattr(reading, "MAX_NODES", 1_000)
    kids = ", ".join(f"b{i}" for i in range(100))
    text = (
        plain(100)
        + f"  c0: {{latest_of: &kids [{kids}], doc: x}}\n"
        + "".join(f"  c{i}: {{latest_of: *kids, doc: x}}\n" for i in range(1, 12))
    )
    (problem,) = validate_sources([Fragment("bomb.yaml", text)])
    assert "expands to more than 1000 nodes through YAML aliases" in problem.message
    assert (problem.line, problem.col) == (3, 3)  # `backends:`, the first value over the bound
    fewer = (
        plain(100)
        + f"  c0: {{latest_of: &kids [{kids}], doc: x}}\n  c1: {{latest_of: *kids, doc: x}}\n"
    )
    assert validate_sources([Fragment("ok.yaml", fewer)]) == []
