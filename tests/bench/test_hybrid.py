"""The hybrid decode and page-reuse shapes on the simulated platform: their per-class rows
run, their scheduler writes what the steps read, and the sequential path equals the model."""

from __future__ import annotations

import pytest
import torch

from warpolicy.bench import hybrid, page_reuse
from warpolicy.bench.overlap_classes import class_targets, class_variants
from warpolicy.bench.overlap_factory import run_factory_overlap
from warpolicy.registry.vocabulary import IN_GRAPH, POST_REPLAY, ForwardMode
from warpolicy.testing import sim_platform

DECODE = ForwardMode.DECODE


def test_class_variants_of_a_two_class_declaration():
    rows = class_variants({"metadata": IN_GRAPH, "recurrent_state": POST_REPLAY})
    assert [(name, per) for name, _c, per, _s in rows] == [
        ("classes", True),
        ("single_event", False),
        ("omit:recurrent_state", False),
    ]
    assert rows[2][1] == {"metadata": IN_GRAPH} and rows[2][3] is False  # flagged unsound
    assert class_variants({"metadata": IN_GRAPH})[-1][0] == "single_event"  # nothing to omit


def test_class_targets_need_the_omitted_row_of_a_written_class_to_corrupt():
    rows = [
        {"name": "classes", "gap_closed": 0.95, "corrupted": 0},
        {"name": "omit:kv_pages", "gap_closed": 1.0, "corrupted": 0},
    ]
    assert class_targets(rows, ["metadata", "kv_pages"]) == {
        "classes_closes_90pct": True,
        "classes_zero_corrupted": True,
        "omitted_class_corrupts": False,
    }
    # a class the scheduler does not write itself (deferred frees order it): shown, not judged
    assert "omitted_class_corrupts" not in class_targets(rows, ["metadata"])
    rows[1]["corrupted"] = 3
    assert class_targets(rows, ["metadata", "kv_pages"])["omitted_class_corrupts"] is True


@pytest.mark.parametrize(
    "factory", ["warpolicy.bench.hybrid:decode", "warpolicy.bench.page_reuse:decode"]
)
def test_factory_bench_runs_the_per_class_rows_on_sim(factory):
    result = run_factory_overlap(factory, steps=6, repeats=1, device="sim")
    (one,) = result["subjects"]
    names = [r["name"] for r in one["rows"]]
    assert {"classes", "single_event"} <= set(names)
    assert any(n.startswith("omit:") for n in names)
    assert one["writes_shared"]
    by = {r["name"]: r for r in one["rows"]}
    assert by["classes"]["events"] == "per class" and by["single_event"]["events"] == "one"


def test_hybrid_scheduler_writes_the_slots_the_running_step_reads():
    model = hybrid.HybridDecode(
        hybrid.HybridConfig(hidden=8, ffn=8, layers=2, batch=4, ctx=4, new_per_step=2), "cpu"
    )
    state = model.state.clone()
    model.write_class("recurrent_state", 1)
    rows = torch.tensor([2, 3])  # step 1 retires requests 2 and 3 (new_per_step=2)
    changed = (model.state != state).any(dim=1)
    assert changed[model.state_index[rows]].all()
    assert int(changed.sum()) == 2
    with pytest.raises(ValueError):
        model.write_class("kv_pages", 1)


def test_hybrid_omitted_class_subject_declares_metadata_only():
    subject = hybrid.decode_omits_recurrent(sim_platform())
    assert subject.declared[DECODE] is IN_GRAPH
    assert subject.declared_classes[DECODE] == {"metadata": IN_GRAPH}
    assert subject.class_of("state") == "recurrent_state"
    assert subject.class_of("anything else") == "metadata"


def test_page_reuse_never_hands_out_a_live_page():
    platform = sim_platform()
    cfg = page_reuse.PageReuseConfig(
        hidden=4, ffn=4, layers=1, batch=4, page=2, pages_per_request=2, new_per_step=2
    )
    model = page_reuse.PageReuseDecode(cfg, "cpu", platform)
    for step in range(12):
        model.make_batch(DECODE, step)
        live = [p for row in model.row_pages for p in row]
        assert len(live) == len(set(live))  # no page serves two requests
        assert not set(live) & set(model.free_pages)
        expected = model._slots(model.row_pages)
        assert torch.equal(model.req_to_token, expected)
    assert model.frees.stats.peak_steps <= 2


def test_nothing_published_holds_pages_until_the_coarse_point():
    platform = sim_platform()
    cfg = page_reuse.PageReuseConfig(
        hidden=4, ffn=4, layers=1, batch=2, page=2, pages_per_request=1, new_per_step=1
    )
    model = page_reuse.PageReuseDecode(cfg, "cpu", platform)
    model.write_class("metadata", 0)
    for step in range(1, 8):  # read-done unknown: held, then a synchronize settles them
        model.write_class("metadata", step, None)
    assert model.frees.stats.unknown == 7
    assert model.frees.stats.released > 0  # settled at the synchronize it had to make
    live = [p for row in model.row_pages for p in row]
    assert len(live) == len(set(live))
