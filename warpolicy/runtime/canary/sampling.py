"""Which steps the canary samples: a countdown per runner (or overlap loop) with random gaps.

With rate ``r`` the gaps between sampled steps are geometric with mean ``1 / r`` (each step is
sampled with probability ``r``, independently), so a workload whose batches repeat with some
period cannot hide from a fixed stride. The per-step cost is one decrement and one comparison;
a random number is drawn only when a step is sampled. ``r = 1`` samples every step; ``r = 0``
never samples.
"""

from __future__ import annotations

import math
import random


def next_gap(rate: float, rng: random.Random) -> int:
    """Steps until the next sample (at least 1): geometric with mean ``1 / rate``; a very large
    gap when ``rate`` is 0 (never, in practice)."""
    if rate >= 1.0:
        return 1
    if rate <= 0.0:
        return 1 << 62
    u = rng.random()  # in [0, 1)
    return 1 + int(math.log1p(-u) / math.log1p(-rate))


class Countdown:
    """Counts steps down to the next sample (one per runner, or per overlap loop)."""

    __slots__ = ("_left", "_rate", "_rng")

    def __init__(self, rate: float, seed: int | None = None) -> None:
        self._rate = float(rate)
        self._rng = random.Random(seed)
        self._left = next_gap(self._rate, self._rng)

    def due(self) -> bool:
        """Count this step; True when it is to be sampled."""
        self._left -= 1
        if self._left > 0:
            return False
        self._left = next_gap(self._rate, self._rng)
        return True


__all__ = ["Countdown", "next_gap"]
