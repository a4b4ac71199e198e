"""The race widener (`warpolicy.runtime.runners.widen`): off by default, resolved once from the
argument or ``WARPOLICY_WIDEN_RACE_US``, a bad argument one clear error, a bad environment
value off (never a crash), and when off the model itself (the step path unchanged)."""

from __future__ import annotations

import logging

import pytest

from warpolicy.errors import InputError
from warpolicy.runtime.runners.widen import (
    MAX_US,
    WIDEN_ENV,
    RaceWidener,
    WidenedCanaryModel,
    WidenedModel,
)
from warpolicy.testing import sim_platform
from warpolicy.testing.models import RecModel


class TestResolve:
    def test_off_by_default(self):
        w = RaceWidener.resolve(environ={})
        assert not w.on and w.describe() == "off"

    @pytest.mark.parametrize("raw", ["", " ", "0", "0.0"])
    def test_unset_blank_or_zero_is_off(self, raw):
        assert not RaceWidener.resolve(environ={WIDEN_ENV: raw}).on

    def test_the_environment_sets_microseconds(self):
        w = RaceWidener.resolve(environ={WIDEN_ENV: " 25 "})
        assert (w.us, w.source, w.describe()) == (25.0, WIDEN_ENV, f"25 us ({WIDEN_ENV})")

    @pytest.mark.parametrize("raw", ["abc", "-1", "nan", "inf", str(MAX_US * 2)])
    def test_a_bad_environment_value_is_off_with_one_log_line(self, raw, caplog):
        with caplog.at_level(logging.WARNING, logger="warpolicy"):
            w = RaceWidener.resolve(environ={WIDEN_ENV: raw})
        assert not w.on
        assert len(caplog.records) == 1 and WIDEN_ENV in caplog.records[0].getMessage()

    def test_the_argument_wins_over_the_environment(self):
        w = RaceWidener.resolve(40, environ={WIDEN_ENV: "25"})
        assert (w.us, w.source) == (40.0, "argument")
        assert not RaceWidener.resolve(0, environ={WIDEN_ENV: "25"}).on  # 0 switches it off

    @pytest.mark.parametrize("bad", [-1, "x", True, float("nan"), MAX_US + 1])
    def test_a_bad_argument_is_an_input_error(self, bad):
        with pytest.raises(InputError, match="widen_race_us"):
            RaceWidener.resolve(bad, environ={})


class TestWrap:
    def test_off_returns_the_model_itself(self):
        model = RecModel()
        assert RaceWidener().wrap(model, sim_platform()) is model

    def test_on_but_not_cuda_returns_the_model_itself(self):
        # the simulated platform's race is already the widest window: nothing to spin
        model = RecModel()
        assert RaceWidener(50).wrap(model, sim_platform()) is model

    def test_the_view_spins_at_the_graph_start_and_after_the_marker(self):
        calls: list[str] = []

        class Model(RecModel):
            def graph_prep(self, bucket):
                calls.append("prep")

            def forward(self, bucket):
                calls.append("forward")

        view = WidenedModel(Model(), lambda: calls.append("spin"))
        view.graph_prep(4)
        view.forward(4)
        assert calls == ["spin", "prep", "spin", "forward"]

    def test_a_canary_model_stays_a_canary_model(self):
        from warpolicy.runtime.runners.protocols import CanaryAdapter

        class Model(RecModel):
            def canary_spec(self, mode, bucket, batch):
                return ("spec", mode, bucket, batch)

        view = WidenedCanaryModel(Model(), lambda: None)
        assert isinstance(view, CanaryAdapter)
        assert view.canary_spec("decode", 4, "b") == ("spec", "decode", 4, "b")


class TestRunner:
    """A runner resolves the widener once, at construction: the argument, else the variable."""

    def _runner(self, **kw):
        from warpolicy.runtime.runners import DecodeRunner

        model = RecModel()
        return model, DecodeRunner(model, lambda mode, eager, planted: 1, sim_platform(), **kw)

    def test_off_by_default_and_the_model_is_taken_as_it_is(self, monkeypatch):
        monkeypatch.delenv(WIDEN_ENV, raising=False)
        model, runner = self._runner()
        assert not runner.widener.on and runner.model is model

    def test_the_argument_and_the_environment(self, monkeypatch):
        monkeypatch.setenv(WIDEN_ENV, "30")
        _, runner = self._runner()
        assert (runner.widener.us, runner.widener.source) == (30.0, WIDEN_ENV)
        _, runner = self._runner(widen_race_us=0)
        assert not runner.widener.on  # the argument wins
        model, runner = self._runner(widen_race_us=80)
        assert runner.widener.us == 80.0
        assert runner.model is model  # the simulated platform: nothing to spin

    def test_a_bad_argument_is_one_input_error(self):
        with pytest.raises(InputError, match="widen_race_us"):
            self._runner(widen_race_us=-3)
