"""Cross-rank policy consistency: fingerprints and verdicts in-process, and the check itself on
torch.distributed with gloo in three processes (one spawn runs every scenario in order)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from hypothesis import given, settings
from hypothesis import strategies as st

from warpolicy.errors import WarpolicyError
from warpolicy.registry.engine import PolicyEngine
from warpolicy.registry.loader import default_registry_path
from warpolicy.registry.vocabulary import ForwardMode, Placement, WarReadDonePolicy
from warpolicy.runtime import distributed as wd
from warpolicy.runtime.distributed import (
    CoarsePolicy,
    ConsistencyResult,
    PolicyFingerprint,
    RankMismatchError,
    check_consistency,
    compare_fingerprints,
    compile_consistent,
    guard_policy,
    policy_fingerprint,
)
from warpolicy.runtime.hookspecs import hookimpl

ROOT = Path(__file__).resolve().parents[2]
WORLD = 3
EXTRA_BACKEND = "tp_extra_backend"
EXTRA_YAML = f"""version: 1
backends:
  {EXTRA_BACKEND}:
    inherits: base
    doc: only one rank has this file
"""


def engine(environ=None, files=None) -> PolicyEngine:
    return PolicyEngine.load(files, environ=dict(environ or {}))


def fingerprint(environ=None, files=None, **facts) -> PolicyFingerprint:
    eng = engine(environ, files)
    return policy_fingerprint(eng.compile("fa3", "none"), engine=eng, **facts)


def all_cells(policy):
    lookup = getattr(policy, "lookup", policy)
    return {
        (m, e, p): lookup(m, e, p)
        for m in ForwardMode
        for e in (False, True)
        for p in (False, True)
    }


# -- fingerprints ------------------------------------------------------------------------------


class TestFingerprint:
    def test_same_content_loaded_from_elsewhere_agrees(self, tmp_path):
        copy = tmp_path / "copied.yaml"
        copy.write_text(default_registry_path().read_text(encoding="utf-8"), encoding="utf-8")
        assert fingerprint(files=[str(copy)]).digest == fingerprint().digest

    @pytest.mark.parametrize(
        "environ, key",
        [
            ({"WARPOLICY_FORCE_COARSE": "1"}, "flag.force_coarse"),
            ({"SGLANG_FORCE_COARSE_WAR_BARRIER": "1"}, "flag.force_coarse"),  # the alias too
            ({"WARPOLICY_PREFILL_READ_DONE": "1"}, "flag.prefill_read_done"),
        ],
    )
    def test_an_environment_flag_is_the_first_differing_cell(self, environ, key):
        result = compare_fingerprints([fingerprint(), fingerprint(environ)], 0)
        assert not result.ok and result.coarse
        assert result.first_difference is not None and result.first_difference.key == key

    def test_an_extra_registry_file_differs_in_a_registry_cell(self, tmp_path):
        extra = tmp_path / "extra.yaml"
        extra.write_text(EXTRA_YAML, encoding="utf-8")
        base, more = fingerprint(), fingerprint(files=["default", str(extra)])
        # fa3's table is the same: only the registry cells can tell them apart
        assert {k: v for k, v in base.cells if k.startswith("table.")} == {
            k: v for k, v in more.cells if k.startswith("table.")
        }
        diff = compare_fingerprints([base, more, base], 0).first_difference
        assert diff is not None
        assert diff.key == f"registry.backend.{EXTRA_BACKEND}"
        assert diff.values[0] is None and diff.values[1] is not None

    def test_the_placement_is_a_cell(self):
        """Issue 17 class 8: ranks that differ only in where the node is planted would end
        in_graph on one and post_replay on another: the fingerprints differ there."""
        marker = fingerprint()
        derived = fingerprint(placements={ForwardMode.DECODE: Placement.DERIVED})
        assert marker.digest != derived.digest
        diff = compare_fingerprints([marker, derived], 0).first_difference
        assert diff.key == "placement.decode" and diff.values == ("marker", "derived")

    def test_the_policys_own_placement_is_a_cell(self):
        class Placed:
            def __init__(self, placement):
                self._placement = placement

            def lookup(self, mode, eager=False, planted=True):
                return WarReadDonePolicy.IN_GRAPH

            def placement(self, mode):
                return self._placement

        a = policy_fingerprint(Placed(Placement.MARKER))
        b = policy_fingerprint(Placed(Placement.DERIVED))
        assert compare_fingerprints([a, b], 0).first_difference.key == "placement.decode"

    def test_platform_facts_are_cells(self):
        diff = compare_fingerprints(
            [fingerprint(), fingerprint(external_events=False)], 1
        ).first_difference
        assert diff is not None and diff.key == "platform.external_events"

    def test_a_bare_callable_is_fingerprinted_by_its_table(self):
        in_graph = policy_fingerprint(lambda m, e, p: WarReadDonePolicy.IN_GRAPH)
        post = policy_fingerprint(lambda m, e, p: WarReadDonePolicy.POST_REPLAY)
        diff = compare_fingerprints([in_graph, post], 0).first_difference
        assert diff is not None and diff.key.startswith("table.")

    def test_bytes_round_trip(self):
        fp = fingerprint()
        assert PolicyFingerprint.from_bytes(fp.to_bytes()) == fp


# -- verdicts ------------------------------------------------------------------------------------

POOL = [
    PolicyFingerprint((("platform", "cuda"), ("flag.x", v), ("table.t", t)))
    for v in ("false", "true")
    for t in ("in_graph", "none")
]


class TestVerdict:
    @settings(max_examples=60, deadline=None)
    @given(st.lists(st.integers(0, len(POOL) - 1), min_size=2, max_size=7))
    def test_every_rank_reaches_the_same_verdict(self, picks):
        fps = [POOL[i] for i in picks]
        results = [compare_fingerprints(fps, r) for r in range(len(fps))]
        shared = {(r.ok, r.differing_ranks, r.first_difference) for r in results}
        assert len(shared) == 1
        ok, differing, diff = shared.pop()
        assert ok == (len(set(picks)) == 1)
        if not ok:
            assert diff is not None and len(set(diff.values)) > 1
            digests = [fp.digest for fp in fps]
            kept = [r for r in range(len(fps)) if r not in differing]
            assert len({digests[r] for r in kept}) == 1  # the majority holds one digest
            assert all(
                digests.count(digests[r]) <= digests.count(digests[kept[0]]) for r in differing
            )

    def test_ties_keep_the_lowest_rank_as_reference(self):
        result = compare_fingerprints([POOL[0], POOL[1]], 1)
        assert result.differing_ranks == (1,)
        assert "rank 1 (of 2) differs" in result.message

    def test_coarse_policy_answers_none_everywhere_and_says_why(self):
        result = compare_fingerprints([POOL[0], POOL[3], POOL[0]], 0)
        policy = guard_policy(engine().compile("fa3"), result)
        assert isinstance(policy, CoarsePolicy) and policy.backend == "fa3"
        assert set(all_cells(policy).values()) == {WarReadDonePolicy.NONE}
        reason = policy.decision("decode").reasons[0]
        assert reason.id == wd.MISMATCH_ID and "rank 1" in reason.message

    def test_agreement_keeps_the_policy(self):
        compiled = engine().compile("fa3")
        assert guard_policy(compiled, compare_fingerprints([POOL[2]] * 3, 2)) is compiled

    def test_a_runner_with_the_coarse_policy_publishes_nothing(self):
        from warpolicy.runtime.runners import DecodeRunner
        from warpolicy.testing import RecModel, sim_platform

        result = compare_fingerprints([POOL[0], POOL[1], POOL[1]], 2)
        runner = DecodeRunner(
            RecModel(), guard_policy(engine().compile("fa3"), result), sim_platform()
        )
        runner.capture()
        runner.run([1.0])
        assert runner.policy_for(runner.buckets[0]) == WarReadDonePolicy.NONE
        assert runner.fence.take() is None


# -- the runner option: process_group= ------------------------------------------------------------


class _TwoRankStub:
    """torch.distributed as rank 0 of a two-rank gloo group sees it (no processes needed)."""

    group = SimpleNamespace(WORLD=None)

    def is_initialized(self):
        return True

    def get_world_size(self, group=None):
        return 2

    def get_rank(self, group=None):
        return 0

    def get_backend(self, group=None):
        return "gloo"


class TestRunnerOption:
    def runner(self, policy, **kw):
        from warpolicy.runtime.runners import DecodeRunner
        from warpolicy.testing import RecModel, sim_platform

        return DecodeRunner(RecModel(), policy, sim_platform(), name="decode", **kw)

    def peer(self, monkeypatch, peer_policy):
        """Rank 1 answers with the fingerprint of ``peer_policy`` (on the same platform)."""
        peer = policy_fingerprint(peer_policy, platform="sim", external_events=True)
        monkeypatch.setattr(wd, "_distributed", lambda: _TwoRankStub())
        monkeypatch.setattr(
            wd,
            "all_gather_bytes",
            lambda data, group, device, fixed=False: [
                data,
                bytes.fromhex(peer.digest) if fixed else peer.to_bytes(),
            ],
        )

    def test_without_a_group_nothing_is_checked(self, monkeypatch):
        _no_collectives(monkeypatch)
        monkeypatch.setattr(wd, "all_gather_bytes", lambda *a, **k: pytest.fail("collective"))
        runner = self.runner(engine().compile("fa3", platform="sim"))
        runner.capture()
        assert runner.consistency is None
        assert runner.policy_for(runner.buckets[0]) == WarReadDonePolicy.IN_GRAPH

    def test_a_mismatch_makes_every_cell_coarse(self, monkeypatch):
        compiled = engine().compile("fa3", platform="sim")
        self.peer(
            monkeypatch, engine({"WARPOLICY_FORCE_COARSE": "1"}).compile("fa3", platform="sim")
        )
        runner = self.runner(compiled, process_group=object())
        with pytest.warns(RuntimeWarning, match="coarse"):
            runner.capture()
        assert runner.consistency is not None and runner.consistency.coarse
        assert runner.consistency.where == "runner:decode"
        assert {runner.policy_for(b) for b in runner.buckets} == {WarReadDonePolicy.NONE}
        assert runner.policy_for(None) == WarReadDonePolicy.NONE  # eager too
        runner.run([1.0])
        assert runner.fence.take() is None  # nothing published: the scheduler goes coarse
        runner.capture()  # a re-capture keeps the verdict (no second collective needed)
        assert {runner.policy_for(b) for b in runner.buckets} == {WarReadDonePolicy.NONE}

    def test_strict_raises(self, monkeypatch):
        compiled = engine().compile("fa3", platform="sim")
        self.peer(
            monkeypatch, engine({"WARPOLICY_FORCE_COARSE": "1"}).compile("fa3", platform="sim")
        )
        runner = self.runner(compiled, process_group=object(), consistency_strict=True)
        with pytest.raises(RankMismatchError):
            runner.capture()
        assert not runner.captured

    def test_a_runner_whose_placement_differs_from_its_peers_is_coarse(self, monkeypatch):
        compiled = engine().compile("fa3", platform="sim")
        self.peer(monkeypatch, compiled)  # the peer plants the marker
        runner = self.runner(compiled, process_group=object(), placement="derived")
        with pytest.warns(RuntimeWarning, match="placement.decode"):
            runner.capture()
        assert runner.consistency.coarse
        assert runner.consistency.first_difference.key == "placement.decode"
        assert {runner.policy_for(b) for b in runner.buckets} == {WarReadDonePolicy.NONE}

    def test_agreement_keeps_the_policy(self, monkeypatch):
        compiled = engine().compile("fa3", platform="sim")
        self.peer(monkeypatch, engine().compile("fa3", platform="sim"))
        runner = self.runner(compiled, process_group=object())
        runner.capture()
        assert runner.consistency is not None and runner.consistency.ok
        assert runner.policy_for(runner.buckets[0]) == WarReadDonePolicy.IN_GRAPH


# -- the check without peers -----------------------------------------------------------------------


def _no_collectives(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("a collective ran")

    monkeypatch.setattr(dist, "all_gather", refuse)


class TestNoPeers:
    def test_no_process_group_is_ok_without_a_collective(self, monkeypatch):
        assert not dist.is_initialized()
        _no_collectives(monkeypatch)
        result = check_consistency(fingerprint())
        assert result.ok and not result.checked and result.world_size == 1

    def test_world_size_one_is_ok_without_a_collective(self, tmp_path, monkeypatch):
        dist.init_process_group(
            "gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1
        )
        try:
            _no_collectives(monkeypatch)
            policy, result = compile_consistent(engine(), "fa3")
            assert result.ok and not result.checked
            assert policy.lookup(ForwardMode.DECODE) == WarReadDonePolicy.IN_GRAPH
        finally:
            dist.destroy_process_group()

    def test_a_failing_check_is_coarse_with_one_warning_and_tells_observers(
        self, monkeypatch, warpolicy_pm, warpolicy_register
    ):
        class Stub:
            group = None

            def is_initialized(self):
                return True

            def get_world_size(self, group=None):
                return 2

            def get_rank(self, group=None):
                return 1

        def broken(*args, **kwargs):
            raise RuntimeError("store timed out")

        seen = []

        class Observer:
            @hookimpl
            def warpolicy_on_fallback(self, where, error):
                seen.append((where, error))

        warpolicy_register(Observer())
        monkeypatch.setattr(wd, "_distributed", lambda: Stub())
        monkeypatch.setattr(wd, "_gather_and_compare", broken)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            result = check_consistency(
                fingerprint(), where="runner:decode", observers=warpolicy_pm.observers
            )
        assert result.coarse and "store timed out" in (result.error or "")
        assert len(caught) == 1 and "coarse barrier" in str(caught[0].message)
        assert str(caught[0].message).startswith("warpolicy runner:decode: ")
        assert [w for w, _ in seen] == ["runner:decode:consistency"]
        assert isinstance(seen[0][1], RankMismatchError)
        with pytest.raises(RankMismatchError, match="store timed out"):
            check_consistency(fingerprint(), strict=True)

    def test_a_rank_that_cannot_fingerprint_ends_coarse(self, monkeypatch):
        def broken(*args, **kwargs):
            raise ValueError("bad table")

        monkeypatch.setattr(wd, "policy_fingerprint", broken)
        compiled = engine().compile("fa3")
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            policy, result = wd.consistent_policy(compiled, where="runner:decode")
        assert isinstance(policy, CoarsePolicy) and result.coarse
        assert "bad table" in (result.error or "")
        assert len(caught) == 1 and "bad table" in str(caught[0].message)
        with pytest.raises(ValueError, match="bad table"):
            wd.consistent_policy(compiled, strict=True)

    def test_imports_and_passes_without_torch(self):
        code = (
            "import sys; sys.modules['torch'] = None\n"
            "from warpolicy.runtime.distributed import check_consistency, policy_fingerprint\n"
            "r = check_consistency(policy_fingerprint(lambda m, e, p: 3))\n"
            "print(r.ok, r.checked)\n"
        )
        env = dict(os.environ, PYTHONPATH=str(ROOT))
        out = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60
        )
        assert out.returncode == 0, out.stderr
        assert out.stdout.split() == ["True", "False"]


# -- several processes, gloo ---------------------------------------------------------------------


def _scenario(
    rank: int, environ: dict, files=None, *, strict=False, group=None, backend="fa3"
) -> dict:
    """One check on this rank; what it returned, warned or raised."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            policy, result = compile_consistent(
                engine(environ, files), backend, group=group, strict=strict
            )
        except WarpolicyError as exc:
            return {
                "raised": f"{type(exc).__name__}: {exc}",
                "warnings": [str(w.message) for w in caught],
            }
    cells = {v.label for v in all_cells(policy).values()}
    return {
        "raised": None,
        "result": result.to_json(),
        "policies": sorted(cells),
        "warnings": [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)],
    }


def _bench(rank: int, world: int) -> dict:
    """The tensor-parallel overlap benchmark on these gloo ranks (simulated platform), rank 2
    given another flag: its combined result as every rank returns it."""
    from warpolicy.bench.overlap_tp import TpConfig, run_rank

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # the mismatch warning, checked above
        return run_rank(rank, world, TpConfig(device="sim", steps=6, mismatch_rank=2))


def _rank_main(rank: int, world: int, store: str, outdir: str, extra: str) -> None:
    torch.set_num_threads(1)  # three ranks on a small CI machine: tiny ops, no thread spinning
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    out = {}
    try:
        out["agree"] = _scenario(rank, {})
        out["force_coarse_on_2"] = _scenario(
            rank, {"WARPOLICY_FORCE_COARSE": "1"} if rank == 2 else {}
        )
        out["prefill_on_0"] = _scenario(
            rank, {"WARPOLICY_PREFILL_READ_DONE": "1"} if rank == 0 else {}
        )
        out["extra_file_on_1"] = _scenario(rank, {}, ["default", extra] if rank == 1 else None)
        out["strict"] = _scenario(
            rank, {"WARPOLICY_FORCE_COARSE": "1"} if rank == 2 else {}, strict=True
        )
        out["unknown_backend_on_1_strict"] = _scenario(
            rank, {}, strict=True, backend="no_such_backend" if rank == 1 else "fa3"
        )
        pair = dist.new_group([0, 1])  # every rank creates it; rank 2 is not a member
        out["subgroup"] = _scenario(
            rank, {"WARPOLICY_FORCE_COARSE": "1"} if rank == 1 else {}, group=pair
        )
        out["bench"] = _bench(rank, world)
    finally:
        dist.destroy_process_group()
        Path(outdir, f"rank{rank}.json").write_text(json.dumps(out), encoding="utf-8")


@pytest.fixture(scope="module")
def gloo_runs(tmp_path_factory):
    """Every scenario on three gloo ranks, one spawn: ``runs[scenario][rank]``."""
    tmp = tmp_path_factory.mktemp("gloo")
    extra = tmp / "extra.yaml"
    extra.write_text(EXTRA_YAML, encoding="utf-8")
    mp.spawn(_rank_main, args=(WORLD, str(tmp / "store"), str(tmp), str(extra)), nprocs=WORLD)
    per_rank = [json.loads((tmp / f"rank{r}.json").read_text()) for r in range(WORLD)]
    return {name: [per_rank[r][name] for r in range(WORLD)] for name in per_rank[0]}


def _all_coarse(runs, differing, key):
    for rank, run in enumerate(runs):
        result = run["result"]
        assert run["raised"] is None
        assert result["ok"] is False and result["coarse"] is True and result["checked"]
        assert result["differing_ranks"] == differing
        assert result["first_difference"]["key"] == key
        assert run["policies"] == ["none"], f"rank {rank} did not fall back"
        assert len(run["warnings"]) == 1, run["warnings"]
        assert key in run["warnings"][0]
        assert _name(differing) in run["warnings"][0]


def _name(ranks):
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(map(str, ranks))


class TestGloo:
    def test_all_agree(self, gloo_runs):
        digests = set()
        for run in gloo_runs["agree"]:
            assert run["result"]["ok"] and run["result"]["checked"]
            assert run["warnings"] == []
            assert "in_graph" in run["policies"]
            digests.add(run["result"]["digest"])
        assert len(digests) == 1

    def test_a_different_flag_on_one_rank_is_coarse_on_every_rank(self, gloo_runs):
        _all_coarse(gloo_runs["force_coarse_on_2"], [2], "flag.force_coarse")

    def test_the_odd_rank_is_named_even_when_it_is_rank_0(self, gloo_runs):
        _all_coarse(gloo_runs["prefill_on_0"], [0], "flag.prefill_read_done")

    def test_an_extra_registry_file_on_one_rank_is_coarse_on_every_rank(self, gloo_runs):
        _all_coarse(gloo_runs["extra_file_on_1"], [1], f"registry.backend.{EXTRA_BACKEND}")

    def test_strict_raises_on_every_rank(self, gloo_runs):
        for run in gloo_runs["strict"]:
            assert run["raised"] is not None and "rank 2" in run["raised"]

    def test_a_compile_error_on_one_rank_with_strict_raises_everywhere_without_a_hang(
        self, gloo_runs
    ):
        raised = [run["raised"] for run in gloo_runs["unknown_backend_on_1_strict"]]
        assert raised[1] is not None and raised[1].startswith("UnknownNameError")
        for rank in (0, 2):
            assert raised[rank] is not None and raised[rank].startswith("RankMismatchError")
            assert "rank 1" in raised[rank]

    def test_an_explicit_group_checks_only_its_members(self, gloo_runs):
        members, outsider = gloo_runs["subgroup"][:2], gloo_runs["subgroup"][2]
        for run in members:
            assert run["result"]["coarse"] and run["result"]["world_size"] == 2
            assert run["policies"] == ["none"]
        assert outsider["result"]["ok"] and not outsider["result"]["checked"]


class _TwoRanks:
    """torch.distributed's gather as two ranks see it, the peer announcing ``peer_length``."""

    def __init__(self, monkeypatch, peer_length):
        self.allocated = []
        monkeypatch.setattr(dist, "get_world_size", lambda group=None: 2)
        real_zeros = torch.zeros

        def zeros(*size, **kw):
            self.allocated.append(size)
            return real_zeros(*size, **kw)

        monkeypatch.setattr(torch, "zeros", zeros)

        def all_gather(out, mine, group=None):
            out[0].copy_(mine)
            out[1].fill_(peer_length if mine.numel() == 1 and mine.dtype == torch.int64 else 0)

        monkeypatch.setattr(dist, "all_gather", all_gather)


@pytest.mark.parametrize("peer_length", [256 * 1024 * 1024, wd.MAX_GATHER_BYTES + 1, -5])
def test_a_peer_announcing_a_huge_payload_is_refused_before_allocating(monkeypatch, peer_length):
    """Issue 17 class 13: a gloo peer announcing a 256 MiB fingerprint ends the check (coarse,
    on every rank: each sees the same lengths) without the honest rank allocating it."""
    ranks = _TwoRanks(monkeypatch, peer_length)
    with pytest.raises(ValueError, match="rank 1 announced"):
        wd.all_gather_bytes(b"x" * 100, None, "cpu")
    assert all(max(size or (0,)) < 1024 for size in ranks.allocated)


def test_an_honest_payload_under_the_cap_is_gathered(monkeypatch):
    _TwoRanks(monkeypatch, 0)
    assert wd.all_gather_bytes(b"abc", None, "cpu") == [b"abc", b""]


def test_result_json_carries_the_verdict():
    result = compare_fingerprints([POOL[0], POOL[2], POOL[0]], 0, where="runner:decode")
    data = result.to_json()
    assert data["coarse"] and data["differing_ranks"] == [1]
    assert data["first_difference"]["key"] == "flag.x"
    assert "runner:decode" in data["message"]
    assert isinstance(result, ConsistencyResult)


class TestGlooBench:
    """The overlap benchmark's multi-rank path: an all-reduce ending every layer, one rank with
    another flag."""

    def test_every_rank_returns_the_same_combined_result(self, gloo_runs):
        first = gloo_runs["bench"][0]
        assert all(run == first for run in gloo_runs["bench"])
        assert first["world_size"] == WORLD and first["backend"] == "gloo"

    def test_the_flag_on_one_rank_ends_coarse_on_every_rank(self, gloo_runs):
        result = gloo_runs["bench"][0]
        for rank in result["ranks"]:
            cons = rank["consistency"]
            assert cons["coarse"] and cons["differing_ranks"] == [2]
            assert cons["first_difference"]["key"] == "flag.force_coarse"
            assert {r["resolved"] for r in rank["rows"]} == {"none"}
            assert all(r["corrupted"] == 0 for r in rank["rows"])
        assert result["targets"]["mismatch_coarse_on_every_rank"]

    def test_the_all_reduce_leaves_the_same_output_on_every_rank(self, gloo_runs):
        result = gloo_runs["bench"][0]
        assert len({r["output_checksum"] for r in result["ranks"]}) == 1
        assert result["targets"]["outputs_agree_across_ranks"]
