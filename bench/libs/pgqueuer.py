"""PgQueuer, through its documented async API over asyncpg (as in its README).

producer : Queries(AsyncpgDriver(conn)).enqueue("noop", payload)            single
           Queries.enqueue([...entrypoints], [...payloads], [...priorities])  bulk
worker   : PgQueuer(AsyncpgDriver(conn)) with one @entrypoint, pgq.run(...) -- what `pgq run`
           does -- stopped by setting pgq.shutdown (its documented stop event). "Concurrency 10"
           = max_concurrent_tasks=10, the per-worker cap; PgQueuer refuses
           max_concurrent_tasks < 2 * batch_size, hence batch_size=5.
schema   : Queries.install() (= `pgq install`).
"""

from __future__ import annotations

import asyncio
import importlib.metadata
from typing import Any

import asyncpg
from pgqueuer import PgQueuer
from pgqueuer.db import AsyncpgDriver
from pgqueuer.models import Job
from pgqueuer.queries import Queries

from bench import harness

VERSION = importlib.metadata.version("pgqueuer")


async def install(dsn: str) -> None:
    conn = await asyncpg.connect(dsn)
    try:
        await Queries(AsyncpgDriver(conn)).install()
    finally:
        await conn.close()


class Producer:
    def __init__(self, conn: Any) -> None:
        self.conn = conn
        self.q = Queries(AsyncpgDriver(conn))

    async def enqueue(self, i: int) -> None:
        await self.q.enqueue("noop", str(i).encode())

    async def enqueue_many(self, ids: list[int]) -> None:
        k = len(ids)
        await self.q.enqueue(["noop"] * k, [str(i).encode() for i in ids], [0] * k)

    async def close(self) -> None:
        await self.conn.close()


async def open_producer(dsn: str) -> Producer:
    return Producer(await asyncpg.connect(dsn))


async def start_worker(dsn: str, concurrency: int, variant: str | None) -> Any:
    conn = await asyncpg.connect(dsn)
    pgq = PgQueuer(AsyncpgDriver(conn))

    @pgq.entrypoint("noop")
    async def noop(job: Job) -> None:
        harness.on_job(int(job.payload))  # type: ignore[arg-type]

    run = asyncio.create_task(
        pgq.run(batch_size=concurrency // 2, max_concurrent_tasks=concurrency)
    )
    await asyncio.sleep(0)
    return conn, pgq, run


async def stop_worker(handle: Any) -> None:
    conn, pgq, run = handle
    pgq.shutdown.set()
    await asyncio.wait_for(run, 60)
    await conn.close()


def adapter() -> harness.Adapter:
    return harness.Adapter(
        lib="pgqueuer",
        label=f"PgQueuer {VERSION}",
        config="pgq.run(batch_size=5, max_concurrent_tasks=10), other settings default",
        module="bench.libs.pgqueuer",
        install=install,
        open_producer=open_producer,
        single_note="Queries.enqueue on one asyncpg connection (README producer)",
        bulk_note="Queries.enqueue(list, list, list), 1000 jobs per call",
        count_jobs_sql="select count(*) from pgqueuer",
        # finished jobs move from the queue table to pgqueuer_log
        unfinished_sql="select count(*) from pgqueuer",
        succeeded_sql="select count(*) from pgqueuer_log where status = 'successful'",
    )
