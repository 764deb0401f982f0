"""The local queue: the jobs this worker holds, claimed as slots free, claimed ahead, handed back.

The claim loop claims as many jobs as there are free slots and hands them to the executor.
While jobs finish within milliseconds it also claims up to `PREFETCH_BATCHES` more batches
ahead, so the next jobs are at hand when slots free instead of one claim's round trip later,
and each claim and each outcome write serves more jobs. Jobs claimed ahead are this worker's
like running ones (cancel requests reach them, a stop hands them back); if no slot frees for
`PREFETCH_HOLD` seconds they go back to the queue for other workers, without counting an
attempt.

The loop is a small state machine (`State`, its moves in `_MOVES`): it is claiming, waiting
for news or the next poll, full (no slot free), holding jobs claimed ahead, handing them
back, or stopped. It wakes at once on NOTIFY (a job inserted, a job resumed) and, when idle,
polls with exponential backoff from `WORKER_POLL_MIN` up to `WORKER_POLL_MAX`: notifications
are an optimisation, polling alone drains the queue. A job this worker snoozed (or retried
after a delay its task chose) sends no notification when it is due again, so the idle wait
also ends when the first of those is due: a polling stage runs at the interval it asked for,
not up to `WORKER_POLL_MAX` later. In burst mode a claim that finds no due job while the
worker holds none (none running, claimed ahead or with an outcome unwritten) stops the
worker: it goes from claiming to stopped.

What this does not do: it does not run jobs (`executor`) nor write their outcomes
(`completer`); it hands each finished attempt's outcome to `hand_over`.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from enum import StrEnum
from uuid import UUID

from worker.daemon.db import Patience
from worker.daemon.executor import Executor
from worker.db.driver import ClaimSpec, Driver
from worker.db.errors import TRANSIENT
from worker.logs import fields
from worker.models import ClaimedJob, Outcome, OutcomeKind
from worker.settings import Settings
from worker.stages import Pipeline
from worker.tasks import Executable

log = logging.getLogger("worker.daemon")
job_log = logging.getLogger("worker.jobs")

# Claiming ahead pays while jobs take about a round trip; past this mean duration it would
# only keep jobs from other workers.
PREFETCH_BELOW_SECONDS = 0.05
# Batches of `WORKER_CONCURRENCY` jobs claimed ahead. Every claim and every outcome write is a
# commit: several batches ahead let each serve more jobs, and the last job claimed ahead still
# waits for a slot well within `PREFETCH_HOLD`.
PREFETCH_BATCHES = 4
# Jobs claimed ahead go back to the queue if no slot frees for this long.
PREFETCH_HOLD = 0.5


class State(StrEnum):
    """Where the claim loop is."""

    WAITING = "waiting"  # for a notification or the next poll
    CLAIMING = "claiming"  # a claim is on its way
    FULL = "full"  # every slot taken: waiting for one to free
    AHEAD = "ahead"  # jobs claimed ahead wait for slots
    HANDING_BACK = "handing back"  # no slot freed in time: the jobs ahead go back
    STOPPED = "stopped"


# The loop's moves: from each state, the states it may go to next.
_MOVES: dict[State, frozenset[State]] = {
    State.WAITING: frozenset({State.CLAIMING, State.FULL, State.AHEAD, State.STOPPED}),
    State.CLAIMING: frozenset(
        {State.CLAIMING, State.WAITING, State.FULL, State.AHEAD, State.STOPPED}
    ),
    State.FULL: frozenset({State.CLAIMING, State.FULL, State.AHEAD, State.STOPPED}),
    State.AHEAD: frozenset(
        {State.CLAIMING, State.FULL, State.AHEAD, State.HANDING_BACK, State.STOPPED}
    ),
    State.HANDING_BACK: frozenset({State.CLAIMING, State.FULL, State.AHEAD, State.STOPPED}),
    State.STOPPED: frozenset({State.STOPPED}),
}


def next_poll_delay(current: float, found_work: bool, poll_min: float, poll_max: float) -> float:
    """Idle polling: back to the minimum on work, else double up to the maximum."""
    return poll_min if found_work else min(current * 2, poll_max)


async def _wait_until_set(event: asyncio.Event, timeout: float | None) -> None:
    """Wait for `event` at most `timeout` seconds. Unlike `asyncio.wait_for`, this makes no task
    to run the wait: a wake-up reaches the waiter one loop iteration after `set()`, not three."""
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(timeout):
            await event.wait()


def claim_spec(
    worker_id: UUID, queues: list[str], settings: Settings, registry: Mapping[str, Executable]
) -> ClaimSpec:
    """What every claim asks: the registered tasks, the only ones it takes; the registered
    pipelines and their first stages, for the claim to start them; and the tasks' own retry
    limits and concurrency per key, for the claim to read."""
    pipelines = [
        (name, entry.main_stages[0].name)
        for name, entry in registry.items()
        if isinstance(entry, Pipeline) and entry.main_stages
    ]
    per_key = {
        name: entry.concurrency for name, entry in registry.items() if entry.concurrency is not None
    }
    limits = {
        name: entry.retries.max_retries
        for name, entry in registry.items()
        if entry.retries.max_retries is not None
    }
    return ClaimSpec(
        worker_id,
        queues,
        sorted(registry),
        settings.max_retries,
        [name for name, _ in pipelines],
        [stage for _, stage in pipelines],
        list(limits),
        list(limits.values()),
        list(per_key),
        list(per_key.values()),
    )


class LocalQueue:
    """The jobs one worker holds, and the claim loop that fills its slots."""

    def __init__(
        self,
        driver: Driver,
        worker_id: UUID,
        queues: list[str],
        settings: Settings,
        patience: Patience,
        stopping: Callable[[], bool],
        hand_over: Callable[[ClaimedJob, Outcome], None],
        drained: Callable[[], None] | None = None,
    ) -> None:
        self._driver = driver
        self._id = worker_id
        self._queues = queues
        self._settings = settings
        self._concurrency = settings.concurrency
        self._patience = patience
        self._stopping = stopping
        self._hand_over = hand_over
        # Burst mode (`worker run --burst`): called once a claim finds no due job while this
        # worker holds none and has no outcome left to write; it stops the worker.
        self._drained = drained
        self.executor: Executor  # set by the worker, which makes both
        self.state = State.WAITING
        self.notified = asyncio.Event()  # news for the claim loop: look now
        self.slot_freed = asyncio.Event()
        # Jobs this worker holds (claimed ahead or running), with their cancel flags.
        self.held: dict[str, threading.Event] = {}
        self.ahead: deque[tuple[ClaimedJob, float]] = deque()  # claimed ahead, and when
        # Mean duration of recent jobs (moving average); prefetch waits for a first measure.
        self.job_seconds = float("inf")
        # Outcomes handed over but not written yet. Such a job stays out of claims and
        # hand-backs until the completer answers: the database may show it as ours, or, its
        # claim lost in a server crash, as pending with the attempt its outcome names.
        self.unwritten: set[str] = set()
        # The delays of jobs snoozed here whose outcome is not written yet, then the moments
        # (monotonic) those jobs are due again once it is: the idle wait ends at the first.
        self._delays: dict[str, float] = {}
        self._due_again: list[float] = []
        # A claim or hand-back failed after it may have committed: check what we hold.
        self.holdings_uncertain = False
        # Cancel requests seen while a claim is on its way: one made just after the claim
        # committed can be heard before the claim's answer, for a job not ours yet.
        self._claim_cancels: set[str] | None = None
        # Observer (`worker.metrics`): each claim's round trip and job count. Must be cheap.
        self.on_claim: Callable[[float, int], None] | None = None

    def _enter(self, state: State) -> None:
        if state not in _MOVES[self.state]:
            raise AssertionError(f"the claim loop cannot go from {self.state} to {state}")
        self.state = state

    # -- the claim loop ---------------------------------------------------------------------

    async def run(self, spec: ClaimSpec) -> None:
        """Claim and start jobs until the worker stops."""
        s = self._settings
        delay = s.poll_min
        while not self._stopping():
            short = self.job_seconds < PREFETCH_BELOW_SECONDS
            ahead = PREFETCH_BATCHES * self._concurrency if short else 0
            free = self._concurrency + ahead - len(self.held) - len(self.executor.stuck)
            # Refill the jobs claimed ahead once they have all started: a claim per batch, not
            # one per slot freed.
            if free <= 0 or self.ahead:
                self._enter(State.AHEAD if self.ahead else State.FULL)
                self.slot_freed.clear()
                await _wait_until_set(self.slot_freed, PREFETCH_HOLD if self.ahead else None)
                if self.ahead and time.monotonic() - self.ahead[0][1] >= PREFETCH_HOLD:
                    self._enter(State.HANDING_BACK)
                    await self.hand_back_ahead(f"no slot freed within {PREFETCH_HOLD} s")
                    # Jobs now last long enough that claiming ahead would only keep them from
                    # other workers: not again until short jobs bring the average down.
                    self.job_seconds = max(self.job_seconds, PREFETCH_HOLD)
                continue
            self._enter(State.CLAIMING)
            self.notified.clear()
            claim_started = time.perf_counter()
            sent = time.monotonic()
            self._claim_cancels = set()
            try:
                if self.holdings_uncertain:
                    await self.release_unrun_holdings()
                jobs = await self._driver.claim(spec, free, list(self._kept()))
            except TRANSIENT as exc:
                # The claim may have committed with its answer lost: check before the next one.
                self.holdings_uncertain = True
                self._claim_cancels = None
                self._patience.failed("claiming jobs", exc, sent)
                # The notifier wakes the loop when it is back: retry at once then.
                self._enter(State.WAITING)
                await _wait_until_set(self.notified, delay)
                delay = next_poll_delay(delay, False, s.poll_min, s.poll_max)
                continue
            self._patience.succeeded(sent)
            if self.on_claim is not None:
                self.on_claim(time.perf_counter() - claim_started, len(jobs))
            self.take(jobs)
            if len(jobs) == free:
                delay = s.poll_min
                continue  # there may be more: claim again as soon as a slot frees
            if jobs:
                delay = s.poll_min
            elif self._drained is not None and not self.held and not self.unwritten:
                self._drained()  # burst: nothing due, nothing of ours in flight
                continue
            wait = self._until_due_again(sent, delay)
            log.debug("idle: next poll in %.3f s", wait)
            self._enter(State.WAITING)
            await _wait_until_set(self.notified, wait)
            delay = next_poll_delay(
                delay, bool(jobs) or self.notified.is_set(), s.poll_min, s.poll_max
            )
        self._enter(State.STOPPED)

    def _until_due_again(self, claimed_at: float, delay: float) -> float:
        """The idle wait: `delay`, or less if a job snoozed here is due again sooner. Jobs due
        before the last claim was sent were that claim's to take: they no longer count."""
        due = self._due_again
        while due and due[0] <= claimed_at:
            heapq.heappop(due)
        return min(delay, max(0.0, due[0] - time.monotonic())) if due else delay

    def take(self, jobs: list[ClaimedJob]) -> None:
        """Hold the jobs a claim returned, and start as many as there are free slots."""
        claimed_at = time.monotonic()
        cancels, self._claim_cancels = self._claim_cancels or set(), None
        for job in jobs:
            self.held[job.id] = threading.Event()  # its cancel flag
            if job.id in cancels:
                self.cancel_requested(job.id)
            self.ahead.append((job, claimed_at))
        self.start_ahead()

    def start_ahead(self) -> None:
        """Start claimed jobs while slots are free."""
        executor = self.executor
        # Slots taken: running attempts and abandoned threads. Counted once: starting a job
        # takes one slot, and nothing else moves while this runs.
        free = self._concurrency - len(executor.tasks) - len(executor.stuck)
        if free <= 0 or not self.ahead or self._stopping():
            return
        ahead, held = self.ahead, self.held
        for _ in range(min(free, len(ahead))):
            job = ahead.popleft()[0]
            # Its flag is set if a cancel request came while the job waited.
            executor.start(job, held[job.id])

    def finished(self, job: ClaimedJob, outcome: Outcome, took: float) -> None:
        """An attempt ended: hand its outcome over, and fill the slot it freed."""
        self.unwritten.add(job.id)
        self.held.pop(job.id, None)
        if outcome.delay is not None and outcome.kind in (OutcomeKind.SNOOZED, OutcomeKind.RETRY):
            self._delays[job.id] = outcome.delay
        self._hand_over(job, outcome)
        average = self.job_seconds
        self.job_seconds = took if average == float("inf") else 0.8 * average + 0.2 * took
        self.start_ahead()
        self.slot_freed.set()

    def freed(self) -> None:
        """A slot is free: start a job claimed ahead, or wake the loop to claim."""
        self.start_ahead()
        self.slot_freed.set()

    def recorded(self, job_ids: list[str]) -> None:
        """The jobs' outcomes are written, or refused as no longer ours: either way they are
        no longer this worker's."""
        self.unwritten.difference_update(job_ids)
        # The write set the job's due time from the server's clock before it answered, so the
        # job is due by the time counted from now.
        now = time.monotonic()
        for job_id in job_ids:
            delay = self._delays.pop(job_id, None)
            if delay is not None:
                heapq.heappush(self._due_again, now + delay)

    def wake(self) -> None:
        """Look for jobs now (news came, or the worker stops)."""
        self.notified.set()
        self.slot_freed.set()

    # -- cancel requests --------------------------------------------------------------------

    def jobs_notified(self, queue: str | None) -> None:
        """A job became due in `queue` (None: news may have been missed, look anyway)."""
        if queue is None or queue in self._queues:
            self.notified.set()

    def cancel_notified(self, job_id: str | None) -> None:
        # None: requests may have been missed; the heartbeat picks those up for held jobs.
        if job_id is not None:
            self.cancel_requested(job_id)

    def cancel_requested(self, job_id: str) -> None:
        flag = self.held.get(job_id)
        if flag is None and self._claim_cancels is not None:
            self._claim_cancels.add(job_id)
        if flag is not None and not flag.is_set():
            job_log.info(
                "job %s cancel requested",
                job_id,
                extra=fields("job.cancel_requested", job_id=job_id),
            )
            flag.set()

    # -- handing back -----------------------------------------------------------------------

    async def release_unrun_holdings(self) -> None:
        """Hand back jobs the database shows as ours that nobody here runs: those of a claim
        whose answer never arrived (the connection broke after the commit), or of a hand-back
        that may not have committed. Our heartbeat would keep the rescuer away from them for as
        long as this worker lives."""
        held = await self._driver.held_jobs(self._id)
        kept = self._kept()
        lost = [job_id for job_id in held if job_id not in kept]
        if lost:
            await self._driver.release(self._id, lost)
            log.warning(
                "%d jobs held by this worker but not run here (a claim or hand-back whose "
                "answer was lost) are back to pending",
                len(lost),
                extra=fields("claim.lost_released", jobs=len(lost)),
            )
        self.holdings_uncertain = False

    async def hand_back_ahead(self, why: str) -> None:
        """Return the jobs claimed ahead to the queue, for another worker to run them sooner.
        Not an attempt."""
        if not self.ahead:
            return
        jobs = [job for job, _ in self.ahead]
        self.ahead.clear()  # out of reach of `start_ahead` while the statement runs
        ids = [job.id for job in jobs]
        for job in jobs:
            self.held.pop(job.id, None)
        try:
            await self._driver.release(self._id, ids)
        except TRANSIENT:
            # It may have committed with its answer lost, so they are not run here: the check
            # before the next claim hands back those still ours.
            self.holdings_uncertain = True
            return
        log.info(
            "%d jobs claimed ahead went back to the queue: %s",
            len(jobs),
            why,
            extra=fields("claim.ahead_returned", jobs=len(jobs), reason=why),
        )

    def _kept(self) -> set[str]:
        """The jobs no claim may take and no check may hand back: those held (claimed ahead
        or running), those with a thread still running, and those whose outcome is on its
        way. A job of the last kind that the database shows as pending may be one whose claim
        a server crash lost: claimed again before the completer answers, its old outcome
        would pass the guard."""
        return self.held.keys() | self.unwritten | self.executor.stuck

    def unfinished(self) -> list[str]:
        """The jobs still held: claimed ahead, running, or with a thread still running."""
        return list(self.held) + list(self.executor.stuck)
