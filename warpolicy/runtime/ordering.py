"""Last-resort orderings that survive a second fault.

When a step fails, what runs next must still be ordered after the reads the failed work
enqueued: a stream waits for another, or, if that wait fails, the host waits for everything.
These fallbacks run while an exception is already in flight, so a second one (a
``KeyboardInterrupt`` arriving in the fallback itself) must not skip them: the ordering is done
first, the exception propagates after. Every last-resort ordering of the runtime goes through
`order_after` or `synchronize_all`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from warpolicy.runtime.platforms import Platform, StreamHandle


def synchronize_all(platform: Platform) -> None:
    """The host waits for every stream. Interrupted (any ``BaseException``), it waits once
    more before the exception propagates: a second interrupt during the last resort must not
    leave the next step unordered."""
    try:
        platform.synchronize()
    except BaseException:
        platform.synchronize()
        raise


def order_after(
    platform: Platform,
    waiter: StreamHandle,
    streams: Iterable[StreamHandle],
    wait: Callable[[StreamHandle, StreamHandle], None] | None = None,
) -> Exception | None:
    """``waiter`` waits for each of ``streams`` (through ``wait``, default the platform's
    ``wait_stream``); if a wait raises, the host waits for everything instead
    (`synchronize_all`). Returns the ``Exception`` a wait raised (the caller reports it), None
    when every wait was enqueued; a ``BaseException`` propagates, after the host waited."""
    wait_stream = platform.wait_stream if wait is None else wait
    try:
        for stream in streams:
            wait_stream(waiter, stream)
    except Exception as exc:  # noqa: BLE001 - the host waits instead; the caller reports it
        synchronize_all(platform)
        return exc
    except BaseException:  # KeyboardInterrupt: order first, then re-raise
        synchronize_all(platform)
        raise
    return None


__all__ = ["order_after", "synchronize_all"]
