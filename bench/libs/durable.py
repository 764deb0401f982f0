"""durable-worker, measured the way its users run it.

producer : `AsyncClient.enqueue` (single) and `AsyncClient.enqueue_many` (1,000 `JobSpec`s).
worker   : `worker.daemon.Worker` — what `worker run` runs — in its own process, with the
           settings' defaults except the concurrency (10); logging configured as `worker run`
           does, to a file. Variant "warning" logs at WARNING like the peers (Python's default
           level); variant "info" keeps the default `WORKER_LOG_LEVEL=INFO` (a line per job);
           variant "limited" is "warning" with a concurrency limit on the queue far above what
           runs (`worker queue limit default --concurrency 10000`), so every claim takes the
           limited queue's path: its row's lock and the count of its running jobs.
schema   : `worker.db.migrate.upgrade` (= `worker migrate`).
"""

from __future__ import annotations

import asyncio
from typing import Any, Literal

import worker
from bench import harness
from worker import AsyncClient, JobSpec, Pipeline, task
from worker.db import migrate

VERSION = worker.__version__
LOG_LEVELS: dict[str, Literal["WARNING", "INFO"]] = {
    "warning": "WARNING",
    "info": "INFO",
    "limited": "WARNING",
}
GENEROUS_LIMIT = 10_000


@task(name="bench.noop")
async def noop(payload: dict[str, Any]) -> None:
    harness.on_job(payload["i"])


# Three stages, each output persisted in worker.job_stages and read by the next stage.
pipeline = Pipeline("bench.pipeline")


@pipeline.stage
async def first(ctx: Any) -> dict[str, int]:
    harness.on_job(ctx.payload["i"])
    return {"n": 1}


@pipeline.stage
async def second(ctx: Any) -> dict[str, int]:
    return {"n": ctx.outputs["first"]["n"] + 1}


@pipeline.stage
async def third(ctx: Any) -> dict[str, int]:
    return {"n": ctx.outputs["second"]["n"] + 1}


async def install(dsn: str) -> None:
    await asyncio.to_thread(migrate.upgrade, dsn)


async def limit_queue(dsn: str) -> None:
    client = AsyncClient(dsn)
    try:
        await client.limit_queue("default", concurrency=GENEROUS_LIMIT)
    finally:
        await client.close()


class Producer:
    def __init__(self, dsn: str, task_name: str) -> None:
        self.client = AsyncClient(dsn)
        self.task = task_name

    async def enqueue(self, i: int) -> None:
        await self.client.enqueue(self.task, {"i": i})

    async def enqueue_many(self, ids: list[int]) -> None:
        await self.client.enqueue_many([JobSpec(self.task, {"i": i}) for i in ids])

    async def close(self) -> None:
        await self.client.close()


async def open_producer(dsn: str) -> Producer:
    p = Producer(dsn, "bench.noop")
    await p.client.engine.dispose()  # a pool bound to this event loop, opened before the clock
    async with p.client.engine.connect():
        pass
    return p


async def open_pipeline_producer(dsn: str) -> Producer:
    p = await open_producer(dsn)
    p.task = "bench.pipeline"
    return p


# ---- worker side (child process) ----


async def start_worker(dsn: str, concurrency: int, variant: str | None) -> Any:
    from worker.daemon import Worker
    from worker.logs import configure
    from worker.settings import Settings

    level = LOG_LEVELS[variant or "warning"]
    settings = Settings(DATABASE_URL=dsn, WORKER_CONCURRENCY=concurrency, WORKER_LOG_LEVEL=level)
    configure(settings.log_level, settings.log_format)
    worker = Worker(dsn, settings)
    run = asyncio.create_task(worker.run())
    await asyncio.sleep(0)
    return worker, run


async def stop_worker(handle: Any) -> None:
    worker, run = handle
    worker.request_stop()
    await asyncio.wait_for(run, 60)


def adapter(label_suffix: str = "") -> harness.Adapter:
    return harness.Adapter(
        lib="durable",
        label=f"durable-worker {VERSION}{label_suffix}",
        config="worker.daemon.Worker (as `worker run`), concurrency 10, other settings default",
        module="bench.libs.durable",
        install=install,
        open_producer=open_producer,
        single_note="AsyncClient.enqueue (defaults: kept psycopg connections)",
        bulk_note="AsyncClient.enqueue_many, 1000 JobSpecs per call",
        count_jobs_sql="select count(*) from worker.jobs",
        unfinished_sql="select count(*) from worker.jobs where status <> 'completed'",
        succeeded_sql="select count(*) from worker.jobs where status = 'completed'",
        variants={"warning": None, "info": None, "limited": limit_queue},
    )


def pipeline_adapter() -> harness.Adapter:
    a = adapter()
    a.open_producer = open_pipeline_producer
    a.config = "3-stage Pipeline (outputs persisted per stage), concurrency 10"
    return a


# Finished history for the "big table" drain: completed jobs, as a busy queue keeps them for
# the retention period (7 days by default). Two days old: past the day that the console's
# rollup reads once on a database it has not rolled up yet, which a copy of the template is.
FILL_FINISHED = """
INSERT INTO worker.jobs (task, payload, status, result, created_at, started_at, finished_at,
                         run_at, worker_id)
SELECT 'bench.noop', jsonb_build_object('i', g), 'completed', 'null'::jsonb,
       now() - interval '2 days', now() - interval '2 days', now() - interval '2 days',
       now() - interval '2 days', gen_random_uuid()
FROM generate_series(1, %(n)s) AS g
"""
