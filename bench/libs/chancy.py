"""Chancy, through its documented async API.

producer : Chancy(dsn).push(job.job.with_kwargs(i=...))                    single
           Chancy.push_many([...], batch_size=1000) (one transaction per 1000) bulk
worker   : chancy.Worker(chancy).start() ... worker.stop(), Worker defaults. The queue is
           declared as Queue("default", concurrency=10, executor=Async, eager_polling=True):
           the Async executor because the job is an `async def` like the other libraries'
           (Chancy's default is a process pool), and eager polling because with the default a
           pre-filled queue drains at about concurrency / 5 s (METHOD.md, caveat 1).
logging  : a WARNING-level logger, like the other libraries (Chancy's default logs every job).
schema   : chancy.migrate() on a fresh database.
"""

from __future__ import annotations

import importlib.metadata
import logging
from typing import Any

from chancy import Chancy, Queue, Worker, job

from bench import harness

VERSION = importlib.metadata.version("chancy")

_log = logging.getLogger("bench.chancy")
_log.setLevel(logging.WARNING)


@job()
async def noop(i: int) -> None:
    harness.on_job(i)


def make(dsn: str) -> Chancy:
    return Chancy(dsn, log=_log)


async def install(dsn: str) -> None:
    async with make(dsn) as chancy:
        await chancy.migrate()
        await chancy.declare(
            Queue(
                "default",
                concurrency=harness.CONCURRENCY,
                executor=Chancy.Executor.Async,
                eager_polling=True,
            ),
            upsert=True,
        )


class Producer:
    def __init__(self, chancy: Chancy) -> None:
        self.chancy = chancy

    async def enqueue(self, i: int) -> None:
        await self.chancy.push(noop.job.with_kwargs(i=i))

    async def enqueue_many(self, ids: list[int]) -> None:
        jobs = [noop.job.with_kwargs(i=i) for i in ids]
        async for _refs in self.chancy.push_many(jobs, batch_size=harness.BULK_BATCH):
            pass

    async def close(self) -> None:
        await self.chancy.__aexit__(None, None, None)


async def open_producer(dsn: str) -> Producer:
    chancy = make(dsn)
    await chancy.__aenter__()
    return Producer(chancy)


async def start_worker(dsn: str, concurrency: int, variant: str | None) -> Any:
    chancy = make(dsn)
    await chancy.__aenter__()
    worker = Worker(chancy)
    await worker.start()
    return chancy, worker


async def stop_worker(handle: Any) -> None:
    chancy, worker = handle
    await worker.stop()
    await chancy.__aexit__(None, None, None)


def adapter() -> harness.Adapter:
    return harness.Adapter(
        lib="chancy",
        label=f"Chancy {VERSION}",
        config="Queue(concurrency=10, executor=Async, eager_polling=True), Worker defaults",
        module="bench.libs.chancy",
        install=install,
        open_producer=open_producer,
        single_note="Chancy.push (Chancy psycopg pool, defaults)",
        bulk_note="Chancy.push_many(jobs, batch_size=1000)",
        count_jobs_sql="select count(*) from chancy_jobs",
        unfinished_sql="select count(*) from chancy_jobs where state <> 'succeeded'",
        succeeded_sql="select count(*) from chancy_jobs where state = 'succeeded'",
    )
