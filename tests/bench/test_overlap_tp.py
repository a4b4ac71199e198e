"""The tensor-parallel overlap benchmark on CPU: its report logic on hand-made inputs, one rank
in-process and two gloo ranks (spawned) on the simulated platform."""

from __future__ import annotations

import json

import pytest

from warpolicy.bench.command import render
from warpolicy.bench.overlap import gap_closed, step_metrics
from warpolicy.bench.overlap_tp import (
    TpConfig,
    combine_ranks,
    format_overlap_tp,
    run_overlap_tp,
    run_rank,
)
from warpolicy.errors import InputError, WarpolicyError


def row(name, step, *, corrupted=0, resolved=None, hold=10.0, **extra):
    sound = name != "no_barrier"
    policy = {
        "coarse": "none",
        "post_replay": "post_replay",
        "in_graph": "in_graph",
        "no_barrier": "none",
    }[name]
    return {
        "name": name,
        "policy": policy,
        "resolved": resolved or policy,
        "sound": sound,
        "barrier": sound,
        "hold_us": hold,
        "step_us": step,
        "idle_gap_us": 0.0,
        "corrupted": corrupted,
        "checked": 10,
        **extra,
    }


def report(
    rank,
    *,
    steps=(3700.0, 3700.0, 3410.0, 3400.0),
    ok=True,
    resolved=None,
    corrupted=0,
    release=1.0,
    checksum=1.5,
):
    names = ("coarse", "post_replay", "in_graph", "no_barrier")
    rows = [
        row(
            n,
            s,
            resolved=None if n == "no_barrier" else resolved,
            corrupted=corrupted if n == "in_graph" else 0,
        )
        for n, s in zip(names, steps, strict=True)
    ]
    gap_closed(rows)
    rows[2]["release_minus_ideal_us"] = release
    return {
        "rank": rank,
        "world_size": 2,
        "platform": "cuda",
        "device": "GPU",
        "consistency": {"ok": ok, "coarse": not ok, "message": "m", "rank": rank},
        "ideal_release_us": 5.0,
        "output_checksum": checksum,
        "rows": rows,
        "effective": {"layers": 4, "batch": 8, "steps": 10, "repeats": 1},
    }


CONFIG = TpConfig(device="cuda").to_json()


class TestReport:
    def test_step_metrics_are_steady_state_medians(self):
        marks = {
            "launch": [0.0, 100.0, 200.0, 310.0, 410.0],
            "launched": [90.0, 190.0, 290.0, 400.0, 500.0],
            "released": [5.0, 112.0, 210.0, 320.0, 420.0],
            "written": [50.0, 150.0, 250.0, 350.0, 450.0],
        }
        m = step_metrics(marks, warmup=1)  # steps 1..3 (the last has no next launch)
        assert m == {"step_us": 100.0, "hold_us": 10.0, "idle_gap_us": 10.0}

    def test_gap_closed_is_relative_to_coarse_and_the_bound(self):
        rows = [
            row("coarse", 400.0),
            row("post_replay", 400.0),
            row("in_graph", 310.0),
            row("no_barrier", 300.0),
        ]
        gap_closed(rows)
        assert [r["gap_closed"] for r in rows] == [0.0, 0.0, 0.9, 1.0]
        flat = [row("coarse", 400.0), row("in_graph", 399.5), row("no_barrier", 399.0)]
        gap_closed(flat)  # under 0.5% of the step: nothing to close
        assert {r["gap_closed"] for r in flat} == {None}

    def test_targets_hold_only_when_every_rank_meets_them(self):
        good = combine_ranks(CONFIG, [report(0), report(1)])
        assert all(good["targets"].values()), good["targets"]
        slow = combine_ranks(CONFIG, [report(0), report(1, steps=(3700, 3700, 3600, 3400))])
        assert not slow["targets"]["in_graph_closes_95pct_every_rank"]
        bad = combine_ranks(CONFIG, [report(0, corrupted=2), report(1)])
        assert not bad["targets"]["sound_policies_zero_corrupted_every_rank"]
        split = combine_ranks(CONFIG, [report(0), report(1, ok=False)])
        assert not split["targets"]["consistency_ok_every_rank"]
        diverged = combine_ranks(CONFIG, [report(0), report(1, checksum=2.0)])
        assert not diverged["targets"]["outputs_agree_across_ranks"]

    def test_a_mismatch_run_passes_only_if_every_rank_went_coarse(self):
        config = dict(CONFIG, mismatch_rank=1)
        coarse = [report(r, ok=False, resolved="none") for r in (0, 1)]
        assert combine_ranks(config, coarse)["targets"]["mismatch_coarse_on_every_rank"]
        half = [report(0, ok=False, resolved="none"), report(1, ok=False)]
        assert not combine_ranks(config, half)["targets"]["mismatch_coarse_on_every_rank"]

    def test_text_has_a_row_per_rank_and_variant_and_json_round_trips(self):
        result = combine_ranks(
            dict(CONFIG, mismatch_rank=1),
            [report(0, ok=False, resolved="none"), report(1, ok=False, resolved="none")],
        )
        text = format_overlap_tp(result)
        table = [ln for ln in text.splitlines() if ln[:4].strip() in ("0", "1")]
        assert len(table) == 8
        assert "rank 1 given WARPOLICY_FORCE_COARSE=1" in text
        assert "mismatch_coarse_on_every_rank=yes" in text
        assert json.loads(render(result, "json", format_overlap_tp)) == {
            "schema_version": 1,
            **result,
        }
        with pytest.raises(InputError):
            render(result, "yaml", format_overlap_tp)


class TestConfig:
    @pytest.mark.parametrize(
        "kwargs", [{"sched_kind": "warp"}, {"mismatch_env": "NOEQUALS"}, {"steps": 0}]
    )
    def test_bad_config_is_an_input_error(self, kwargs):
        with pytest.raises(InputError):
            TpConfig(**kwargs)

    def test_a_mismatch_needs_two_ranks(self):
        with pytest.raises(InputError, match="two ranks"):
            run_rank(0, 1, TpConfig(device="sim", mismatch_rank=0))

    def test_cli_reports_bad_input_in_one_line(self, capsys):
        from warpolicy.cli.main import main

        assert (
            main(["bench", "overlap", "--tp", "1", "--device", "sim", "--mismatch-rank", "3"]) == 2
        )
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "mismatch rank 3" in err[0]


class TestSimulated:
    def test_one_rank_in_process(self):
        result = run_overlap_tp(1, device="sim")
        assert result is not None and result["world_size"] == 1
        (rank,) = result["ranks"]
        assert rank["consistency"]["ok"]
        assert [r["resolved"] for r in rank["rows"]] == ["none", "post_replay", "in_graph", "none"]
        assert rank["engine_decode_policy"] == "in_graph"
        assert all(r["corrupted"] == 0 for r in rank["rows"])
        assert result["targets"]["consistency_ok_every_rank"]

    def test_the_spawn_launcher_returns_rank_0s_result_and_surfaces_errors(self, monkeypatch):
        """The launcher's plumbing, with each rank's run replaced (the multi-rank run itself is
        in test_distributed.py, inside its gloo processes)."""
        import torch.multiprocessing as mp

        from warpolicy.bench import overlap_tp

        def fake_run_rank(rank, world, config, init_method):
            if config.strict:
                raise InputError("strict says no")
            return {"rank": rank, "world": world, "steps": config.steps, "init": init_method}

        def serial_spawn(fn, args, nprocs):
            for rank in range(nprocs):
                fn(rank, *args)

        monkeypatch.setattr(overlap_tp, "run_rank", fake_run_rank)
        monkeypatch.setattr(mp, "spawn", serial_spawn)
        result = run_overlap_tp(3, device="sim", steps=7)
        assert result is not None
        assert (result["rank"], result["world"], result["steps"]) == (0, 3, 7)
        assert result["init"].startswith("tcp://127.0.0.1:")
        with pytest.raises(WarpolicyError, match="rank 0: strict says no"):
            run_overlap_tp(2, device="sim", strict=True)
