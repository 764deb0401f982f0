"""Procrastinate, through its documented async API with default settings.

producer : App(PsycopgConnector); task.defer_async(i=...) / task.batch_defer_async(*kwargs)
worker   : app.run_worker_async(concurrency=10) (wait, listen_notify and polling at their
           defaults), stopped by cancelling it, which Procrastinate documents as a graceful stop.
schema   : app.schema_manager.apply_schema_async() on a fresh database.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.metadata
from typing import Any

import procrastinate

from bench import harness

VERSION = importlib.metadata.version("procrastinate")


def make_app(dsn: str) -> procrastinate.App:
    app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=dsn))

    @app.task(name="noop")
    async def noop(i: int) -> None:
        harness.on_job(i)

    return app


async def install(dsn: str) -> None:
    app = make_app(dsn)
    async with app.open_async():
        await app.schema_manager.apply_schema_async()


class Producer:
    def __init__(self, app: procrastinate.App) -> None:
        self.app = app
        self.task = app.tasks["noop"]

    async def enqueue(self, i: int) -> None:
        await self.task.defer_async(i=i)

    async def enqueue_many(self, ids: list[int]) -> None:
        await self.task.batch_defer_async(*({"i": i} for i in ids))

    async def close(self) -> None:
        await self.app.close_async()


async def open_producer(dsn: str) -> Producer:
    app = make_app(dsn)
    await app.open_async()
    return Producer(app)


async def start_worker(dsn: str, concurrency: int, variant: str | None) -> Any:
    app = make_app(dsn)
    await app.open_async()
    run = asyncio.create_task(app.run_worker_async(concurrency=concurrency))
    await asyncio.sleep(0)
    return app, run


async def stop_worker(handle: Any) -> None:
    app, run = handle
    run.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await run
    await app.close_async()


def adapter() -> harness.Adapter:
    return harness.Adapter(
        lib="procrastinate",
        label=f"Procrastinate {VERSION}",
        config="run_worker_async(concurrency=10), other settings default",
        module="bench.libs.procrastinate",
        install=install,
        open_producer=open_producer,
        single_note="Task.defer_async (PsycopgConnector pool, defaults)",
        bulk_note="Task.batch_defer_async, 1000 jobs per call",
        count_jobs_sql="select count(*) from procrastinate_jobs",
        unfinished_sql="select count(*) from procrastinate_jobs where status <> 'succeeded'",
        succeeded_sql="select count(*) from procrastinate_jobs where status = 'succeeded'",
    )
