"""A declaration the runner's capture self-check refuted (issue 19 item 6), on the simulated
platform: the self-check demotes a declared ``in_graph`` marker bucket whose graph has a shared
reader after the marker; the audit must then say UNSAFE naming that reader (text and JSON, exit
code 1), not INCONCLUSIVE with a "safe" static column."""

from __future__ import annotations

import json

import pytest

from warpolicy.audit import EXIT_INCONCLUSIVE, EXIT_UNSAFE, AuditReport, Verdict, format_audit
from warpolicy.audit.dynamic import audit_mode
from warpolicy.audit.static import self_check_refutation
from warpolicy.registry.vocabulary import IN_GRAPH, POST_REPLAY, ForwardMode
from warpolicy.runtime.graphwalk import Graph, Node, NodeKind
from warpolicy.runtime.platforms.sim import SimGraph
from warpolicy.runtime.runners import DecodeRunner
from warpolicy.testing import sim_impl, sim_platform

from audit_subjects import TableModel, table_subject

DECODE = ForwardMode.DECODE
SAFE, UNSAFE, INCONCLUSIVE = Verdict.SAFE, Verdict.UNSAFE, Verdict.INCONCLUSIVE


def kernel(i: int, deps=(), ptr: int = 0, name: str = "") -> Node:
    return Node(i, NodeKind.KERNEL, name, deps=deps, words=(ptr,) if ptr else ())


def graph_of(model: TableModel, graph: SimGraph, late: str = "") -> Graph:
    """gather (reads table) -> marker -> forward [-> ``late``: a kernel reading table again]."""
    table = model.table.data_ptr()
    marker = graph.planted[0].id if graph.planted else 0
    nodes = [
        kernel(0, ptr=table, name="index_select_prep"),
        Node(1, NodeKind.EVENT_RECORD, deps=(0,), event=marker),
        kernel(2, deps=(1,), name="mul_forward"),
    ]
    if late == "kernel":
        nodes.append(kernel(3, deps=(2,), ptr=table + 8, name="page_table_rebuild"))
    elif late == "host":
        nodes.append(Node(3, NodeKind.HOST, deps=(2,)))
    return Graph(nodes)


def subject(late: str = "", *, declared=IN_GRAPH, self_check: str = "warn", model_fn=None):
    """The table subject, declared ``declared``, whose runner self-checks its marker on a graph
    model with (or without) a late reader."""
    platform = sim_platform()
    model = TableModel()
    sim_impl(platform).graph_model = model_fn or (lambda g: graph_of(model, g, late))
    return table_subject(
        declared,
        platform=platform,
        model=model,
        runner_cls=lambda m, policy, p: DecodeRunner(m, policy, p, self_check=self_check),
    )


def audit(subj, trials: int = 2, match: str = "demoted to post_replay"):
    with pytest.warns(RuntimeWarning, match=match):
        return audit_mode(subj, DECODE, trials=trials)


class TestRefuted:
    def test_a_refuted_declaration_is_unsafe_naming_the_late_reader(self):
        entry = audit(subject("kernel"))
        assert entry.policy is POST_REPLAY  # the runner demoted every bucket
        assert entry.dynamic.verdict is INCONCLUSIVE  # post_replay does not exercise in_graph
        assert entry.verdict is UNSAFE
        refuted = entry.refuted
        assert refuted is not None and refuted.buckets == (2, 4)
        assert {(o.name, o.buffers, o.bucket) for o in refuted.late} == {
            ("page_table_rebuild", ("table",), 2),
            ("page_table_rebuild", ("table",), 4),
        }
        assert refuted.declared is IN_GRAPH and refuted.published is POST_REPLAY
        assert all("shared reader(s) after the read-done node" in d for d in refuted.detail)

    def test_exit_code_text_and_json(self):
        entry = audit(subject("kernel"))
        report = AuditReport((entry,), device="sim", trials=2)
        assert report.exit_code == EXIT_UNSAFE
        text = format_audit(report)
        row = next(line for line in text.splitlines() if line.startswith("table"))
        assert "refuted: page_table_rebuild" in row and row.rstrip().endswith("UNSAFE")
        assert "safe" not in row.split("refuted")[1]  # no "safe" static column any more
        assert (
            "self-check: the capture self-check refuted the declared in_graph: "
            "page_table_rebuild (bucket 2 node 3, kernel) touches table" in text
        )
        doc = json.loads(format_audit(report, "json"))
        assert next(iter(doc)) == "schema_version" and doc["schema_version"] == 1
        assert doc["exit_code"] == EXIT_UNSAFE and doc["summary"]["unsafe"] == 1
        got = doc["entries"][0]
        assert got["verdict"] == "unsafe" and got["declared"] == "in_graph"
        assert got["published"] == "post_replay"
        assert got["refuted"]["buckets"] == [2, 4]
        assert [r["name"] for r in got["refuted"]["late_readers"]] == ["page_table_rebuild"] * 2

    def test_a_clean_self_check_refutes_nothing(self):
        entry = audit_mode(subject(""), DECODE, trials=2)
        assert entry.refuted is None and entry.verdict is SAFE, entry.dynamic
        assert (
            json.loads(format_audit(AuditReport((entry,)), "json"))["entries"][0]["refuted"] is None
        )

    def test_a_late_node_the_walk_cannot_see_is_not_a_refutation(self):
        # a host node after the marker demotes the bucket (fail closed) but proves nothing
        entry = audit(subject("host"))
        assert entry.refuted is None
        assert entry.verdict is INCONCLUSIVE
        assert AuditReport((entry,)).exit_code == EXIT_INCONCLUSIVE

    def test_a_check_that_could_not_run_is_not_a_refutation(self):
        # the marker is not in the graph: a doubt, so the bucket publishes nothing (coarse)
        entry = audit(subject(model_fn=lambda g: Graph(())), match="publishes nothing")
        assert entry.refuted is None and entry.verdict is INCONCLUSIVE
        assert "nothing to audit" in entry.dynamic.reason

    def test_without_the_self_check_the_dynamic_test_judges_alone(self):
        entry = audit_mode(subject("kernel", self_check="off"), DECODE, trials=2)
        assert entry.refuted is None and entry.policy is IN_GRAPH
        assert (
            entry.verdict is SAFE
        )  # the table model's late "kernel" exists only in the graph model

    def test_only_a_declared_in_graph_can_be_refuted(self):
        entry = audit(subject("kernel"))
        runner_like = type("R", (), {"capture_report": {}, "captured": {}})()
        assert self_check_refutation(runner_like, {}, IN_GRAPH, POST_REPLAY) is None
        assert entry.refuted is not None
        assert self_check_refutation(None, {}, POST_REPLAY, POST_REPLAY) is None
