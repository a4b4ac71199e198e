"""`warpolicy.runtime.ordering`: the last-resort orderings order first and re-raise after, also
when a second fault hits the fallback itself (issue 26 finding 2)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from warpolicy.runtime.ordering import order_after, synchronize_all


class Calls:
    """A platform whose ``wait_stream`` / ``synchronize`` fail as scripted, in call order."""

    def __init__(self, faults):
        self.faults = list(faults)  # per call: None (works) or an exception to raise
        self.done = []  # the calls that completed

    def _call(self, name, *args):
        fault = self.faults.pop(0) if self.faults else None
        if fault is not None:
            raise fault
        self.done.append((name, *args))

    def wait_stream(self, stream, other):
        self._call("wait_stream", stream, other)

    def synchronize(self):
        self._call("synchronize")


def test_a_wait_that_works_needs_no_host_wait():
    p = Calls([])
    assert order_after(p, "s", ["f", "g"]) is None
    assert p.done == [("wait_stream", "s", "f"), ("wait_stream", "s", "g")]


def test_a_failed_wait_makes_the_host_wait_and_is_returned():
    error = RuntimeError("wait failed")
    p = Calls([error])
    assert order_after(p, "s", ["f"]) is error
    assert p.done == [("synchronize",)]


def test_an_interrupted_wait_makes_the_host_wait_then_re_raises():
    p = Calls([KeyboardInterrupt()])
    with pytest.raises(KeyboardInterrupt):
        order_after(p, "s", ["f"])
    assert p.done == [("synchronize",)]


@pytest.mark.parametrize("second", [KeyboardInterrupt(), SystemExit(), GeneratorExit()])
def test_a_second_interrupt_in_the_host_wait_waits_again(second):
    """The wait fails, then the fallback synchronize is interrupted: it synchronizes once more
    before the interrupt propagates (0.3.0's fence skipped the host wait here)."""
    p = Calls([RuntimeError("wait failed"), second])
    with pytest.raises(type(second)):
        order_after(p, "s", ["f"])
    assert p.done == [("synchronize",)]


def test_a_custom_wait_is_used():
    p = Calls([])
    seen = []
    assert order_after(p, "s", ["f"], lambda a, b: seen.append((a, b))) is None
    assert seen == [("s", "f")] and p.done == []


@given(st.lists(st.sampled_from([None, "error", "interrupt"]), min_size=1, max_size=4))
def test_either_every_wait_is_enqueued_or_the_host_waited(script):
    """Whatever fails, in any order, at most two faults: the waiter ends up ordered (every wait
    done) or a host synchronize completed, before anything propagates."""
    faults = [
        None if f is None else (RuntimeError("x") if f == "error" else KeyboardInterrupt())
        for f in script
    ]
    if sum(f is not None for f in faults) > 2:
        faults = faults[:2]
    p = Calls(faults)
    try:
        order_after(p, "s", ["f", "g"])
    except BaseException:  # noqa: BLE001 - what propagates is the caller's
        pass
    waited = [c for c in p.done if c[0] == "wait_stream"]
    assert len(waited) == 2 or ("synchronize",) in p.done


def test_synchronize_all_retries_once():
    p = Calls([KeyboardInterrupt()])
    with pytest.raises(KeyboardInterrupt):
        synchronize_all(p)
    assert p.done == [("synchronize",)]
