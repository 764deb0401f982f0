"""The worker: its named parts wired together, run until stopped, and shut down cleanly.

A `Worker` holds one asyncio loop's worth of parts, all talking to one `Driver`:

- the local queue (`local_queue`): the claim loop, claim-ahead and hand-back;
- the executor (`executor`): attempts, their timeouts and thread slots;
- the completer (`completer`): outcomes, written in batches;
- the stage store (`stage_store`): a pipeline's bookkeeping, for the stage runner;
- the plugins (`plugins`): heartbeat, rescuer, retention, the scheduler of periodic tasks;
- the progress bus, and the driver's notifications (new jobs, cancel requests).

A stop (`request_stop`, SIGTERM in `worker run`) stops claiming, hands back the jobs claimed
ahead, gives running jobs `WORKER_SHUTDOWN_GRACE` seconds, writes what they did, hands back
what is left and deregisters. A duty (the completer, a plugin) that fails stops the worker
loudly (`DutyFailed`) rather than leave it claiming jobs whose outcomes it cannot write.

What this does not do: it does not decide how one attempt runs (`executor`, `worker.stages`)
nor what a claim takes (`worker.db.sql.claim`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from worker.daemon.completer import Completer
from worker.daemon.db import Patience
from worker.daemon.executor import Executor
from worker.daemon.local_queue import LocalQueue, claim_spec
from worker.daemon.plugins import Heartbeat, Plugin, Rescuer, Retention, Scheduler
from worker.daemon.plugins.rollup import Rollup, task_limits
from worker.daemon.stage_store import DaemonStageStore
from worker.db.driver import Closable, Driver, RecordedOutcome, Registration
from worker.db.errors import TRANSIENT, describe
from worker.db.postgres import PostgresDriver
from worker.events import PostgresBus, ProgressBus
from worker.logs import fields, first_line, log_info
from worker.middleware import MIDDLEWARE
from worker.models import JobStatus
from worker.schedules import SCHEDULES
from worker.settings import Settings
from worker.tasks import REGISTRY, Executable

log = logging.getLogger("worker.daemon")
job_log = logging.getLogger("worker.jobs")
# An outcome's event and words: a job back to pending is a retry after a failed attempt, or a
# snooze. A retry's or a failure's line also says why.
_OUTCOME_EVENT = {s: "job.requeued" if s == JobStatus.PENDING else f"job.{s}" for s in JobStatus}
_OUTCOME_WORDS = {s: "back to pending" if s == JobStatus.PENDING else str(s) for s in JobStatus}
_SAY_WHY = frozenset({JobStatus.PENDING, JobStatus.FAILED})


class DutyFailed(Exception):
    """One of the worker's own tasks (writing outcomes, the heartbeat, the rescuer,
    retention) failed on something retrying cannot mend. The worker stopped, rather
    than go on claiming jobs whose outcomes it could not write."""


class Worker:
    """A worker process's engine. `worker run` builds one and runs it until SIGTERM.

    >>> worker = Worker(url, settings)          # doctest: +SKIP
    >>> asyncio.run(worker.run())               # doctest: +SKIP

    `middleware` runs around each attempt (`worker.middleware`); by default, the process's
    registered middleware, read at each attempt, so a module may register it after this.
    """

    def __init__(
        self,
        url: str,
        settings: Settings,
        *,
        registry: Mapping[str, Executable] = REGISTRY,
        bus: ProgressBus | None = None,
        driver: Driver | None = None,
        middleware: Sequence[object] = MIDDLEWARE,
        schedules: bool = True,
        burst: bool = False,
    ) -> None:
        self.url = url
        self.settings = settings
        self.id = uuid.uuid4()
        # The tasks registered now are the ones it serves, as its row will say: a task
        # registered later is claimed by a worker built after it.
        self.registry = dict(registry)
        self.queues = list(settings.queues)
        self.concurrency = settings.concurrency
        self.bus: ProgressBus = bus if bus is not None else PostgresBus(url)
        self.driver: Driver = driver or PostgresDriver(url, settings.concurrency)
        self._stop = asyncio.Event()
        self._patience = Patience(self._stop.is_set, self.driver.confirm_reachable)
        self.store = DaemonStageStore(self.driver, self._patience, self.id)
        self.processed = 0
        # Whether it fires the periodic tasks of its registry (`worker.testing.drain` turns
        # that off), and, set once its scheduler first fired what was due (or it has none).
        self.schedules = schedules
        self.ticks_fired = asyncio.Event()
        self._completer = Completer(
            self.driver, self.id, settings, self._patience, self.bus.publish, self._recorded
        )
        self._local = LocalQueue(
            self.driver,
            self.id,
            self.queues,
            settings,
            self._patience,
            self._stop.is_set,
            self._completer.add,
            drained=self._drained if burst else None,
        )
        self._executor = Executor(
            self.registry, settings, self, self._local.finished, self._local.freed, middleware
        )
        self._local.executor = self._executor
        self._failure: DutyFailed | None = None
        self._subscriptions: list[Closable] = []
        # Observer (`worker.metrics`): called on the event loop with each batch of recorded
        # outcomes. It must be cheap.
        self.on_recorded: Callable[[list[RecordedOutcome]], None] | None = None

    @property
    def on_claim(self) -> Callable[[float, int], None] | None:
        """Observer (`worker.metrics`): each claim's round trip and job count. Must be cheap."""
        return self._local.on_claim

    @on_claim.setter
    def on_claim(self, hook: Callable[[float, int], None] | None) -> None:
        self._local.on_claim = hook

    # -- Runtime, as seen by running jobs ---------------------------------------------------

    async def in_thread(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Run blocking user code in the pool, counting the thread against its job's slot."""
        return await self._executor.in_thread(fn, *args)

    # -- lifecycle --------------------------------------------------------------------------

    def request_stop(self) -> None:
        """Stop claiming; running jobs get `WORKER_SHUTDOWN_GRACE` seconds to finish."""
        if not self._stop.is_set():
            running = len(self._executor.tasks)
            log.info(
                "worker %s stopping: no new jobs; waiting for %d running",
                self.id,
                running,
                extra=fields("worker.stopping", worker_id=self.id, running=running),
            )
        self._stop.set()
        self._local.wake()

    def _drained(self) -> None:
        """Burst mode: no due job is left in its queues and none of its jobs runs: stop."""
        log.info(
            "worker %s: no due job left in its queues (burst)",
            self.id,
            extra=fields("worker.drained", worker_id=self.id),
        )
        self.request_stop()

    async def run(self) -> None:
        spec = claim_spec(self.id, self.queues, self.settings, self.registry)
        registration = Registration(
            self.id,
            socket.gethostname(),
            os.getpid(),
            self.queues,
            self.concurrency,
            spec.tasks,
            self.settings.lease_seconds,
            self.driver.liveness_key,
        )
        await self.driver.open()
        await self._patience.run(
            "registering the worker", lambda: self.driver.register_worker(registration)
        )
        heartbeat = Heartbeat(
            self.driver, registration, self.settings.lease_seconds, self._local.cancel_requested
        )
        await heartbeat.beat()
        await self.bus.start()
        plugins: list[Plugin] = [
            heartbeat,
            Rescuer(self.driver, heartbeat, self.settings.lease_seconds),
        ]
        if self.settings.retention_enabled:
            plugins.append(Retention(self.driver, self.settings))
        limits = task_limits(self.registry, self.settings.max_retries)
        plugins.append(Rollup(self.driver, self.registry, limits=limits))
        schedules = [s for s in SCHEDULES.values() if s.task in self.registry]
        if schedules and self.schedules:
            plugins.append(Scheduler(self.driver, schedules, fired=self.ticks_fired))
        else:
            self.ticks_fired.set()
        duties = [
            asyncio.create_task(self._completer.run(), name="completer"),
            asyncio.create_task(self.store.run(), name="stage writes"),
            *(asyncio.create_task(plugin.run(), name=plugin.name) for plugin in plugins),
        ]
        # New jobs wake the claim loop at once; cancel requests reach held jobs.
        self._subscriptions = [
            self.driver.subscribe("worker_jobs", self._local.jobs_notified),
            self.driver.subscribe("worker_cancel", self._local.cancel_notified),
        ]
        for duty in duties:
            duty.add_done_callback(self._duty_ended)
        log.info(
            "worker %s started: queues %s, concurrency %d, tasks %s",
            self.id,
            ",".join(self.queues),
            self.concurrency,
            ", ".join(sorted(self.registry)) or "none",
            extra=fields(
                "worker.started",
                worker_id=self.id,
                queues=self.queues,
                concurrency=self.concurrency,
                tasks=sorted(self.registry),
            ),
        )
        try:
            await self._local.run(spec)
        finally:
            await self._shutdown(duties)
        if self._failure is not None:
            raise self._failure

    def _duty_ended(self, duty: asyncio.Task[Any]) -> None:
        """A duty runs until the shutdown cancels it: one that ended on an error stops the
        worker, loudly, instead of leaving it claiming jobs nobody finishes."""
        exc = None if duty.cancelled() else duty.exception()
        if exc is None:
            return
        error = describe(exc)
        if self._failure is None:
            self._failure = DutyFailed(f"the worker's {duty.get_name()} failed: {error}")
        log.error(
            "the worker's %s failed: %s; the worker stops",
            duty.get_name(),
            error,
            exc_info=exc,
            extra=fields("worker.duty_failed", duty=duty.get_name(), error=error),
        )
        self.request_stop()

    async def _shutdown(self, duties: list[asyncio.Task[Any]]) -> None:
        local, completer = self._local, self._completer
        with contextlib.suppress(*TRANSIENT, TimeoutError):  # what is left goes by release below
            await asyncio.wait_for(local.hand_back_ahead("the worker stops"), 10)
        await self._executor.stop(self.settings.shutdown_grace, local.held)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(completer.drain(), 30)
        if completer.pending:
            log.warning(
                "%d job outcomes not written (the database stayed unreachable for 30 s, their "
                "rows stay locked by another client, or writing them failed); those jobs will "
                "be rescued and run again",
                completer.pending,
                extra=fields("worker.outcomes_unwritten", jobs=completer.pending),
            )
        unfinished = local.unfinished()
        # After an outage, the pool's sessions from before it are replaced first: the oldest
        # idle one goes out next, and it would fail these last statements.
        await self._patience.confirmed(10)
        with contextlib.suppress(*TRANSIENT, TimeoutError):
            if local.holdings_uncertain:  # a claim or hand-back answer lost before the stop
                await asyncio.wait_for(local.release_unrun_holdings(), 10)
            if unfinished:
                await asyncio.wait_for(self.driver.release(self.id, unfinished), 10)
            await asyncio.wait_for(self.driver.deregister_worker(self.id), 10)
        for subscription in self._subscriptions:
            subscription.close()
        for task in duties:
            task.cancel()
        await asyncio.gather(*duties, return_exceptions=True)
        await self.bus.aclose()
        await self._patience.close()
        await self.driver.close()
        self._executor.close()
        log.info(
            "worker %s stopped after %d jobs",
            self.id,
            self.processed,
            extra=fields("worker.stopped", worker_id=self.id, processed=self.processed),
        )

    def _recorded(self, rows: list[RecordedOutcome], refused: list[str]) -> None:
        # Each job's line goes out before the job is released to the claim loop: until then no
        # claim of this worker takes it, so its next start is never logged before its outcome.
        self._log_outcomes(rows)
        self._local.recorded([row.id for row in rows] + refused)
        self.processed += len(rows)
        if self.on_recorded is not None:
            self.on_recorded(rows)

    def _log_outcomes(self, rows: list[RecordedOutcome]) -> None:
        """One line per outcome written, from the write's answer."""
        if not job_log.isEnabledFor(logging.INFO):
            return
        for row in rows:
            # A retry's or a failure's line says why: its error's first line (for an exception,
            # its type and message), cut from the text only here, where it is logged.
            why = first_line(row.error) if row.error is not None and row.status in _SAY_WHY else ""
            log_info(
                job_log,
                _OUTCOME_EVENT[row.status],
                "job %s (%s) %s after %.3f s (queue %s, retries %d)%s",
                row.id,
                row.task,
                _OUTCOME_WORDS[row.status],
                row.duration or 0.0,
                row.queue,
                row.retry_count,
                f": {why}" if why else "",
                job_id=row.id,
                task=row.task,
                queue=row.queue,
                status=row.status,
                duration=round(float(row.duration or 0.0), 6),
                retry_count=row.retry_count,
                **({"error": why} if why else {}),
            )
