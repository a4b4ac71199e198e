"""The audit's launch sites: which Python line launched each late reader it names.

`SitedModel` is a model view (like the audit's stalled model) that, while the runner captures a
bucket's graph, records each node's `LaunchSite` (`warpolicy.runtime.graphwalk.launch_sites`)
for that bucket. `with_sites` then tags the static audit's and the self-check refutation's
`Offender`s with ``file.py:line``, so a report prints ``indexSelectLargeIndex (sglang.py:63)``.
Only CUDA captures have node indices to map; elsewhere (and without cuda-bindings) the view
records nothing and the offenders keep their kernel names alone.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import attrs

from warpolicy.audit.report import Offender, Refutation, StaticResult
from warpolicy.runtime.graphwalk.errors import GraphWalkError
from warpolicy.runtime.graphwalk.launch_sites import (
    LaunchRecorder,
    LaunchSite,
    NodeCounter,
    node_counter,
    run_recorded,
)
from warpolicy.runtime.runners.adapters import ModelView
from warpolicy.runtime.runners.protocols import CanaryAdapter


class SitedModel(ModelView):
    """A model view recording launch sites of every captured bucket (``sites[bucket]``)."""

    def __init__(self, model: Any, platform: Any, count: NodeCounter) -> None:
        super().__init__(model)
        self.platform = platform
        self.count = count
        self.sites: dict[int, dict[int, LaunchSite]] = {}

    def _recorded(self, bucket: int, fresh: bool, body: Callable[[], Any]) -> Any:
        if not self.platform.is_capturing():
            return body()
        if fresh:  # graph_prep opens a bucket's capture: a re-capture starts over
            self.sites[bucket] = {}
        recorder = LaunchRecorder(self.count)
        recorder.sites = self.sites.setdefault(bucket, {})
        return run_recorded(recorder, body)

    def graph_prep(self, bucket: int) -> None:
        self._recorded(bucket, True, lambda: self.model.graph_prep(bucket))

    def forward(self, bucket: int) -> Any:
        return self._recorded(bucket, False, lambda: self.model.forward(bucket))

    def __getattr__(self, name: str) -> Any:
        return getattr(self.model, name)


class SitedCanaryModel(SitedModel):
    """A `SitedModel` of a model the WAR canary can check (``canary_spec`` on the class)."""

    def __init__(self, model: CanaryAdapter, platform: Any, count: NodeCounter) -> None:
        super().__init__(model, platform, count)
        self._canary_model = model

    def canary_spec(self, mode: Any, bucket: int, batch: Any) -> Any:
        return self._canary_model.canary_spec(mode, bucket, batch)


def sited_model(model: Any, platform: Any) -> SitedModel | None:
    """``model`` recording launch sites during capture, or None where none can be recorded (not
    CUDA, or no cuda-bindings)."""
    if getattr(platform, "name", "") != "cuda":
        return None
    try:
        count = node_counter()
    except GraphWalkError:
        return None
    if isinstance(model, CanaryAdapter):
        return SitedCanaryModel(model, platform, count)
    return SitedModel(model, platform, count)


Sites = Mapping[int, Mapping[int, LaunchSite]]  # bucket -> node index -> site


def _tag(offender: Offender, sites: Sites) -> Offender:
    if offender.bucket is None or offender.site:
        return offender
    found = sites.get(offender.bucket, {}).get(offender.node)
    return attrs.evolve(offender, site=found.where) if found is not None else offender


def static_with_sites(result: StaticResult, sites: Sites) -> StaticResult:
    """``result`` with each offender's launch site, where one was recorded."""
    if not sites or not result.offenders:
        return result
    return attrs.evolve(result, offenders=tuple(_tag(o, sites) for o in result.offenders))


def refutation_with_sites(refuted: Refutation | None, sites: Sites) -> Refutation | None:
    """``refuted`` with each late reader's launch site, where one was recorded."""
    if refuted is None or not sites:
        return refuted
    return attrs.evolve(refuted, late=tuple(_tag(o, sites) for o in refuted.late))
