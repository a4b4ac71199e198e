"""GPU: the tensor-parallel overlap benchmark on NCCL, one rank on this GPU (and, where two
GPUs are visible, two ranks: agreeing, and one rank given another flag). Prints the tables;
asserts correctness and the consistency verdicts, never times."""

from __future__ import annotations

import pytest
import torch
from gpu_support import NEEDS_CUDA

from warpolicy.bench.overlap_tp import format_overlap_tp, run_overlap_tp

pytestmark = [*NEEDS_CUDA]
two_gpus = pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA devices")

SMALL = {"layers": 8, "batch": 32, "steps": 60, "repeats": 1}


def _by_name(rank: dict) -> dict:
    return {r["name"]: r for r in rank["rows"]}


def test_one_rank_nccl_all_reduce_in_graph_sound_policies_never_corrupt():
    result = run_overlap_tp(1, **SMALL)
    print(format_overlap_tp(result))
    assert result is not None and result["backend"] == "nccl" and result["world_size"] == 1
    (rank,) = result["ranks"]
    assert rank["consistency"]["ok"]
    rows = _by_name(rank)
    assert rows["in_graph"]["resolved"] == "in_graph"  # planted in a graph with NCCL kernels
    assert rows["post_replay"]["resolved"] == "post_replay"
    assert result["targets"]["sound_policies_zero_corrupted_every_rank"]


@two_gpus
def test_two_ranks_agree_and_sound_policies_never_corrupt():
    result = run_overlap_tp(2, **SMALL)
    print(format_overlap_tp(result))
    assert result is not None and result["world_size"] == 2
    assert result["targets"]["consistency_ok_every_rank"]
    assert result["targets"]["sound_policies_zero_corrupted_every_rank"]
    assert result["targets"]["outputs_agree_across_ranks"]
    assert all(_by_name(r)["in_graph"]["resolved"] == "in_graph" for r in result["ranks"])


@two_gpus
def test_two_ranks_one_with_another_flag_end_coarse_on_both():
    result = run_overlap_tp(2, mismatch_rank=1, **SMALL)
    print(format_overlap_tp(result))
    assert result is not None
    assert result["targets"]["mismatch_coarse_on_every_rank"]
    for rank in result["ranks"]:
        assert rank["consistency"]["differing_ranks"] == [1]
        assert {r["resolved"] for r in rank["rows"]} == {"none"}
