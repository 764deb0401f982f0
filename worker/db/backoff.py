"""Capped exponential delays between attempts at reaching the database.

One policy for every reconnect and retry of the seam (the notifier, the batcher, the daemon's
patience): each wait doubles, from a tenth of a second up to five seconds.
"""

from __future__ import annotations

FIRST, CAP = 0.1, 5.0  # seconds: the first wait, and the longest


class Backoff:
    """Capped exponential delays: `first`, doubling up to `cap`.

    >>> b = Backoff(); [b.next() for _ in range(8)]
    [0.1, 0.2, 0.4, 0.8, 1.6, 3.2, 5.0, 5.0]
    """

    def __init__(self, first: float = FIRST, cap: float = CAP) -> None:
        self.first, self.cap, self._delay = first, cap, first

    def next(self) -> float:
        delay, self._delay = self._delay, min(self._delay * 2, self.cap)
        return delay

    def reset(self) -> None:
        self._delay = self.first
