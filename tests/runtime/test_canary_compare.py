"""The canary's comparison (shared with the dynamic audit), its configuration and sampling."""

from __future__ import annotations

import math
import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from warpolicy.errors import InputError
from warpolicy.runtime.canary import (
    CanaryConfig,
    Difference,
    Tolerance,
    first_difference,
    flatten_outputs,
)
from warpolicy.runtime.canary.sampling import Countdown, next_gap

# -- comparison ------------------------------------------------------------------------------------


def pairs(*tensors):
    return [(f"out[{i}]", t) for i, t in enumerate(tensors)]


def test_equal_results_have_no_difference_and_nan_equals_nan():
    a = torch.tensor([1.0, float("nan"), -0.0])
    assert first_difference(pairs(a), pairs(a.clone())) is None


def test_the_first_differing_element_is_named():
    want = torch.zeros(3, 4)
    got = want.clone()
    got[1, 2] = 5.0
    got[2, 0] = 1.0
    diff = first_difference(pairs(torch.ones(2), want), pairs(torch.ones(2), got))
    assert diff == Difference("out[1]", (1, 2), 0.0, 5.0, 2)
    assert diff.describe() == "out[1][1, 2] = 5, expected 0 (2 elements differ)"


def test_shapes_dtypes_and_labels_must_match():
    a = torch.zeros(2)
    assert first_difference(pairs(a), pairs(torch.zeros(3))).expected == "torch.float32[2]"
    assert first_difference(pairs(a), pairs(a.double())).got == "torch.float64[2]"
    assert first_difference(pairs(a), pairs(a, a)).output == "out"


def test_a_tolerance_admits_small_floating_differences_only():
    want = torch.tensor([1.0, 2.0], dtype=torch.bfloat16)
    near = torch.tensor([1.0078125, 2.0], dtype=torch.bfloat16)  # one bf16 ulp at 1.0
    assert first_difference(pairs(want), pairs(near)) is not None
    assert first_difference(pairs(want), pairs(near), Tolerance(atol=1e-2)) is None
    assert first_difference(pairs(want), pairs(want + 1), Tolerance(atol=1e-2)) is not None
    ints = torch.tensor([1, 2])
    assert first_difference(pairs(ints), pairs(ints + 1), Tolerance(atol=10.0)) is not None


@pytest.mark.parametrize("bad", [-1.0, float("inf"), float("nan"), "1", True])
def test_a_bad_tolerance_is_one_line(bad):
    with pytest.raises(InputError, match="canary tolerance atol"):
        Tolerance(atol=bad)


def test_flatten_outputs_walks_sequences_and_mappings():
    t = torch.zeros(1)
    labels = [label for label, _ in flatten_outputs({"b": [t, 3], "a": (t,)})]
    assert labels == ["out['a'][0]", "out['b'][0]"]
    assert flatten_outputs(("name", 4)) == []


def test_the_audit_compares_with_the_same_code():
    from warpolicy.audit import poison

    assert poison.flatten_outputs is flatten_outputs
    want, got = torch.zeros(2), torch.tensor([0.0, 1.0])
    mismatch = poison.first_mismatch(pairs(want), pairs(got), trial=4)
    assert (mismatch.trial, mismatch.output, mismatch.index, mismatch.count) == (
        4,
        "out[0]",
        (1,),
        1,
    )


# -- configuration --------------------------------------------------------------------------------


def test_the_default_configuration_is_off():
    config = CanaryConfig()
    assert config.rate == 0 and config.lead_rate == 0 and config.budget is None


@pytest.mark.parametrize(
    "kw",
    [
        {"rate": 1.5},
        {"rate": -0.1},
        {"rate": float("nan")},
        {"rate": "0.1"},
        {"budget": -1},
        {"budget": 2.0},
        {"max_bytes": 0},
        {"lead_rate": 2},
        {"seed": True},
    ],
)
def test_bad_configuration_is_one_line(kw):
    with pytest.raises(InputError, match="canary"):
        CanaryConfig(**kw)


def test_configuration_from_the_environment():
    config = CanaryConfig.from_environ(
        {
            "WARPOLICY_CANARY_RATE": "1/1000",
            "WARPOLICY_CANARY_BUDGET": "500",
            "WARPOLICY_CANARY_MAX_BYTES": "1048576",
            "WARPOLICY_CANARY_LEAD_RATE": "0.01",
            "WARPOLICY_CANARY_SEED": "7",
        }
    )
    assert config == CanaryConfig(0.001, 500, 1 << 20, 0.01, 7)
    assert CanaryConfig.from_environ({}) == CanaryConfig()


@pytest.mark.parametrize(
    "env, match",
    [
        ({"WARPOLICY_CANARY_RATE": "often"}, "WARPOLICY_CANARY_RATE='often'"),
        ({"WARPOLICY_CANARY_RATE": "2"}, "rate must be from 0 to 1"),
        ({"WARPOLICY_CANARY_BUDGET": "1.5"}, "WARPOLICY_CANARY_BUDGET"),
    ],
)
def test_a_bad_environment_value_is_one_line(env, match):
    with pytest.raises(InputError, match=match) as info:
        CanaryConfig.from_environ(env)
    assert "\n" not in str(info.value)


# -- sampling -------------------------------------------------------------------------------------


def test_rate_one_samples_every_step_and_zero_never():
    every, never = Countdown(1.0), Countdown(0.0)
    assert all(every.due() for _ in range(100))
    assert not any(never.due() for _ in range(10_000))


@settings(max_examples=20, deadline=None)
@given(st.sampled_from([0.5, 0.1, 0.01]), st.integers(0, 1000))
def test_gaps_are_geometric_with_mean_one_over_the_rate(rate, seed):
    rng = random.Random(seed)
    gaps = [next_gap(rate, rng) for _ in range(4000)]
    assert min(gaps) >= 1
    mean = sum(gaps) / len(gaps)
    sd = math.sqrt((1 - rate) / rate**2 / len(gaps))
    assert abs(mean - 1 / rate) < 6 * sd
