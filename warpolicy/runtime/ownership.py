"""One owner thread per runner, fence and overlap loop.

A runner's step counter, its fence's mailbox and ring, and an overlap loop's pending writes are
plain attributes updated without locks: two threads stepping one runner would interleave those
updates and could hand the scheduler an event of another step (0.2.0 measured 0-7 early
releases per 1,200 writes). Instead of paying for locks on every step, each of these objects
belongs to one thread: the first thread that uses it owns it, and a call from any other thread
raises `WrongThreadError` before it touches any state.

The check on the step path is one ``threading.get_ident()`` and a comparison::

    if self._owner.ident != get_ident():
        self._owner.claim()          # binds the first user, or raises WrongThreadError

Hand an object to another thread with `ThreadOwner.release` (called by the owner, between
steps); the next thread to use it owns it.
"""

from __future__ import annotations

import threading

from warpolicy.errors import WarpolicyError

#: The hot-path thread id, bound once (``threading.get_ident``).
get_ident = threading.get_ident


class WrongThreadError(WarpolicyError):
    """A runner, fence or overlap loop was used from a thread other than its owner.

    Each of them belongs to the first thread that uses it (its scheduler thread); use one
    runner per thread, or hand it over with ``release_thread()`` from the owning thread.
    """


class ThreadOwner:
    """The thread that owns one object (``what`` names it in the error)."""

    __slots__ = ("_lock", "ident", "what")

    def __init__(self, what: str) -> None:
        self.what = what
        #: the owner's ``threading.get_ident()``, None until the first use
        self.ident: int | None = None
        self._lock = threading.Lock()

    def claim(self) -> None:
        """The slow path of the check: bind the first user, or raise for any other thread."""
        me = get_ident()
        with self._lock:
            if self.ident is None:
                self.ident = me
                return
            owner = self.ident
        if owner != me:
            raise WrongThreadError(
                f"{self.what} belongs to thread {owner} and was used from thread {me}; "
                "use one per thread, or hand it over with release_thread() from its owner"
            )

    def check(self) -> None:
        """Raise `WrongThreadError` unless the calling thread owns the object (binds the first)."""
        if self.ident != get_ident():
            self.claim()

    def release(self) -> None:
        """Forget the owner (called by the owner between steps); the next user owns it."""
        self.check()
        with self._lock:
            self.ident = None
