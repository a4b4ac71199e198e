"""Launch sites (`warpolicy.runtime.graphwalk.launch_sites`): each node a launch adds is tagged
with the innermost Python line outside torch, the innermost launch wins, and nothing is
recorded outside a capture. The node counter is faked: every torch call "adds" one node."""

from __future__ import annotations

import itertools
import sys
import types

import torch

from warpolicy.runtime.graphwalk.launch_sites import LaunchRecorder, LaunchSite

HERE = __file__.rsplit("/", 1)[-1]


def _line() -> int:
    return sys._getframe(1).f_lineno + 1  # the line after the call


def test_every_torch_call_that_adds_nodes_names_this_file_and_line():
    ticks = itertools.count()  # before = k, after = k + 1: one node per call, every other index
    with LaunchRecorder(lambda: next(ticks)) as rec:
        a = torch.arange(6)
        line = _line()
        torch.index_select(a, 0, torch.tensor([1, 2]))
    sites = sorted(rec.sites.items())
    ops = [(site.op, site.where) for _, site in sites]
    assert ("index_select", f"{HERE}:{line}") in ops
    assert ("arange", f"{HERE}:{line - 2}") in ops
    assert all(where.startswith(HERE) for _, where in ops)


def test_tensor_methods_are_named_as_such():
    ticks = itertools.count()
    a = torch.zeros(3)
    with LaunchRecorder(lambda: next(ticks)) as rec:
        a.add_(1)
    assert [s.op for s in rec.sites.values()] == ["Tensor.add_"]


def test_no_capture_records_nothing_and_the_mode_is_gone_after_exit():
    with LaunchRecorder(lambda: None) as rec:
        torch.ones(2) + 1
    assert rec.sites == {} and rec.launches == 0
    counted = []
    with LaunchRecorder(lambda: counted.append(1) or 0):
        pass
    torch.ones(2) + 1  # outside: the counter is never asked
    assert counted == []


def test_an_inner_launch_keeps_its_own_site():
    rec = LaunchRecorder(lambda: 0)
    inner = types.SimpleNamespace(
        f_code=types.SimpleNamespace(co_filename="/x/kernels.py"), f_lineno=7, f_back=None
    )
    outer = types.SimpleNamespace(
        f_code=types.SimpleNamespace(co_filename="/x/model.py"), f_lineno=3, f_back=None
    )
    rec.record("my_triton_kernel", 4, 6, inner)  # the Triton launch inside the op, first
    rec.record("Tensor.copy_", 3, 7, outer)  # then the op that wrapped it
    assert {i: s.where for i, s in rec.sites.items()} == {
        3: "model.py:3",
        4: "kernels.py:7",
        5: "kernels.py:7",
        6: "model.py:3",
    }


def test_frames_inside_torch_are_skipped():
    torch_dir = torch.__file__.rsplit("/", 1)[0]
    user = types.SimpleNamespace(
        f_code=types.SimpleNamespace(co_filename="/srv/engine.py"), f_lineno=42, f_back=None
    )
    inside = types.SimpleNamespace(
        f_code=types.SimpleNamespace(co_filename=f"{torch_dir}/functional.py"),
        f_lineno=9,
        f_back=user,
    )
    assert LaunchRecorder(lambda: 0).site("mm", inside) == LaunchSite("mm", "/srv/engine.py", 42)


def test_self_check_and_derived_plant_name_readers_by_file_and_line():
    from warpolicy.runtime.graphwalk.analysis import Reader
    from warpolicy.runtime.graphwalk.model import NodeKind
    from warpolicy.runtime.graphwalk.plant import DerivedPlant, SelfCheck

    late = Reader(12, NodeKind.KERNEL, "indexSelectLargeIndex", ("full_to_swa",))
    sites = {12: LaunchSite("index_select", "/srv/zoo/sglang.py", 95)}
    check = SelfCheck(3, (late,), 4, 40, 1.0, 0.1)
    assert check.describe(8, sites) == (
        "bucket 8: shared reader(s) after the read-done node: "
        "indexSelectLargeIndex (sglang.py:95) (#12) reads full_to_swa"
    )
    assert "indexSelectLargeIndex (#12)" in check.describe(8)  # no sites: the kernel alone
    plant = DerivedPlant((late,), (late,), 40, 1.0, 0.5, 0.2)
    assert plant.describe(sites).startswith(
        "derived read-done node after indexSelectLargeIndex (sglang.py:95) #12"
    )


def test_no_recorder_off_cuda_and_run_recorded_runs_the_body_plainly():
    from warpolicy.runtime.graphwalk.launch_sites import recorder_for, run_recorded

    assert recorder_for("sim") is None
    assert run_recorded(None, lambda: 7) == 7


def test_a_recorder_whose_hooks_fail_to_install_still_runs_the_body(monkeypatch):
    from warpolicy.runtime.graphwalk.launch_sites import run_recorded

    rec = LaunchRecorder(lambda: 0)

    def broken():
        raise RuntimeError("no dispatch hook here")

    monkeypatch.setattr(rec, "_install_dispatch", broken)
    assert run_recorded(rec, lambda: "ran") == "ran"


def test_the_capture_self_check_and_derived_plant_lines_carry_the_sites():
    from warpolicy.runtime.graphwalk.analysis import Reader
    from warpolicy.runtime.graphwalk.model import NodeKind
    from warpolicy.runtime.graphwalk.plant import DerivedPlant, SelfCheck
    from warpolicy.runtime.placement import Verdict, check_bucket_marker, plant_bucket_derived

    late = Reader(5, NodeKind.KERNEL, "gather_kernel", ("req_to_token",))
    sites = {5: LaunchSite("index_select", "/srv/engine/attn.py", 211)}

    class Walks:
        def check_marker(self, graph, shared, event):
            return SelfCheck(2, (late,), 3, 9, 0.5, 0.1)

        def plant_derived(self, graph, shared, event):
            return DerivedPlant((late,), (late,), 9, 0.5, 0.1, 0.1)

    checked = check_bucket_marker(Walks(), None, {}, None, sites)
    assert checked.verdict is Verdict.REFUTED and "gather_kernel (attn.py:211)" in checked.detail
    planted = plant_bucket_derived(Walks(), None, {}, None, sites)
    assert planted.confirmed and "gather_kernel (attn.py:211) #5" in planted.detail
