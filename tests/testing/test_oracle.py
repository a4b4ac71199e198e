"""The fault matrix's oracle on hand-written call logs: each CUDA rule it models (REFERENCE.md
§3, docs/background.md §3), and early releases / stale reads as it counts them."""

from __future__ import annotations

import pytest

from warpolicy.testing.faults.oracle import Oracle

FWD, SCHED, SIDE = 0, 1, 2


def run(*entries, check_stale=True):
    oracle = Oracle(check_stale=check_stale)
    for entry in entries:
        oracle.feed(entry)
    return oracle.verdict


def read(stream=FWD, step=1, lane=0):
    return ("read", stream, lane, step, "r")


def write(stream=SCHED, through=1, lane=0):
    return ("write", stream, lane, through, "w")


class TestOrdering:
    def test_a_write_with_no_wait_is_early(self):
        assert run(read(), write()).early_writes == 1

    def test_same_stream_program_order_orders(self):
        assert run(read(FWD), write(FWD)).early_writes == 0

    def test_a_wait_on_an_event_recorded_after_the_read_orders(self):
        v = run(read(), ("record", 7, FWD, False), ("wait_event", SCHED, 7), write())
        assert v.early_writes == 0

    def test_an_event_recorded_before_the_read_does_not(self):
        v = run(("record", 7, FWD, False), read(), ("wait_event", SCHED, 7), write())
        assert v.early_writes == 1

    def test_a_wait_binds_to_the_most_recently_enqueued_record(self):
        # recorded after the read, then re-recorded before it on another stream: the wait
        # binds to the later record, which is not ordered after the read
        v = run(
            read(),
            ("record", 7, FWD, False),
            ("record", 7, SIDE, False),
            ("wait_event", SCHED, 7),
            write(),
        )
        assert v.early_writes == 1

    def test_a_wait_on_a_never_recorded_event_is_a_no_op(self):
        v = run(read(), ("wait_event", SCHED, 9), write())
        assert v.early_writes == 1

    def test_wait_stream_orders_after_everything_queued_so_far(self):
        assert run(read(), ("wait_stream", SCHED, FWD), write()).early_writes == 0
        # ... but not after work queued later on that stream
        v = run(("wait_stream", SCHED, FWD), read(), write())
        assert v.early_writes == 1

    def test_synchronize_orders_later_work_on_every_stream_new_ones_too(self):
        assert run(read(), ("synchronize",), write(stream=42)).early_writes == 0

    def test_captured_work_is_not_executed(self):
        v = run(("capture_begin", 3), read(stream=SIDE), ("capture_end", 3), write())
        assert v.reads == 0 and v.early_writes == 0

    def test_a_record_made_during_capture_records_nothing(self):
        v = run(
            ("capture_begin", 3),
            ("record", 7, SIDE, True),
            ("capture_end", 3),
            read(),
            ("wait_event", SCHED, 7),
            write(),
        )
        assert v.early_writes == 1  # the event was never recorded: the wait is a no-op

    def test_an_in_graph_node_fires_at_its_place_in_the_replay(self):
        def step(node_after_read):
            body = [read(), ("record", 7, FWD, "in_graph")]
            return run(
                ("launch", 3, FWD),
                ("replay", 3),
                *(body if node_after_read else body[::-1]),
                ("landed", 3, FWD),
                ("wait_event", SCHED, 7),
                write(),
            )

        assert step(node_after_read=True).early_writes == 0
        assert step(node_after_read=False).early_writes == 1

    def test_the_scheduler_released_for_an_earlier_step_is_not_judged_on_later_reads(self):
        v = run(
            read(step=1),
            ("record", 7, FWD, False),
            read(step=2),
            ("wait_event", SCHED, 7),
            write(through=1),
        )
        assert v.early_writes == 0
        v = run(
            read(step=1),
            ("record", 7, FWD, False),
            read(step=2),
            ("wait_event", SCHED, 7),
            write(through=2),
        )
        assert v.early_writes == 1

    def test_lanes_are_judged_apart(self):
        v = run(read(lane=1), ("record", 7, FWD, False), write(lane=0))
        assert v.early_writes == 0


class TestGraphLaunches:
    """Launches of one graph run one after the other, whatever stream launches them."""

    def launches(self, second_graph):
        fwd2 = 5
        return run(
            ("launch", 3, FWD),
            ("replay", 3),
            read(FWD, step=1),
            ("record", 7, FWD, "in_graph"),
            ("landed", 3, FWD),
            ("launch", second_graph, fwd2),
            ("replay", second_graph),
            read(fwd2, step=2),
            ("record", 7, fwd2, "in_graph"),
            ("landed", second_graph, fwd2),
            # the scheduler, one launch behind, waits for step 1 after step 2 re-recorded it
            ("wait_event", SCHED, 7),
            write(through=1),
        )

    def test_a_later_launch_of_the_same_graph_only_over_waits(self):
        assert self.launches(second_graph=3).early_writes == 0

    def test_another_graph_recording_the_same_event_on_another_stream_races(self):
        assert self.launches(second_graph=4).early_writes == 1

    def test_a_replay_that_raised_before_it_ran_does_not_serialize(self):
        v = run(
            ("launch", 3, FWD),
            ("landed", 3, FWD),  # no ("replay", 3): it never ran
            ("launch", 3, SIDE),
            ("replay", 3),
            ("landed", 3, SIDE),
            read(FWD),
            ("record", 7, SIDE, False),
            ("wait_event", SCHED, 7),
            write(),
        )
        assert v.early_writes == 1


class TestStale:
    def test_a_read_not_after_the_last_write_is_stale(self):
        assert run(write(through=0), read()).stale_reads == 1

    def test_a_read_after_a_wait_on_the_writes_is_not(self):
        v = run(write(through=0), ("record", 8, SCHED, False), ("wait_event", FWD, 8), read())
        assert v.stale_reads == 0

    def test_stale_checks_can_be_off(self):
        assert run(write(through=0), read(), check_stale=False).stale_reads == 0


def test_every_early_pair_is_counted_and_the_first_described():
    v = run(read(step=1), read(step=1), write())
    assert (v.early_writes, v.early_pairs) == (1, 2)
    assert "not ordered after read" in v.first_early


@pytest.mark.parametrize("kind", ["create_event", "unknown"])
def test_entries_it_does_not_model_change_nothing(kind):
    v = run(read(), ("wait_stream", SCHED, FWD), (kind, 1, 2), write())
    assert v.early_writes == 0
