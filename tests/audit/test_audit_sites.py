"""The audit's launch sites (`warpolicy.audit.sites`): the view records per captured bucket, and
offenders of the static audit and of a refutation print as ``kernel (file.py:line)``."""

from __future__ import annotations

import itertools

import torch

from warpolicy.audit.report import INCONCLUSIVE, UNSAFE, Offender, Refutation, StaticResult
from warpolicy.audit.sites import (
    SitedModel,
    refutation_with_sites,
    sited_model,
    static_with_sites,
)
from warpolicy.registry.vocabulary import IN_GRAPH, POST_REPLAY
from warpolicy.runtime.graphwalk.launch_sites import LaunchSite
from warpolicy.testing import sim_platform
from warpolicy.testing.models import RecModel

SITES = {4: {12: LaunchSite("index_select", "/srv/sglang.py", 63)}}


def _offender(node=12, bucket=4):
    return Offender(node, "kernel", "indexSelectLargeIndex", ("req_to_token",), bucket=bucket)


def test_a_static_offender_prints_as_kernel_file_and_line():
    result = static_with_sites(StaticResult(UNSAFE, (_offender(), _offender(node=13))), SITES)
    assert result.offenders[0].describe() == (
        "indexSelectLargeIndex (sglang.py:63) at bucket 4 node 12, kernel, touches req_to_token"
    )
    assert result.offenders[1].site == ""  # no site recorded for node 13
    assert result.summary() == "unsafe: indexSelectLargeIndex, indexSelectLargeIndex (sglang.py:63)"
    assert result.to_json()["offenders"][0]["site"] == "sglang.py:63"


def test_a_refutation_names_its_late_readers_by_file_and_line():
    refuted = Refutation(IN_GRAPH, POST_REPLAY, (4,), (_offender(),))
    tagged = refutation_with_sites(refuted, SITES)
    assert tagged.summary() == "refuted: indexSelectLargeIndex (sglang.py:63)"
    assert "indexSelectLargeIndex (sglang.py:63)" in tagged.describe()
    assert refutation_with_sites(None, SITES) is None


def test_nothing_to_tag_leaves_the_result_as_it_was():
    plain = StaticResult(INCONCLUSIVE, reason="x")
    assert static_with_sites(plain, SITES) is plain
    assert static_with_sites(StaticResult(UNSAFE, (_offender(),)), {}).offenders[0].site == ""


def test_no_view_off_cuda():
    assert sited_model(RecModel(), sim_platform()) is None


class _Capturing:
    def __init__(self):
        self.on = False

    def is_capturing(self):
        return self.on


def test_the_view_records_each_bucket_while_capturing_and_restarts_on_recapture():
    platform = _Capturing()
    ticks = itertools.count()
    view = SitedModel(RecModel(), platform, lambda: next(ticks))
    view.prepare_bucket(4)
    view.graph_prep(4)  # not capturing: nothing recorded
    assert view.sites == {}
    platform.on = True
    view.graph_prep(4)
    view.forward(4)
    first = dict(view.sites[4])
    assert first and all(s.where.startswith("models.py:") for s in first.values())
    view.graph_prep(4)  # a re-capture of the bucket starts over
    assert len(view.sites[4]) <= len(first)
    torch.ones(1)  # the hooks are gone after each call
