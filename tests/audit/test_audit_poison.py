"""Poison values and output comparison (`warpolicy.audit.poison`): every poison of the default
set changes every element of every dtype it can, together they survive integer division and
one-sided clamps, and the comparison names the first difference."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from warpolicy.audit.poison import (
    INTEGER_POISONS,
    Poison,
    default_poison,
    default_poisons,
    first_mismatch,
    half_turn,
    high,
    low,
    plus_one,
    poison_set,
    sentinel_mask,
    snapshot_outputs,
    unchanged_elements,
)
from warpolicy.runtime.canary.compare import flatten_outputs

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

    @pytest.mark.parametrize("values", [[0, 5, 7, 3], [0, 0, 0], [-1, 0, -1], [4], [3, 9]])
    def test_integer_index_tables_stay_in_range(self, values):
        # a poisoned index table indexes what the table indexed: [min(0, min), max(1, max)]
        t = torch.tensor(values, dtype=torch.long)
        for poison in default_poisons(t):
            p = poison(t)
            assert int(p.min()) >= min(0, int(t.min())), poison.name
            assert int(p.max()) <= max(1, int(t.max())), poison.name

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
        for poison in (*default_poisons(t), plus_one):
            assert unchanged_elements(poison(t), t) == 0, poison

    @pytest.mark.parametrize("dtype", INTS)
    def test_every_poison_of_the_set_changes_every_element(self, dtype):
        info = torch.iinfo(dtype)
        for values in ([0, 5, 7, 3], [0, 0], [1, 1], [0, 1], [info.min, info.max], [info.max]):
            t = torch.tensor(values, dtype=dtype)
            for poison in default_poisons(t):
                assert unchanged_elements(poison(t), t) == 0, (poison.name, values)


class TestPoisonSetAgainstDivisionAndClamps:
    """What 0.2's ``x + 1`` missed on the H200, and what the set does instead."""

    PAGE = 64

    def aligned_table(self) -> torch.Tensor:
        # a request-to-token table of whole pages: slot = page * 64 + offset; the max slot
        # (page 31, offset 63) is not page-aligned, so x + 1 never wraps a page start
        pages = torch.randperm(32, generator=torch.Generator().manual_seed(0))
        return (pages[:, None] * self.PAGE + torch.arange(self.PAGE)).reshape(-1).to(torch.int32)

    def test_plus_one_leaves_page_of_every_page_start_unchanged(self):
        t = self.aligned_table()
        starts = t[:: self.PAGE]
        assert torch.equal(plus_one(t)[:: self.PAGE] // self.PAGE, starts // self.PAGE)

    def test_half_turn_changes_the_page_of_every_entry(self):
        t = self.aligned_table()
        for g in (1, 2, 16, 64, 512, 1024):  # every granularity up to half the value range
            assert not bool(((half_turn(t) // g) == (t // g)).any()), g

    @settings(max_examples=80, deadline=None)
    @given(st.lists(st.integers(0, 5000), min_size=1, max_size=12), st.integers(1, 64))
    def test_property_half_turn_survives_division_up_to_half_the_range(self, values, g):
        t = torch.tensor(values, dtype=torch.int64)
        m = int(t.max()) + 1  # lo = 0 for non-negative tables
        if g <= m // 2:
            assert not bool(((half_turn(t) // g) == (t // g)).any())

    @pytest.mark.parametrize("length", [2, 3, 64, 65, 1000])
    def test_a_lone_length_stays_a_length(self, length):
        t = torch.tensor([length], dtype=torch.int64)
        assert int(plus_one(t)) == 0  # 0.2: the request became empty
        assert int(half_turn(t)) == length // 2 >= 1
        assert int(low(t)) == 1

    def test_one_sided_clamps_see_a_change(self):
        window = 128
        clamps = {
            "min(len, window)": lambda x: torch.clamp(x, max=window),
            "max(len - window, 0)": lambda x: torch.clamp(x - window, min=0),
        }
        # a long batch (every length past the window) and a short one (all but the longest
        # inside it): 0.2's x + 1 leaves each clamped value of the first three as it was
        for name, lengths in (
            ("min(len, window)", torch.tensor([200, 300, 129, 1000])),
            ("max(len - window, 0)", torch.tensor([3, 100, 50, 300])),
        ):
            clamp = clamps[name]
            assert torch.equal(clamp(plus_one(lengths))[:3], clamp(lengths)[:3]), name
            for i in range(len(lengths)):  # every element: some poison of the set moves it
                assert any(
                    int(clamp(p(lengths))[i]) != int(clamp(lengths)[i]) for p in INTEGER_POISONS
                ), (name, i)

    def test_low_and_high_go_to_the_ends(self):
        t = torch.tensor([-1, 4, 0, 9, 3], dtype=torch.int64)  # a -1 sentinel, as in an SWA map
        assert low(t).tolist() == [-1, 1, 1, 1, 1]  # lo + 1 = 1; the sentinel stays
        assert high(t).tolist() == [-1, 9, 9, 0, 9]  # those at hi go to lo = 0, never to -1

    def test_overrides_one_callable_or_a_sequence(self):
        t = torch.arange(4)
        assert [p.name for p in poison_set(None, t)] == ["half_turn", "low", "high"]
        assert [p.name for p in poison_set(plus_one, t)] == ["plus_one"]
        assert [p.name for p in poison_set([plus_one, half_turn], t)] == ["plus_one", "half_turn"]
        assert [p.name for p in poison_set(None, torch.zeros(2))] == ["negate"]


class TestSentinels:
    """0.3.0 took ``lo = min(0, min x)`` over the ``-1`` sentinels too: ``low`` and ``high``
    wrote ``-1`` into live entries of an SWA mapping (SGLang 0.5.23's ends in ``-1``), and a
    late reader indexed out of bounds (issue 30, item 5)."""

    def swa_mapping(self) -> torch.Tensor:
        mapping = torch.randperm(63, generator=torch.Generator().manual_seed(3))
        return torch.cat([mapping, torch.tensor([-1])])  # the last entry: "no SWA slot"

    @pytest.mark.parametrize("poison", [*INTEGER_POISONS, Poison("default", default_poison)])
    def test_sentinels_stay_and_live_entries_stay_valid_indices(self, poison):
        t = self.swa_mapping()
        p = poison(t)
        assert int(p[-1]) == -1, "the sentinel moved"
        live = p[:-1]
        assert int(live.min()) >= 0 and int(live.max()) <= int(t.max()), poison.name
        assert bool((live != t[:-1]).all()), "some live entry kept its value"
        torch.zeros(64).index_select(0, live)  # every live entry still indexes the buffer

    def test_the_mask_is_the_negative_entries_beside_non_negative_ones(self):
        assert sentinel_mask(torch.tensor([3, -1, 0, -7])).tolist() == [False, True, False, True]
        assert sentinel_mask(torch.tensor([-3, -1])) is None  # all negative: values
        assert sentinel_mask(torch.tensor([0, 2])) is None
        assert sentinel_mask(torch.tensor([-1.0, 2.0])) is None  # floats have none

    def test_a_kept_sentinel_is_not_an_unchecked_live_element(self):
        t = self.swa_mapping()
        assert unchanged_elements(half_turn(t), t) == 0
        assert unchanged_elements(t.clone(), t) == 63  # the live ones, not the sentinel

    @settings(max_examples=80, deadline=None)
    @given(
        st.lists(st.integers(0, 5000), min_size=1, max_size=12),
        st.lists(st.booleans(), min_size=1, max_size=12),
        st.sampled_from([torch.int32, torch.int64]),
    )
    def test_property_sentinels_kept_live_entries_moved_inside_their_range(
        self, values, holes, dtype
    ):
        raw = [-1 if hole else v for v, hole in zip(values, holes + [False] * len(values))]
        t = torch.tensor(raw, dtype=dtype)
        live = t >= 0
        if not bool(live.any()):
            return  # every entry negative: values, not sentinels (the mask's own test)
        for poison in INTEGER_POISONS:
            p = poison(t)
            assert torch.equal(p[~live], t[~live]), poison.name
            if int(live.sum()) and len(set(t[live].tolist())) > 1:
                assert int(p[live].min()) >= 0 and int(p[live].max()) <= int(t[live].max())
            assert unchanged_elements(p, t) == 0, (poison.name, raw)


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
