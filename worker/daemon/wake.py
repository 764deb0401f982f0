"""The wake token of one worker: whether it answers a new job's notification.

Every insert notifies every idle worker; if each answered with a claim, all but one would find
nothing, and a fleet of idle workers would cost the server a claim per worker per job. Idle
workers that claim alike (the same queues and tasks) share one token instead
(`worker.db.sql.wake`): its holder answers `worker_jobs` at once, with a claim, and the others
let the notification pass. A worker without the token tries to take it at each of its polls
instead of claiming; a holder whose slots fill gives it back and says so (`worker_wake`), and
the idle workers race for it then, the winner claiming at once. So a burst wakes one worker
after another, as many as it needs.

A holder that dies loses the token with its session: the next poll of another worker takes it.
A holder that stays alive but claims nothing (its event loop blocked by a task) keeps it, so
every `FALLBACK_POLLS`-th poll a worker without the token claims anyway: the poll stays the
fallback.

What this does not do: it does not work behind a transaction pooler (no session lasts to
hold a token), where every idle worker answers every notification, as it does in memory.
"""

from __future__ import annotations

import contextlib
import zlib

from worker.db.driver import ClaimSpec, WakeTokens
from worker.db.errors import TRANSIENT

# Polls of a worker without the token between two claims of its own: a blocked holder delays
# a new job by this many polls at most.
FALLBACK_POLLS = 5


def wake_key(spec: ClaimSpec) -> int:
    """The token's key: the same for workers that claim the same jobs, as a signed int4.

    >>> from uuid import UUID
    >>> spec = ClaimSpec(UUID(int=0), ["default"], ["a", "b"], 3, [], [])
    >>> wake_key(spec) == wake_key(ClaimSpec(UUID(int=1), ["default"], ["a", "b"], 5, [], []))
    True
    """
    text = "\x1f".join(spec.queues) + "\x1e" + "\x1f".join(spec.tasks)
    return zlib.crc32(text.encode()) - 2**31


class WakeToken:
    """One worker's hold on its token; see the module's docs."""

    def __init__(self, tokens: WakeTokens, spec: ClaimSpec) -> None:
        self._tokens = tokens
        self.key = wake_key(spec)
        self.held = False
        self._polls = 0

    def called(self, payload: str) -> bool:
        """Whether a `worker_wake` notification is for this worker: its token is free."""
        return not self.held and payload == str(self.key)

    async def take(self) -> bool:
        """Whether this worker holds the token, taking it if no one does. An outage counts as
        not taken: the poll looks again."""
        if not self.held:
            with contextlib.suppress(*TRANSIENT):
                self.held = await self._tokens.take(self.key)
        return self.held

    async def give_back(self) -> None:
        """Let another idle worker answer: this one has no free slot, or stops."""
        if self.held:
            self.held = False
            # Lost in an outage, it went with the session, or the session's end frees it.
            with contextlib.suppress(*TRANSIENT):
                await self._tokens.give_back(self.key)

    def fallback_due(self) -> bool:
        """Count a poll without the token; True at every `FALLBACK_POLLS`-th: claim anyway."""
        self._polls = (self._polls + 1) % FALLBACK_POLLS
        return self._polls == 0
