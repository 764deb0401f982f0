"""`drain`: run the due jobs in this process with the real worker, then stop it.

A test enqueues, calls `drain()`, and asserts on the jobs it gets back, with no `worker run`
process beside it. The worker is the daemon's own `Worker` on the real database, running the
tasks registered in this process (`worker.tasks.REGISTRY`), so side effects the tasks leave in
memory are visible to the test. `drain` polls the database until none of its queues holds a
due pending job and the worker holds none; a job snoozing or retrying later, or paused for an
answer, is not waited for.

`crash_after=stage` loses the attempt that completes `stage` as a killed worker loses it: the
stage's completion is committed, then the worker's registration is deleted and the rescue
statement (`sql.RESCUE`) takes its jobs back, counting the attempt, and the attempt is
cancelled before it writes anything more. The next `drain` runs what a recovering worker runs:
the cleanup the lost attempt owed, then the rest of the job.

Periodic tasks are not fired unless asked for (`schedules=True`): a test's registered task
with a `cron` or `every` would otherwise add its jobs to what a drain returns whenever a tick
comes. Asked for, the ticks due when the drain starts are fired before it looks for work.

What this does not do: it does not stop the threads of sync code still running when a drain
times out or crashes (Python cannot), and it does not wait for jobs of other workers.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from worker.client import AsyncClient, Client, Job, JobNotFound, default_client
from worker.daemon.db import Patience
from worker.daemon.plugins.heartbeat import SESSION_GRACE
from worker.daemon.stage_store import DaemonStageStore
from worker.daemon.worker import Worker
from worker.db import admin
from worker.db.driver import RecordedOutcome, StageWrite
from worker.db.embedded import database_url
from worker.models import StageStatus
from worker.settings import Settings, get_settings
from worker.stages import Pipeline
from worker.tasks import REGISTRY, Executable
from worker.urls import psycopg_url

T = TypeVar("T")

# How often the database is asked whether anything is left: often enough that a drain ends
# soon after its last job, rarely enough to leave the worker the connections it needs.
POLL_SECONDS = 0.02


class NoCrash(RuntimeError):
    """`drain(crash_after=stage)` ended without any job completing `stage`."""


def check_crash_point(stage: str, registry: Mapping[str, Executable]) -> None:
    """Refuse a `crash_after` stage that no registered pipeline can crash after, naming why."""
    pipelines = [entry for entry in registry.values() if isinstance(entry, Pipeline)]
    last_only = []
    for pipeline in pipelines:
        mains = [s.name for s in pipeline.main_stages]
        if stage in mains[:-1] or stage in {s.name for s in pipeline.cleanups}:
            return
        if stage in mains:
            if pipeline.cleanups:
                return
            last_only.append(pipeline.name)
    if last_only:
        raise ValueError(
            f"crash_after={stage!r}: it is the last stage of {', '.join(last_only)}, which has "
            "no cleanup, so its completion is the job's outcome: no attempt is left to lose"
        )
    names = ", ".join(sorted(p.name for p in pipelines)) or "none"
    raise ValueError(
        f"crash_after={stage!r}: no registered pipeline has a stage of that name "
        f"(pipelines: {names})"
    )


class _CrashingStore(DaemonStageStore):
    """The daemon's stage store, losing the attempt once a write records `stage` completed."""

    def __init__(self, worker: _DrainWorker, patience: Patience, stage: str) -> None:
        super().__init__(worker.driver, patience, worker.id)
        self._worker = worker
        self._stage = stage

    async def _run(self, doing: str, write: StageWrite) -> float:
        age = await super()._run(doing, write)
        if write.ended == self._stage and write.status is StageStatus.COMPLETED:
            await self._worker.crash(write.job_id)
        return age


class _DrainWorker(Worker):
    """The daemon's worker, noting the jobs whose outcomes it writes, and able to crash."""

    def __init__(
        self, url: str, settings: Settings, crash_after: str | None, schedules: bool
    ) -> None:
        super().__init__(url, settings, schedules=schedules)
        self.ran: dict[str, None] = {}  # job ids, in the order of their last outcome write
        self.crashed: str | None = None
        self.crash_done = asyncio.Event()
        self.on_recorded = self._note
        if crash_after is not None:
            self.store = _CrashingStore(self, self._patience, crash_after)

    def _note(self, rows: list[RecordedOutcome]) -> None:
        for row in rows:
            self.ran.pop(row.id, None)
            self.ran[row.id] = None

    async def crash(self, job_id: str) -> None:
        """Lose this attempt and every job the worker holds, as a kill would; never returns."""
        if self.crashed is None:
            self.crashed = job_id
            # Gone from `worker.workers`, the worker claims nothing more, and the rescue takes
            # back each job it holds as it would a dead worker's: pending, the attempt counted.
            await self.driver.deregister_worker(self.id)
            await self.driver.rescue(self.settings.lease_seconds, SESSION_GRACE, lambda: True)
            self.ran.pop(job_id, None)
            self.ran[job_id] = None
            self.crash_done.set()
            self.request_stop()
        await asyncio.Event().wait()  # the stop cancels the attempt here: it writes no more


async def drain_ids(
    timeout: float,
    url: str | None,
    queues: Iterable[str] | None,
    crash_after: str | None,
    schedules: bool = False,
) -> list[str]:
    """Run the worker until nothing due is left (or its crash); the ids of the jobs it ran."""
    settings = get_settings()
    target = psycopg_url(url) if url else database_url(settings)
    # No grace at the stop: a drain stops when nothing runs, or on a timeout or crash, when
    # what still runs is handed back (or was rescued) anyway.
    update: dict[str, Any] = {"shutdown_grace": 0.0}
    if queues is not None:
        update["queues"] = list(queues)
        if not update["queues"]:
            raise ValueError("drain(queues=...) must name at least one queue")
    if crash_after is not None:
        check_crash_point(crash_after, REGISTRY)
        update["concurrency"] = 1  # the crash then loses that job's attempt alone
    settings = settings.model_copy(update=update)
    worker = _DrainWorker(target, settings, crash_after, schedules)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    running = asyncio.create_task(worker.run(), name="drain")
    try:
        async with admin.opened(target, "durable-worker-drain") as conn:
            while not running.done() and not worker.crash_done.is_set():
                left = await admin.left_to_run(
                    conn, settings.queues, list(worker.registry), worker.id
                )
                # With schedules, the jobs of the ticks due at the start count as work too.
                if not left.due and not left.held and worker.ticks_fired.is_set():
                    break
                if loop.time() >= deadline:
                    raise TimeoutError(f"drain: {left} after {timeout} s")
                await asyncio.sleep(POLL_SECONDS)
    finally:
        worker.request_stop()
        await running  # a worker that failed (`DutyFailed`) fails the drain
    if crash_after is not None and worker.crashed is None:
        raise NoCrash(f"drain(crash_after={crash_after!r}): no job completed that stage")
    return list(worker.ran)


async def drain_async(
    timeout: float = 10.0,
    *,
    url: str | None = None,
    queues: Iterable[str] | None = None,
    crash_after: str | None = None,
    schedules: bool = False,
) -> list[Job]:
    """The async `drain`, for tests that run on an event loop.

    >>> jobs = await drain_async()               # doctest: +SKIP
    """
    ids = await drain_ids(timeout, url, queues, crash_after, schedules)
    client = AsyncClient(url)
    try:
        jobs = []
        for job_id in ids:
            try:
                jobs.append(await client.get(job_id))
            except JobNotFound:  # deleted meanwhile, by the test or by retention
                continue
        return jobs
    finally:
        await client.close()


def drain(
    timeout: float = 10.0,
    *,
    url: str | None = None,
    queues: Iterable[str] | None = None,
    crash_after: str | None = None,
    schedules: bool = False,
) -> list[Job]:
    """Run every due job of `queues` in this process until none is left; their final handles.

    The jobs come in the order their outcomes were written (a job written twice, a retry then
    its success, where it finished); a job the crash lost comes last, `pending` again. The
    database is `url`, else `DATABASE_URL` (which `worker_database` sets); the queues are
    `queues`, else `WORKER_QUEUES`. Raises `TimeoutError` saying how many jobs are left if
    they are not done within `timeout` seconds, and `NoCrash` if `crash_after` names a stage
    no job completed. Periodic tasks fire only with `schedules=True` (their ticks due at the
    start first). Called on a running event loop, it runs its own in a thread.

    >>> job = enqueue("resize", {"image": "cat.png"})   # doctest: +SKIP
    >>> [done] = drain()                                # doctest: +SKIP
    >>> done.result                                     # doctest: +SKIP
    {'thumbnail': 'cat.png.thumb.webp'}
    """
    jobs = _run(
        drain_async(timeout, url=url, queues=queues, crash_after=crash_after, schedules=schedules)
    )
    client = Client(url) if url else default_client()
    for job in jobs:
        job.client = client  # read again, waited on and cancelled without an event loop
    return jobs


def _run(coro: Coroutine[Any, Any, T]) -> T:
    """Run `coro` to its end, on a loop of its own in a thread if this one runs a loop."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    with ThreadPoolExecutor(1, thread_name_prefix="worker-drain") as pool:
        return pool.submit(asyncio.run, coro).result()
