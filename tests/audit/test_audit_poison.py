"""Poison values and output comparison (`warpolicy.audit.poison`): the poison changes every
element of every dtype it can, and the comparison names the first difference."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from warpolicy.audit.poison import (
    default_poison,
    first_mismatch,
    flatten_outputs,
    snapshot_outputs,
    unchanged_elements,
)

FLOATS = [torch.float16, torch.bfloat16, torch.float32, torch.float64]
INTS = [torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64]


def _specials(dtype: torch.dtype) -> list[float]:
    """Values a careless poison leaves unchanged: x + 1 == x, infinities, NaN, signed zero."""
    info = torch.finfo(dtype)
    big = 2.0 ** (info.bits - 8) if dtype == torch.bfloat16 else 2.0**60  # x + 1 == x
    return [
        0.0,
        -0.0,
        1.0,
        -1.0,
        0.5,
        big,
        -big,
        info.max,
        -info.max,
        info.tiny,
        info.smallest_normal / 4,
        math.inf,
        -math.inf,
        math.nan,
    ]


class TestDefaultPoison:
    @pytest.mark.parametrize("dtype", FLOATS)
    def test_floats_change_every_element(self, dtype):
        t = torch.tensor(_specials(dtype), dtype=dtype)
        assert unchanged_elements(default_poison(t), t) == 0

    def test_bf16_where_adding_one_changes_nothing(self):
        t = torch.tensor([512.0, 4096.0, 1e30], dtype=torch.bfloat16)
        assert torch.equal(t + 1, t)  # the old "poison": no change at all
        p = default_poison(t)
        assert p.dtype == torch.bfloat16 and unchanged_elements(p, t) == 0

    @pytest.mark.parametrize("dtype", INTS)
    def test_integers_change_every_element(self, dtype):
        info = torch.iinfo(dtype)
        for values in (
            [0, 5, 7, 3],
            [0, 0, 0],
            [info.min, 0, info.max],
            [info.max],
            [info.min],
            [-1, 0, -1] if info.min < 0 else [1, 1],
        ):
            t = torch.tensor(values, dtype=dtype)
            assert unchanged_elements(default_poison(t), t) == 0, values

    @pytest.mark.parametrize("values", [[0, 5, 7, 3], [0, 0, 0], [-1, 0, -1], [4]])
    def test_integer_index_tables_stay_in_range(self, values):
        t = torch.tensor(values, dtype=torch.long)
        p = default_poison(t)
        assert int(p.min()) >= 0 and int(p.max()) <= max(1, int(t.max()))

    def test_bool_and_complex(self):
        b = torch.tensor([True, False])
        assert torch.equal(default_poison(b), torch.tensor([False, True]))
        c = torch.tensor([0j, 1 + 2j, complex(math.nan, 0)], dtype=torch.complex64)
        assert unchanged_elements(default_poison(c), c) == 0

    @settings(max_examples=60, deadline=None)
    @given(
        st.sampled_from(FLOATS),
        st.lists(st.floats(allow_nan=True, allow_infinity=True, width=16), min_size=1, max_size=16),
    )
    def test_property_every_float_element_changes(self, dtype, values):
        t = torch.tensor(values, dtype=torch.float32).to(dtype)
        assert unchanged_elements(default_poison(t), t) == 0

    @settings(max_examples=60, deadline=None)
    @given(st.sampled_from(INTS), st.data())
    def test_property_every_integer_element_changes(self, dtype, data):
        info = torch.iinfo(dtype)
        values = data.draw(st.lists(st.integers(info.min, info.max), min_size=1, max_size=16))
        t = torch.tensor(values, dtype=dtype)
        assert unchanged_elements(default_poison(t), t) == 0


class TestUnchangedElements:
    def test_counts_equal_elements_and_nan_equals_nan(self):
        state = torch.tensor([1.0, 2.0, math.nan, 4.0])
        assert unchanged_elements(torch.tensor([1.0, 3.0, math.nan, 5.0]), state) == 2

    def test_other_shape_counts_everything(self):
        assert unchanged_elements(torch.zeros(3), torch.zeros(2, 2)) == 4


class TestComparison:
    def test_first_mismatch_reports_first_index_values_and_count(self):
        ref = [("out", torch.tensor([[1.0, 2.0], [3.0, 4.0]]))]
        got = [("out", torch.tensor([[1.0, 2.0], [9.0, 8.0]]))]
        m = first_mismatch(ref, got, trial=7)
        assert (m.trial, m.output, m.index, m.expected, m.got, m.count) == (
            7,
            "out",
            (1, 0),
            3.0,
            9.0,
            2,
        )
        assert "trial 7" in m.describe() and "out[1, 0]" in m.describe()

    def test_none_when_equal_and_nan_equals_nan(self):
        t = torch.tensor([1.0, float("nan")])
        assert first_mismatch([("out", t)], [("out", t.clone())], 0) is None

    def test_walks_nested_outputs_in_order(self):
        ref = snapshot_outputs({"b": torch.ones(2), "a": (torch.zeros(1), torch.ones(1))})
        got = snapshot_outputs({"b": torch.ones(2), "a": (torch.zeros(1), torch.zeros(1))})
        assert [label for label, _ in ref] == ["out['a'][0]", "out['a'][1]", "out['b']"]
        assert first_mismatch(ref, got, 1).output == "out['a'][1]"

    def test_extra_outputs_follow_the_returned_ones_by_name(self):
        kv = torch.zeros(3)
        ref = snapshot_outputs(torch.ones(1), {"v_pool": kv, "k_pool": kv + 1})
        assert [label for label, _ in ref] == ["out", "k_pool", "v_pool"]
        kv[2] = 5.0  # the snapshot is a copy, the live pool moved on
        got = snapshot_outputs(torch.ones(1), {"v_pool": kv, "k_pool": torch.ones(3)})
        m = first_mismatch(ref, got, 0)
        assert (m.output, m.index, m.got) == ("v_pool", (2,), 5.0)

    def test_shape_change_is_a_difference(self):
        m = first_mismatch([("out", torch.ones(2))], [("out", torch.ones(3))], 0)
        assert m is not None and m.index == ()

    def test_flatten_outputs_ignores_non_tensors(self):
        assert flatten_outputs(None) == [] and flatten_outputs("x") == []
