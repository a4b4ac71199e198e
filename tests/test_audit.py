"""The audit's bookkeeping on CPU, through the fake platform: verdicts, the first differing
output and trial, INCONCLUSIVE reasons, factory strings, report formatting, and the static
audit's graph analysis on hand-made graphs."""

from __future__ import annotations

import ctypes
import enum
import json
import sys
import textwrap
import types

import attrs
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from warpolicy.audit import (AuditReport, AuditSubject, Verdict, format_audit, parse_modes,
                             parse_synthetic, resolve_factory, run_audit)
from warpolicy.audit.api import call_factory
from warpolicy.audit.dynamic import (StalledModel, audit_mode, default_poison,
                                     dynamic_verdict, first_mismatch, flatten_outputs,
                                     snapshot_outputs)
from warpolicy.audit.report import (AuditEntry, DynamicResult, Mismatch, Offender,
                                    StaticResult, combine)
from warpolicy.audit.static import (BufferRange, GraphNode, analyze_graph, ancestors,
                                    audit_static, buffers_hit, buffers_overlapping,
                                    short_kernel_name, tensor_range, words)
from warpolicy.errors import CudaUnavailableError, InputError, UnknownNameError
from warpolicy.policy import ForwardMode, WarReadDonePolicy
from warpolicy.runners import DecodeRunner
from warpolicy.platform import sim_platform as fake_platform

SAFE, UNSAFE, INCONCLUSIVE = Verdict.SAFE, Verdict.UNSAFE, Verdict.INCONCLUSIVE
PRE, IN, POST, NONE = (WarReadDonePolicy.PRE_REPLAY, WarReadDonePolicy.IN_GRAPH,
                       WarReadDonePolicy.POST_REPLAY, WarReadDonePolicy.NONE)
DECODE = ForwardMode.DECODE


# ---------------------------------------------------------------------------------------------
# A tiny subject whose late read can be switched on per trial
# ---------------------------------------------------------------------------------------------

@attrs.frozen
class TrialBatch:
    trial: int
    rows: torch.Tensor  # indices into the shared table


class TableModel:
    """Prep gathers ``table[rows]`` in-graph; ``late_from`` makes trials >= it reread the live
    table in a post step (a reader after the release)."""

    def __init__(self, fail: bool = False) -> None:
        self.table = torch.arange(10, 20, dtype=torch.long)
        self.shared_buffers = {"table": self.table}
        self.static: dict[int, dict] = {}
        self.fail = fail

    def bucket_sizes(self, mode):
        return (2, 4)

    def batch_size(self, batch: TrialBatch) -> int:
        return int(batch.rows.numel())

    def prepare_bucket(self, bucket: int) -> None:
        self.static.setdefault(bucket, {"rows": torch.zeros(bucket, dtype=torch.long),
                                        "snap": torch.zeros(bucket, dtype=torch.long),
                                        "out": torch.zeros(bucket)})

    def host_prep(self, batch: TrialBatch, bucket: int) -> None:
        s = self.static[bucket]
        n = batch.rows.numel()
        s["rows"][:n].copy_(batch.rows)
        s["rows"][n:].zero_()

    def graph_prep(self, bucket: int) -> None:
        s = self.static[bucket]
        torch.index_select(self.table, 0, s["rows"], out=s["snap"])

    def forward(self, bucket: int) -> torch.Tensor:
        if self.fail:
            raise RuntimeError("boom in forward")
        s = self.static[bucket]
        s["out"].copy_(s["snap"].float() * 2)
        return s["out"]


def table_subject(policy=IN, *, late_from=None, declared=None, fail=False, platform=None):
    platform = platform or fake_platform()
    model = TableModel(fail=fail)

    def make_batch(mode, trial):
        return TrialBatch(trial, torch.tensor([trial % 10, (trial + 3) % 10]))

    def post_step(mode, batch, out):
        if late_from is not None and batch.trial >= late_from:
            return out + model.table[:out.shape[0]].float()  # reads the live table
        return out.clone()

    policy_fn = (lambda mode, eager, planted: policy)
    return AuditSubject(
        name="table", model=model, platform=platform, make_batch=make_batch,
        runners={"decode": lambda m: DecodeRunner(m, policy_fn, platform)},
        declared={"decode": declared if declared is not None else policy},
        post_step=post_step)


# ---------------------------------------------------------------------------------------------
# Verdict logic
# ---------------------------------------------------------------------------------------------

def test_dynamic_verdict_unsafe_on_any_difference_even_with_notes():
    m = Mismatch(3, "out", (1,), 1.0, 2.0, 1)
    result = dynamic_verdict(10, 2, m, ["eager"])
    assert result.verdict is UNSAFE and result.first == m and result.corrupted == 2


def test_dynamic_verdict_inconclusive_with_notes_safe_without():
    assert dynamic_verdict(5, 0, None, ["why"]).verdict is INCONCLUSIVE
    assert dynamic_verdict(5, 0, None, ["why"]).reason == "why"
    assert dynamic_verdict(5, 0, None).verdict is SAFE
    assert dynamic_verdict(0, 0, None).verdict is INCONCLUSIVE  # nothing checked: never SAFE
    assert audit_mode(table_subject(IN), DECODE, trials=0).verdict is INCONCLUSIVE


@pytest.mark.parametrize("dyn, stat, want", [
    (SAFE, SAFE, SAFE), (SAFE, INCONCLUSIVE, SAFE), (SAFE, UNSAFE, UNSAFE),
    (UNSAFE, SAFE, UNSAFE), (INCONCLUSIVE, SAFE, INCONCLUSIVE),
    (INCONCLUSIVE, UNSAFE, UNSAFE), (INCONCLUSIVE, INCONCLUSIVE, INCONCLUSIVE)])
def test_combine(dyn, stat, want):
    assert combine(dyn, stat) is want


def _entry(dyn: Verdict, stat: Verdict = INCONCLUSIVE) -> AuditEntry:
    return AuditEntry("b", DECODE, "none", IN, IN, DynamicResult(dyn), StaticResult(stat))


@pytest.mark.parametrize("verdicts, code", [
    ([SAFE, SAFE], 0), ([SAFE, UNSAFE], 1), ([INCONCLUSIVE], 0), ([INCONCLUSIVE, UNSAFE], 1),
    ([], 0)])
def test_exit_code(verdicts, code):
    assert AuditReport(tuple(_entry(v) for v in verdicts)).exit_code == code


# ---------------------------------------------------------------------------------------------
# Comparison and poison
# ---------------------------------------------------------------------------------------------

def test_first_mismatch_reports_first_index_values_and_count():
    ref = [("out", torch.tensor([[1.0, 2.0], [3.0, 4.0]]))]
    got = [("out", torch.tensor([[1.0, 2.0], [9.0, 8.0]]))]
    m = first_mismatch(ref, got, trial=7)
    assert (m.trial, m.output, m.index, m.expected, m.got, m.count) == (7, "out", (1, 0), 3.0,
                                                                        9.0, 2)
    assert "trial 7" in m.describe() and "out[1, 0]" in m.describe()


def test_first_mismatch_none_when_equal_and_nan_equals_nan():
    t = torch.tensor([1.0, float("nan")])
    assert first_mismatch([("out", t)], [("out", t.clone())], 0) is None


def test_first_mismatch_walks_nested_outputs_in_order():
    ref = snapshot_outputs({"b": torch.ones(2), "a": (torch.zeros(1), torch.ones(1))})
    got = snapshot_outputs({"b": torch.ones(2), "a": (torch.zeros(1), torch.zeros(1))})
    assert [label for label, _ in ref] == ["out['a'][0]", "out['a'][1]", "out['b']"]
    assert first_mismatch(ref, got, 1).output == "out['a'][1]"


def test_first_mismatch_shape_change_is_a_difference():
    m = first_mismatch([("out", torch.ones(2))], [("out", torch.ones(3))], 0)
    assert m is not None and m.index == ()


def test_flatten_outputs_ignores_non_tensors():
    assert flatten_outputs(None) == [] and flatten_outputs("x") == []


@pytest.mark.parametrize("values", [[0, 5, 7, 3], [0, 0, 0], [-1, 0, -1], [4]])
def test_default_poison_integer_changes_every_element_within_range(values):
    t = torch.tensor(values, dtype=torch.long)
    p = default_poison(t)
    assert (p != t).all()
    assert int(p.min()) >= 0 and int(p.max()) <= max(1, int(t.max()))


def test_default_poison_bool_and_float():
    b = torch.tensor([True, False])
    assert (default_poison(b) == torch.tensor([False, True])).all()
    f = torch.tensor([0.5, -2.0])
    assert (default_poison(f) != f).all()


def test_stalled_model_stalls_before_each_segment_and_delegates():
    calls = []
    model = TableModel()
    stalled = StalledModel(model, lambda: calls.append("stall"))
    stalled.prepare_bucket(2)
    stalled.graph_prep(2)
    stalled.forward(2)
    assert calls == ["stall", "stall"]
    assert stalled.shared_buffers is model.shared_buffers
    assert stalled.bucket_sizes(DECODE) == (2, 4)


# ---------------------------------------------------------------------------------------------
# Whole audits through the fake platform
# ---------------------------------------------------------------------------------------------

def test_safe_subject_is_safe_and_shared_state_restored():
    subject = table_subject(IN)
    before = subject.model.table.clone()
    entry = audit_mode(subject, DECODE, trials=4)
    assert entry.dynamic.verdict is SAFE and entry.dynamic.trials == 4
    assert entry.policy is IN and entry.declared is IN
    assert torch.equal(subject.model.table, before)


def test_first_differing_trial_is_recorded():
    entry = audit_mode(table_subject(IN, late_from=3), DECODE, trials=6)
    assert entry.verdict is UNSAFE
    assert entry.dynamic.first.trial == 3
    assert entry.dynamic.corrupted == 3  # trials 3, 4, 5
    assert entry.dynamic.first.output == "out" and entry.dynamic.first.index == (0,)


def test_release_point_matters_pre_replay_sees_poison_in_graph_prep():
    # the table is read in the in-graph prep: sound for in_graph, unsound for pre_replay
    assert audit_mode(table_subject(IN), DECODE, trials=2).verdict is SAFE
    assert audit_mode(table_subject(POST), DECODE, trials=2).verdict is SAFE
    assert audit_mode(table_subject(PRE), DECODE, trials=2).verdict is UNSAFE


def test_none_policy_is_inconclusive_nothing_to_audit():
    entry = audit_mode(table_subject(NONE), DECODE, trials=3)
    assert entry.verdict is INCONCLUSIVE
    assert "nothing to audit" in entry.dynamic.reason and entry.dynamic.trials == 0
    assert "nothing to audit" in entry.static.reason


def test_demoted_declaration_is_inconclusive():
    entry = audit_mode(table_subject(POST, declared=IN), DECODE, trials=2)
    assert entry.verdict is INCONCLUSIVE
    assert "declared in_graph but the runner published post_replay" in entry.dynamic.reason


def test_no_external_events_demotes_in_graph_and_says_so():
    report = run_audit(synthetic="late_swa_read", trials=2,
                       platform=fake_platform(external_events=False))
    for entry in report.entries:
        assert entry.policy is POST and entry.verdict is INCONCLUSIVE
        assert "demoted" in entry.dynamic.reason


def test_eager_step_is_noted():
    subject = table_subject(IN)
    big = attrs.evolve(subject, make_batch=lambda mode, trial: TrialBatch(
        trial, torch.arange(6) % 10))  # larger than every bucket: eager
    entry = audit_mode(big, DECODE, trials=2)
    assert entry.verdict is INCONCLUSIVE
    assert "ran eagerly" in entry.dynamic.reason
    assert "no captured graph" in entry.static.reason


def test_missing_runner_is_inconclusive():
    entry = audit_mode(table_subject(IN), ForwardMode.EXTEND, trials=2)
    assert entry.verdict is INCONCLUSIVE and "no runner for mode extend" in entry.dynamic.reason


def test_failing_subject_is_inconclusive_not_a_crash():
    entry = audit_mode(table_subject(IN, fail=True), DECODE, trials=2)
    assert entry.verdict is INCONCLUSIVE
    assert "audit failed: RuntimeError: boom in forward" in entry.dynamic.reason


def test_static_audit_on_the_fake_is_unavailable():
    entry = audit_mode(table_subject(IN), DECODE, trials=1)
    assert entry.static.verdict is INCONCLUSIVE
    assert entry.static.reason.startswith("static audit unavailable: platform 'sim'")


def test_audit_static_never_raises():
    class Broken:
        @property
        def platform(self):
            raise RuntimeError("no platform")

    result = audit_static(Broken(), 4, {}, IN)
    assert result.verdict is INCONCLUSIVE and "no platform" in result.reason


# ---------------------------------------------------------------------------------------------
# run_audit arguments, factory strings
# ---------------------------------------------------------------------------------------------

def test_run_audit_needs_exactly_one_source():
    with pytest.raises(InputError, match="exactly one"):
        run_audit()
    with pytest.raises(InputError, match="exactly one"):
        run_audit(factory="a:b", synthetic="in_graph")


@pytest.mark.parametrize("trials", [0, -1, 2.5, "x", True])
def test_run_audit_rejects_bad_trials(trials):
    with pytest.raises(InputError, match="--trials"):
        run_audit(synthetic="in_graph", trials=trials, platform=fake_platform())


def test_run_audit_rejects_negative_stall():
    with pytest.raises(InputError, match="--stall-us"):
        run_audit(synthetic="in_graph", stall_us=-1, platform=fake_platform())


def test_unknown_synthetic_name_suggests():
    with pytest.raises(UnknownNameError, match="did you mean 'in_graph'"):
        run_audit(synthetic="in_grap", platform=fake_platform())


def test_unknown_mode_raises():
    with pytest.raises(UnknownNameError):
        run_audit(synthetic="in_graph", modes="decod", platform=fake_platform())


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA path")
def test_no_cuda_raises_cuda_unavailable():
    with pytest.raises(CudaUnavailableError, match="needs a CUDA device"):
        run_audit(synthetic="in_graph")


def test_usage_errors_come_before_the_device_check():
    with pytest.raises(UnknownNameError):
        run_audit(synthetic="nope", device="cuda")


def test_parse_modes():
    assert parse_modes(None) is None
    assert parse_modes("decode, prefill,decode") == [DECODE, ForwardMode.EXTEND]
    assert parse_modes(["verify"]) == [ForwardMode.TARGET_VERIFY]
    assert parse_modes(["decode,verify", ForwardMode.EXTEND]) == [
        DECODE, ForwardMode.TARGET_VERIFY, ForwardMode.EXTEND]
    with pytest.raises(InputError):
        parse_modes(" , ")


def test_parse_synthetic_all_and_lists():
    from warpolicy.testing.synthetic import synthetic_names

    assert parse_synthetic("all") == synthetic_names()
    assert parse_synthetic("late_swa_read,in_graph,late_swa_read") == ["late_swa_read",
                                                                      "in_graph"]


def test_modes_filter_limits_entries():
    report = run_audit(synthetic="in_graph", modes="verify", trials=1, platform=fake_platform())
    assert [e.mode for e in report.entries] == [ForwardMode.TARGET_VERIFY]


@pytest.mark.parametrize("text, match", [
    ("nocolon", "expected MODULE:CALLABLE"),
    (":make", "expected MODULE:CALLABLE"),
    ("json:", "expected MODULE:CALLABLE"),
    ("no_such_module_xyz:make", "cannot import 'no_such_module_xyz'"),
    ("json:no_such_attr", "has no attribute 'no_such_attr'"),
    ("json.decoder:__doc__", "is not callable"),
])
def test_resolve_factory_errors(text, match):
    with pytest.raises(InputError, match=match):
        resolve_factory(text)


def test_resolve_factory_dotted_attribute():
    assert resolve_factory("json:JSONDecoder.decode") is json.JSONDecoder.decode


@pytest.fixture
def factory_module(tmp_path, monkeypatch):
    """An importable module holding audit factories (removed from sys.modules afterwards)."""
    name = "warpolicy_audit_factory_for_tests"
    (tmp_path / f"{name}.py").write_text(textwrap.dedent("""
        from warpolicy.testing.synthetic import make_synthetic

        def good(platform):
            return make_synthetic("late_swa_read", platform=platform)

        def several(platform):
            return [make_synthetic(n, platform=platform) for n in ("in_graph", "late_swa_read")]

        def wrong(platform):
            return 42

        def broken(platform):
            raise ValueError("cannot build")
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    yield name
    sys.modules.pop(name, None)


def test_factory_end_to_end(factory_module):
    report = run_audit(factory=f"{factory_module}:good", modes="decode", trials=2,
                       platform=fake_platform())
    assert [(e.backend, e.verdict) for e in report.entries] == [("late_swa_read", UNSAFE)]
    assert report.exit_code == 1


def test_factory_returning_several_subjects(factory_module):
    report = run_audit(factory=f"{factory_module}:several", modes="decode", trials=1,
                       platform=fake_platform())
    assert [e.backend for e in report.entries] == ["in_graph", "late_swa_read"]


@pytest.mark.parametrize("attr, match", [("wrong", "must return an AuditSubject"),
                                         ("broken", "failed: ValueError: cannot build")])
def test_bad_factories_are_input_errors(factory_module, attr, match):
    with pytest.raises(InputError, match=match):
        run_audit(factory=f"{factory_module}:{attr}", platform=fake_platform())


def test_call_factory_lets_warpolicy_errors_through():
    def raises(platform):
        raise UnknownNameError("backend", "x", ["y"])

    with pytest.raises(UnknownNameError):
        call_factory(raises, "m:raises", None)


# ---------------------------------------------------------------------------------------------
# Formatting
# ---------------------------------------------------------------------------------------------

def _report() -> AuditReport:
    bad = AuditEntry("late", DECODE, "none", IN, IN,
                     DynamicResult(UNSAFE, 50, 50, Mismatch(0, "out", (2, 1), 0.5, 0.75, 12)),
                     StaticResult(UNSAFE, (Offender(7, "kernel", "indexSelectSmallIndex",
                                                    ("full_to_swa",)),), nodes=20, readers=3))
    good = AuditEntry("safe", DECODE, "none", IN, IN, DynamicResult(SAFE, 50),
                      StaticResult(SAFE, nodes=20, readers=2))
    vague = AuditEntry("coarse", ForwardMode.EXTEND, "none", None, NONE,
                       DynamicResult(INCONCLUSIVE, reason="policy none: nothing to audit"),
                       StaticResult(INCONCLUSIVE, reason="policy none"))
    return AuditReport((good, bad, vague), device="cuda (NVIDIA H200)", trials=50, stall_us=200)


def test_format_text_table_and_details():
    text = format_audit(_report(), "text")
    lines = text.splitlines()
    assert lines[0].startswith("warpolicy audit on cuda (NVIDIA H200): 50 trials")
    assert lines[1].split() == ["backend", "mode", "spec", "declared", "published", "dynamic",
                                "static", "verdict"]
    row = next(line for line in lines if line.startswith("late "))
    assert "unsafe 50/50" in row and "unsafe: indexSelectSmallIndex" in row
    assert row.split()[-1] == "UNSAFE"
    assert "  dynamic: trial 0: out[2, 1] = 0.75, expected 0.5 (12 elements differ)" in lines
    assert any("indexSelectSmallIndex (node 7, kernel) touches full_to_swa" in line
               for line in lines)
    assert "1 safe, 1 unsafe, 1 inconclusive" in lines
    assert lines[-1].startswith("note: the static audit")


def test_format_json_round_trips():
    data = json.loads(format_audit(_report(), "json"))
    assert data["exit_code"] == 1
    assert data["summary"] == {"safe": 1, "unsafe": 1, "inconclusive": 1}
    late = data["entries"][1]
    assert late["verdict"] == "unsafe" and late["dynamic"]["first"]["index"] == [2, 1]
    assert late["static"]["offenders"][0]["name"] == "indexSelectSmallIndex"
    assert data["entries"][2]["declared"] is None and data["entries"][2]["published"] == "none"


def test_format_rejects_unknown_format():
    with pytest.raises(InputError, match="unknown audit format"):
        format_audit(_report(), "yaml")


def test_common_static_reason_printed_once():
    report = run_audit(synthetic="in_graph", trials=1, platform=fake_platform())
    text = format_audit(report)
    assert text.count("static audit unavailable") == 1


# ---------------------------------------------------------------------------------------------
# Static analysis on hand-made graphs
# ---------------------------------------------------------------------------------------------

def _chain(kinds_and_buffers, planted_at):
    """A linear graph (one capture stream): node i depends on node i - 1."""
    nodes = []
    for i, (kind, bufs) in enumerate(kinds_and_buffers):
        nodes.append(GraphNode(i, kind, f"k{i}", buffers=tuple(bufs),
                               planted=(i == planted_at)))
    edges = [(i - 1, i) for i in range(1, len(nodes))]
    return nodes, edges


def test_in_graph_offenders_are_the_readers_after_the_plant():
    nodes, edges = _chain([("kernel", ["t"]), ("memcpy", ["t"]), ("event_record", []),
                           ("kernel", []), ("kernel", ["m"]), ("memset", ["t"])], planted_at=2)
    result = analyze_graph(nodes, edges, IN)
    assert result.verdict is UNSAFE
    assert [(o.node, o.kind, o.buffers) for o in result.offenders] == [
        (4, "kernel", ("m",)), (5, "memset", ("t",))]
    assert result.readers == 4 and result.nodes == 6


def test_pre_replay_every_reader_offends_post_replay_none():
    nodes, edges = _chain([("kernel", ["t"]), ("event_record", []), ("kernel", [])], 1)
    assert [o.node for o in analyze_graph(nodes, edges, PRE).offenders] == [0]
    assert analyze_graph(nodes, edges, POST).verdict is SAFE


def test_in_graph_clean_graph_is_safe():
    nodes, edges = _chain([("kernel", ["t"]), ("event_record", []), ("kernel", [])], 1)
    assert analyze_graph(nodes, edges, IN).verdict is SAFE


def test_branch_not_ordered_before_the_plant_offends():
    # 0 -> 1(plant); 0 -> 2 reads t on a parallel branch: not an ancestor of the plant
    nodes = [GraphNode(0, "kernel", "a"), GraphNode(1, "event_record", planted=True),
             GraphNode(2, "kernel", "side", buffers=("t",))]
    result = analyze_graph(nodes, [(0, 1), (0, 2)], IN)
    assert [o.name for o in result.offenders] == ["side"]


def test_missing_plant_unreadable_post_step_and_none_are_inconclusive():
    nodes, edges = _chain([("kernel", ["t"]), ("kernel", [])], planted_at=-1)
    assert "not in the graph" in analyze_graph(nodes, edges, IN).reason
    nodes, edges = _chain([("event_record", []), ("kernel", [])], 0)
    blind = [nodes[0], attrs.evolve(nodes[1], readable=False)]
    result = analyze_graph(blind, edges, IN)
    assert result.verdict is INCONCLUSIVE and result.unreadable == 1
    assert "could not read the arguments" in result.reason
    result = analyze_graph(nodes, edges, IN, post_step=True)
    assert result.verdict is INCONCLUSIVE and "eager work after replay" in result.reason
    assert analyze_graph(nodes, edges, NONE).verdict is INCONCLUSIVE


def test_unreadable_before_the_plant_does_not_matter():
    nodes, edges = _chain([("kernel", []), ("event_record", []), ("kernel", [])], 1)
    nodes[0] = attrs.evolve(nodes[0], readable=False)
    assert analyze_graph(nodes, edges, IN).verdict is SAFE


def test_ancestors_diamond():
    edges = [(0, 1), (0, 2), (1, 3), (2, 3), (3, 4)]
    assert ancestors(3, edges) == {0, 1, 2}
    assert ancestors(0, edges) == set()


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["kernel", "memcpy", "memset", "other"]),
                          st.booleans()), min_size=1, max_size=12),
       st.integers(min_value=0, max_value=12))
def test_later_release_never_has_more_offenders(spec, plant):
    """On a chain, in_graph offenders are exactly the readers after the plant, and a later
    release point never offends more: pre_replay >= in_graph >= post_replay."""
    plant = min(plant, len(spec))
    items = [(k, ["t"] if r else []) for k, r in spec]
    items.insert(plant, ("event_record", []))
    nodes, edges = _chain(items, plant)
    offend = {p: {o.node for o in analyze_graph(nodes, edges, p).offenders}
              for p in (PRE, IN, POST)}
    readers_after = {n.index for n in nodes
                     if n.index > plant and n.buffers and n.kind != "other"}
    assert offend[IN] == readers_after
    assert offend[PRE] >= offend[IN] >= offend[POST] == set()


# ---------------------------------------------------------------------------------------------
# Address matching and names
# ---------------------------------------------------------------------------------------------

def test_words_little_endian_aligned():
    blob = (0x1122334455667788).to_bytes(8, "little") + (5).to_bytes(8, "little") + b"\x01\x02"
    assert words(blob) == [0x1122334455667788, 5]


def test_buffers_hit_and_overlap():
    ranges = (BufferRange("a", 100, 200), BufferRange("b", 200, 260))
    assert buffers_hit([99, 150, 260], ranges) == ("a",)
    assert buffers_hit([199, 200], ranges) == ("a", "b")
    assert buffers_overlapping(190, 210, ranges) == ("a", "b")
    assert buffers_overlapping(260, 300, ranges) == ()


def test_tensor_range_contiguous_and_strided():
    t = torch.zeros(4, 6, dtype=torch.long)
    r = tensor_range("t", t)
    assert (r.start, r.end - r.start) == (t.data_ptr(), 4 * 6 * 8)
    col = t[:, 2]  # strided view: from element 2 to element 3*6+2
    rc = tensor_range("c", col)
    assert rc.start == t.data_ptr() + 2 * 8 and rc.end == t.data_ptr() + (3 * 6 + 2 + 1) * 8


@pytest.mark.parametrize("symbol, short", [
    ("void at::native::(anonymous namespace)::indexSelectSmallIndex<float, long, unsigned int, "
     "2, 2, -2>(at::cuda::detail::TensorInfo<float, unsigned int>, long)", "indexSelectSmallIndex"),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<long>, "
     "std::array<char*, 1ul> >(int, at::native::FillFunctor<long>, std::array<char*, 1ul>)",
     "vectorized_elementwise_kernel"),
    ("_ZN2at6native21indexSelectLargeIndexIflLi2EEEvv", "indexSelectLargeIndex"),
    ("my_triton_kernel", "my_triton_kernel"),
    ("", "?"),
])
def test_short_kernel_name(symbol, short):
    assert short_kernel_name(symbol) == short


# ---------------------------------------------------------------------------------------------
# The CUDA walk, against a stand-in for cuda.bindings.driver (real ctypes argument reading)
# ---------------------------------------------------------------------------------------------

class _Result(enum.IntEnum):
    CUDA_SUCCESS = 0
    CUDA_ERROR_INVALID_VALUE = 1
    CUDA_ERROR_NOT_SUPPORTED = 801


class _NodeType(enum.IntEnum):
    CU_GRAPH_NODE_TYPE_KERNEL = 0
    CU_GRAPH_NODE_TYPE_MEMCPY = 1
    CU_GRAPH_NODE_TYPE_MEMSET = 2
    CU_GRAPH_NODE_TYPE_EVENT_RECORD = 7
    CU_GRAPH_NODE_TYPE_EMPTY = 5
    CU_GRAPH_NODE_TYPE_GRAPH = 4


class StandInDriver(types.ModuleType):
    """Answers like cuda-bindings: ``(CUresult, *values)`` tuples, count-then-fill lists."""

    CUresult = _Result
    CUgraphNodeType = _NodeType

    def __init__(self, nodes, edges, kernels, events):
        super().__init__("cuda.bindings.driver")
        self.nodes = nodes  # handle -> (type, params)
        self.edge_list = edges
        self.kernels = kernels  # func handle -> (mangled name, [param sizes] or None)
        self.events = events  # node handle -> event handle

    @staticmethod
    def CUgraph(raw):
        return raw

    def cuGraphGetNodes(self, graph, count=0):
        handles = list(self.nodes)
        return _Result.CUDA_SUCCESS, handles[:count] if count else [], len(handles)

    def cuGraphGetEdges(self, graph, count=0):
        src = [a for a, _ in self.edge_list][:count] if count else []
        dst = [b for _, b in self.edge_list][:count] if count else []
        return _Result.CUDA_SUCCESS, src, dst, None, len(self.edge_list)

    def cuGraphNodeGetType(self, node):
        return _Result.CUDA_SUCCESS, self.nodes[node][0]

    def cuGraphKernelNodeGetParams(self, node):
        return _Result.CUDA_SUCCESS, self.nodes[node][1]

    def cuGraphMemcpyNodeGetParams(self, node):
        return _Result.CUDA_SUCCESS, self.nodes[node][1]

    def cuGraphMemsetNodeGetParams(self, node):
        return _Result.CUDA_SUCCESS, self.nodes[node][1]

    def cuGraphEventRecordNodeGetEvent(self, node):
        return _Result.CUDA_SUCCESS, self.events[node]

    def cuFuncGetName(self, func):
        return _Result.CUDA_SUCCESS, self.kernels[func][0].encode()

    def cuFuncGetParamInfo(self, func, index):
        sizes = self.kernels[func][1]
        if sizes is None:
            return _Result.CUDA_ERROR_NOT_SUPPORTED, 0, 0
        if index >= len(sizes):
            return _Result.CUDA_ERROR_INVALID_VALUE, 0, 0
        return _Result.CUDA_SUCCESS, 8 * index, sizes[index]


def _kernel(func, *args):
    """Kernel node params whose kernelParams point at real host buffers (kept alive)."""
    buffers = [ctypes.create_string_buffer(bytes(a), len(a)) for a in args]
    array = (ctypes.c_void_p * max(1, len(buffers)))(*[ctypes.addressof(b) for b in buffers])
    params = types.SimpleNamespace(func=func, kern=None, kernelParams=ctypes.addressof(array),
                                   extra=0, _keep=(buffers, array))
    return params


def _u64(*values):
    return b"".join(int(v).to_bytes(8, "little") for v in values)


@pytest.fixture
def stand_in(monkeypatch):
    """Install a stand-in driver and a graph: prep -> plant -> late readers (see below)."""
    table = torch.arange(16, dtype=torch.long)  # shared "table"
    other = torch.zeros(8, dtype=torch.long)  # shared "other"
    private = torch.zeros(8)
    t0, o0, p0 = table.data_ptr(), other.data_ptr(), private.data_ptr()
    kernels = {11: ("_ZN2at6native21indexSelectSmallIndexEv", [8, 4]),
               12: ("_ZN3foo11late_gatherEv", [24, 4]),
               13: ("_ZN3foo7privateEv", [8]),
               14: ("_ZN3foo6opaqueEv", None)}
    nodes = {
        101: (_NodeType.CU_GRAPH_NODE_TYPE_KERNEL, _kernel(11, _u64(t0), b"\0" * 4)),
        102: (_NodeType.CU_GRAPH_NODE_TYPE_EVENT_RECORD, None),
        # a struct by value whose second word points inside "table"
        103: (_NodeType.CU_GRAPH_NODE_TYPE_KERNEL, _kernel(12, _u64(7, t0 + 40, 3), b"\0" * 4)),
        104: (_NodeType.CU_GRAPH_NODE_TYPE_MEMSET, types.SimpleNamespace(
            dst=o0 + 8, pitch=0, elementSize=1, width=8, height=1)),
        105: (_NodeType.CU_GRAPH_NODE_TYPE_MEMCPY, types.SimpleNamespace(
            srcMemoryType=2, srcDevice=p0, srcXInBytes=0, srcPitch=0, srcHeight=0,
            dstMemoryType=2, dstDevice=p0 + 16, dstXInBytes=0, dstPitch=0, dstHeight=0,
            WidthInBytes=8, Height=1, Depth=1)),
        106: (_NodeType.CU_GRAPH_NODE_TYPE_KERNEL, _kernel(13, _u64(p0))),
        107: (_NodeType.CU_GRAPH_NODE_TYPE_KERNEL, _kernel(14, _u64(t0))),
    }
    handles = list(nodes)
    edges = list(zip(handles, handles[1:]))
    driver = StandInDriver(nodes, edges, kernels, {102: 777})
    bindings = types.ModuleType("cuda.bindings")
    bindings.driver = driver
    cuda = types.ModuleType("cuda")
    cuda.bindings = bindings
    monkeypatch.setitem(sys.modules, "cuda", cuda)
    monkeypatch.setitem(sys.modules, "cuda.bindings", bindings)
    monkeypatch.setitem(sys.modules, "cuda.bindings.driver", driver)
    return {"table": table, "other": other}, driver


class _KeptGraph:
    def raw_cuda_graph(self):
        return 4242


def _cuda_runner(event_handle=777):
    return types.SimpleNamespace(
        platform=types.SimpleNamespace(name="cuda"),
        captured={4: types.SimpleNamespace(graph=_KeptGraph())},
        fence=types.SimpleNamespace(event=types.SimpleNamespace(cuda_event=event_handle)))


def test_walk_reads_arguments_ranges_names_and_the_planted_node(stand_in):
    shared, _ = stand_in
    from warpolicy.audit.static import buffer_ranges, walk_cuda_graph

    nodes, edges = walk_cuda_graph(4242, 777, buffer_ranges(shared))
    assert [n.kind for n in nodes] == ["kernel", "event_record", "kernel", "memset", "memcpy",
                                       "kernel", "kernel"]
    assert [n.buffers for n in nodes] == [("table",), (), ("table",), ("other",), (), (), ()]
    assert nodes[0].name == "indexSelectSmallIndex" and nodes[2].name == "late_gather"
    assert [n.planted for n in nodes] == [False, True] + [False] * 5
    assert nodes[6].readable is False  # no parameter info: not read blind
    assert edges == [(i, i + 1) for i in range(6)]


def test_audit_static_end_to_end_on_the_stand_in(stand_in):
    shared, _ = stand_in
    result = audit_static(_cuda_runner(), 4, shared, IN)
    assert result.verdict is UNSAFE
    assert [(o.name, o.buffers) for o in result.offenders] == [("late_gather", ("table",)),
                                                              ("memset", ("other",))]
    assert result.unreadable == 1 and result.readers == 3 and result.nodes == 7
    pre = audit_static(_cuda_runner(), 4, shared, PRE)
    assert [o.name for o in pre.offenders][0] == "indexSelectSmallIndex"
    post = audit_static(_cuda_runner(), 4, shared, POST)
    assert post.verdict is SAFE


def test_audit_static_unknown_event_handle_falls_back_to_the_only_record(stand_in):
    shared, _ = stand_in
    assert audit_static(_cuda_runner(event_handle=1), 4, shared, IN).verdict is UNSAFE


def test_audit_static_driver_error_is_inconclusive(stand_in):
    shared, driver = stand_in
    driver.cuGraphGetNodes = lambda graph, count=0: (_Result.CUDA_ERROR_INVALID_VALUE, [], 0)
    result = audit_static(_cuda_runner(), 4, shared, IN)
    assert result.verdict is INCONCLUSIVE
    assert result.reason == "static audit unavailable: RuntimeError: CUDA_ERROR_INVALID_VALUE"


def test_audit_static_without_bindings_says_how_to_get_them(monkeypatch):
    monkeypatch.setitem(sys.modules, "cuda.bindings", None)  # import fails
    result = audit_static(_cuda_runner(), 4, {}, IN)
    assert result.verdict is INCONCLUSIVE
    assert "cuda-bindings is not installed" in result.reason


def test_failure_mid_trial_restores_shared_state():
    subject = table_subject(IN)
    before = subject.model.table.clone()
    calls = []

    def post_step(mode, batch, out):
        calls.append(1)
        if len(calls) == 4:  # the second trial's poisoned step, after the poison landed
            raise RuntimeError("late failure")
        return out.clone()

    entry = audit_mode(attrs.evolve(subject, post_step=post_step), DECODE, trials=3)
    assert entry.verdict is INCONCLUSIVE and "late failure" in entry.dynamic.reason
    assert torch.equal(subject.model.table, before)


def test_opaque_nodes_after_the_release_are_inconclusive_not_safe():
    """A child graph (or conditional, host node, ...) may read shared state the walk does not
    follow: after the release point it blocks SAFE; before it, it does not matter."""
    nodes, edges = _chain([("kernel", ["t"]), ("event_record", []), ("other", [])], 1)
    nodes[2] = attrs.evolve(nodes[2], name="CU_GRAPH_NODE_TYPE_GRAPH", readable=False)
    result = analyze_graph(nodes, edges, IN)
    assert result.verdict is INCONCLUSIVE and "CU_GRAPH_NODE_TYPE_GRAPH" in result.reason
    assert analyze_graph(nodes, edges, POST).verdict is SAFE


def test_walk_marks_child_graph_nodes_opaque_and_empty_nodes_inert(stand_in):
    shared, driver = stand_in
    from warpolicy.audit.static import buffer_ranges, walk_cuda_graph

    driver.nodes[108] = (_NodeType.CU_GRAPH_NODE_TYPE_EMPTY, None)
    driver.nodes[109] = (_NodeType.CU_GRAPH_NODE_TYPE_GRAPH, None)
    driver.edge_list += [(107, 108), (108, 109)]
    nodes, _ = walk_cuda_graph(4242, 777, buffer_ranges(shared))
    assert [(n.kind, n.readable) for n in nodes[7:]] == [("other", True), ("other", False)]


# ---------------------------------------------------------------------------------------------
# Never SAFE for what the trials could not check
# ---------------------------------------------------------------------------------------------

def test_poison_is_taken_from_the_state_make_batch_wrote():
    """make_batch may write shared state; the poison must differ from *that* state, or a late
    reader sees the value it expected and the audit calls an unsafe declaration safe."""
    subject = table_subject(IN, late_from=0)
    table = subject.model.table
    before = table.clone()
    trial_state = default_poison(before)  # what a poison of the pre-audit state would be

    def make_batch(mode, trial):
        table.copy_(trial_state)
        return TrialBatch(trial, torch.tensor([trial % 10, (trial + 3) % 10]))

    entry = audit_mode(attrs.evolve(subject, make_batch=make_batch), DECODE, trials=3)
    assert entry.verdict is UNSAFE and entry.dynamic.corrupted == 3
    assert torch.equal(table, before)  # left as found


class CountingModel(TableModel):
    """Its forward reads, then bumps, a shared step counter (state the forward writes)."""

    def __init__(self) -> None:
        super().__init__()
        self.count = torch.zeros(1)
        self.shared_buffers = {"table": self.table, "count": self.count}

    def forward(self, bucket: int) -> torch.Tensor:
        out = super().forward(bucket)
        out.add_(self.count)
        self.count.add_(1)
        return out


def test_poisoned_step_starts_from_the_reference_steps_state():
    platform = fake_platform()
    model = CountingModel()
    subject = AuditSubject(
        name="count", model=model, platform=platform,
        make_batch=lambda mode, trial: TrialBatch(trial, torch.tensor([1, 2])),
        runners={"decode": lambda m: DecodeRunner(m, lambda *a: POST, platform)},
        declared={"decode": POST})
    entry = audit_mode(subject, DECODE, trials=3)
    assert entry.verdict is SAFE, entry.dynamic  # no false alarm from the counter
    assert model.count.item() == 4  # as capture left it (2 warm-ups, 2 captures)


def test_no_shared_buffers_is_inconclusive():
    subject = table_subject(IN)
    subject.model.shared_buffers = {}
    entry = audit_mode(subject, DECODE, trials=2)
    assert entry.verdict is INCONCLUSIVE and "nothing to poison" in entry.dynamic.reason


def test_a_poison_that_changes_nothing_is_inconclusive():
    subject = attrs.evolve(table_subject(IN), poison={"table": lambda t: t.clone()})
    entry = audit_mode(subject, DECODE, trials=2)
    assert entry.verdict is INCONCLUSIVE
    assert "poison of 'table' equals its contents" in entry.dynamic.reason


class _Renamed:
    """The fake platform under another name: a real (non-simulated) platform without stalls."""

    def __init__(self, inner, name: str) -> None:
        self._inner, self.name = inner, name

    def __getattr__(self, attr):
        return getattr(self._inner, attr)


def test_a_platform_without_stalls_is_inconclusive():
    entry = audit_mode(table_subject(IN, platform=_Renamed(fake_platform(), "rocm")), DECODE,
                       trials=2)
    assert entry.verdict is INCONCLUSIVE and "no GPU stall on platform 'rocm'" in \
        entry.dynamic.reason


def test_every_trial_must_exercise_the_declaration_not_just_the_last():
    subject = table_subject(IN)

    def make_batch(mode, trial):  # trials 0 and 1 fit no bucket (eager), trial 2 does
        return TrialBatch(trial, torch.arange(6 if trial < 2 else 2) % 10)

    entry = audit_mode(attrs.evolve(subject, make_batch=make_batch), DECODE, trials=3)
    assert entry.verdict is INCONCLUSIVE
    assert "2 of 3 trials ran eagerly" in entry.dynamic.reason
    assert "published post_replay" in entry.dynamic.reason and "in 2 of 3 trials" in \
        entry.dynamic.reason
