"""Poisons that fit a buffer class change every element, keep shape and dtype, and are the
first of the class's set (the defaults follow)."""

from __future__ import annotations

import pytest
import torch

from warpolicy.audit.class_poisons import (
    CLASS_POISONS,
    class_poisons,
    reassign_slots,
    refill_slots,
    reuse_pages,
)
from warpolicy.audit.poison import default_poisons, unchanged_elements

TENSORS = [
    torch.zeros(4, 3),  # a zeroed pool: every row equal
    torch.tensor([[1.0, 2.0], [1.0, 2.0], [-3.0, 0.5]]),
    torch.randn(5, 8, dtype=torch.float16),
    torch.ones(1, 6),  # one slot: nothing to move, still changed
]


@pytest.mark.parametrize("poison", [reassign_slots, refill_slots, reuse_pages(2)])
@pytest.mark.parametrize("tensor", TENSORS, ids=lambda t: f"{tuple(t.shape)}-{t.dtype}")
def test_each_class_poison_changes_every_element(poison, tensor):
    out = poison(tensor)
    assert out.shape == tensor.shape and out.dtype == tensor.dtype
    assert unchanged_elements(out, tensor) == 0


def test_a_slot_holds_another_slots_state():
    state = torch.tensor([[1.0], [2.0], [3.0]])
    assert reassign_slots(state).flatten().tolist() == [-6.0, -2.0, -4.0]


def test_class_sets_put_their_own_poison_first():
    t = torch.randn(3, 2)
    assert class_poisons("recurrent_state", t)[0].name == "reassign_slots"
    assert class_poisons("kv_pages", t)[0] is CLASS_POISONS["kv_pages"]
    assert class_poisons("metadata", t) == default_poisons(t)
    assert class_poisons("unknown_class", t) == default_poisons(t)


def test_the_audit_uses_the_class_poison_for_the_omitted_class():
    from warpolicy.audit.api import run_audit

    report = run_audit(
        factory="warpolicy.bench.hybrid:decode_omits_recurrent", device="sim", trials=2
    )
    entry = next(e for e in report.entries if e.backend == "hybrid-decode-omits")
    caught = dict(entry.dynamic.caught)
    assert any("reassign_slots" in label for label in caught)
    assert all(count == 2 for count in caught.values())
