"""The Llama-shaped decode on a real GPU: SGLang's kernels against a torch reference, and the
overlap benchmark's bar on it (``bench overlap --factory warpolicy.bench.llama:decode``).

Needs the fetched kernel files (``scripts/fetch-sglang-kernels``; carry ``.sglang/``) and
triton. Each test prints one ``[llama cuda] ...`` line.

Run on the GPU box:
``PYTHONPATH=. python -m pytest -q -s -m cuda tests/gpu/test_llama_cuda.py``.
"""

from __future__ import annotations

import torch
from gpu_support import NEEDS_CUDA, NEEDS_SGLANG, NEEDS_TRITON

pytestmark = [*NEEDS_CUDA, NEEDS_TRITON, NEEDS_SGLANG]

from warpolicy.bench.llama import LlamaConfig, reference_logits, subject  # noqa: E402
from warpolicy.bench.overlap_factory import format_factory_overlap, run_factory_overlap  # noqa: E402
from warpolicy.registry.vocabulary import ForwardMode  # noqa: E402
from warpolicy.runtime.manager import open_runtime  # noqa: E402


def test_logits_match_a_torch_reference_and_graph_replay_equals_eager():
    platform = open_runtime("cuda").platform
    cfg = LlamaConfig(layers=2, batch=8, context=256, requests=16)
    s = subject(platform, cfg)
    model = s.model
    worst, replayed_equal = 0.0, 0
    runner = s.runners[ForwardMode.DECODE](model)  # the registry's triton decode policy
    runner.capture()
    for step in range(4):
        batch = s.make_batch(ForwardMode.DECODE, step)
        expected = reference_logits(model, batch).float()
        graph_out = runner.run(batch).clone()
        model.host_prep(batch, cfg.batch)
        model.graph_prep(cfg.batch)
        eager_out = model.forward(cfg.batch).clone()
        torch.cuda.synchronize()
        worst = max(worst, float((graph_out.float() - expected).abs().max()))
        torch.testing.assert_close(graph_out.float(), expected, rtol=5e-2, atol=0.15)
        replayed_equal += bool(torch.equal(graph_out, eager_out))
    print(
        f"[llama cuda] numerics, 2 layers, batch {cfg.batch}: max |graph - torch reference| "
        f"{worst:.3g} (bf16 logits); graph == eager bitwise in {replayed_equal}/4; "
        f"published {runner.policy_for(cfg.batch).label}"
    )
    assert runner.policy_for(cfg.batch).label == "in_graph"


def test_bench_overlap_factory_meets_the_bar():
    result = run_factory_overlap("warpolicy.bench.llama:decode", steps=150, repeats=3)
    (one,) = result["subjects"]
    rows = {r["name"]: r for r in one["rows"]}
    print(format_factory_overlap(result))
    summary = ", ".join(
        f"{name} {r['step_us']:.0f} us {r['tokens_per_s']:.0f} tok/s gap {_share(r)} "
        f"corrupted {r['corrupted']}/{r['checked']}"
        for name, r in rows.items()
    )
    print(f"[llama cuda] bench overlap --factory warpolicy.bench.llama:decode: {summary}")
    assert one["writes_shared"]
    assert all(one["targets"].values()), one["targets"]


def _share(row: dict) -> str:
    return "-" if row["gap_closed"] is None else f"{100 * row['gap_closed']:.0f}%"
