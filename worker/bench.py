"""`worker bench`: what durable-worker does on your database, measured in a few seconds.

Runs in a queue of its own (`bench-<random>`), which no worker of yours listens on, with a
no-op task of its own, so nothing of yours runs and nothing of yours is touched:

1. enqueue, one job per call (`AsyncClient.enqueue`);
2. enqueue in bulk, 1,000 jobs per call (`AsyncClient.enqueue_many`);
3. drain: a worker engine (what `worker run` runs, in this process) works off the queued jobs;
4. latency: on the idle engine, jobs enqueued 20 ms apart; insert → start times.

Every job it made is deleted at the end, whatever happened (Ctrl-C included). The figures are
this machine's and this database's, with producer and worker in one process; the side-by-side
comparison with other queues is `python -m bench` in the source tree.

>>> from worker.bench import BenchResult
>>> BenchResult("drain", 5000, 2.0).rate
2500.0
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import secrets
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from rich.console import Console
from rich.progress import TaskID
from rich.table import Table

from worker.client import AsyncClient, JobSpec
from worker.db import admin
from worker.db.connect import aconnect
from worker.models import Outcome, OutcomeKind
from worker.progress_bar import progress_bar
from worker.retries import DEFAULT_RULES
from worker.settings import Settings
from worker.tasks import Context

BULK_BATCH = 1000
LATENCY_GAP = 0.020
TASK_NAME = "worker.bench.noop"


@dataclass
class BenchResult:
    """One measurement: `jobs` in `seconds`, or latency percentiles in milliseconds."""

    name: str
    jobs: int
    seconds: float
    latencies_ms: list[float] = field(default_factory=list)

    @property
    def rate(self) -> float:
        return self.jobs / self.seconds if self.seconds > 0 else math.inf

    def percentile(self, p: float) -> float:
        """Nearest-rank percentile of the latencies."""
        ordered = sorted(self.latencies_ms)
        return ordered[max(1, math.ceil(p / 100 * len(ordered))) - 1]


class _Noop:
    """The bench's own task: records when each job started, and nothing else."""

    name = TASK_NAME
    timeout: float | None = None
    retries = DEFAULT_RULES
    concurrency: int | None = None

    def __init__(self) -> None:
        self.started: dict[int, float] = {}

    async def execute(self, ctx: Context) -> Outcome:
        self.started[int(ctx.payload["i"])] = time.perf_counter()
        return Outcome(OutcomeKind.COMPLETED)


class Bench:
    """The measurements on one database; `run()` does them all and always cleans up."""

    def __init__(
        self,
        url: str,
        settings: Settings,
        *,
        jobs: int = 5000,
        single_jobs: int = 1000,
        latency_jobs: int = 100,
        concurrency: int = 10,
        console: Console | None = None,
    ) -> None:
        if min(jobs, single_jobs, latency_jobs, concurrency) < 1:
            raise ValueError("jobs, single jobs, latency jobs and concurrency must be at least 1")
        self.url = url
        self.queue = f"bench-{secrets.token_hex(4)}"
        self.settings = settings.model_copy(
            update={"queues": [self.queue], "concurrency": concurrency}
        )
        self.jobs = jobs
        self.single_jobs = single_jobs
        self.latency_jobs = latency_jobs
        self.console = console or Console(stderr=True)
        self.task = _Noop()
        self.results: list[BenchResult] = []
        self._engine_run: asyncio.Task[None] | None = None

    # -- steps ------------------------------------------------------------------------------

    async def _enqueue_single(self, client: AsyncClient, bar: Callable[[int], None]) -> None:
        t0 = time.perf_counter()
        for i in range(self.single_jobs):
            await client.enqueue(TASK_NAME, {"i": i}, queue=self.queue)
            bar(1)
        self.results.append(
            BenchResult("enqueue, 1 job per call", self.single_jobs, time.perf_counter() - t0)
        )

    async def _enqueue_bulk(self, client: AsyncClient, bar: Callable[[int], None]) -> None:
        t0 = time.perf_counter()
        for start in range(0, self.jobs, BULK_BATCH):
            ids = range(start, min(self.jobs, start + BULK_BATCH))
            await client.enqueue_many([JobSpec(TASK_NAME, {"i": i}, self.queue) for i in ids])
            bar(len(ids))
        self.results.append(
            BenchResult("enqueue_many, 1,000 per call", self.jobs, time.perf_counter() - t0)
        )

    async def _unfinished(self, conn: admin.Conn) -> int:
        return await admin.count_unfinished_in(conn, self.queue)

    async def _drain(self, engine: Any, bar: Callable[[int], None]) -> None:
        async with await aconnect(self.url, "durable-worker-bench") as conn:
            queued = await self._unfinished(conn)
            t0 = time.perf_counter()
            run = asyncio.create_task(engine.run(), name="bench-engine")
            done = 0
            while done < queued:
                await asyncio.sleep(0.05)
                if run.done():
                    run.result()  # the engine stopped: say why
                    raise RuntimeError("the worker engine stopped before the queue was drained")
                now_done = queued - await self._unfinished(conn)
                bar(now_done - done)
                done = now_done
            self.results.append(
                BenchResult(
                    f"drain, concurrency {engine.concurrency}", queued, time.perf_counter() - t0
                )
            )
        self._engine_run = run

    async def _latency(self, client: AsyncClient, bar: Callable[[int], None]) -> None:
        self.task.started.clear()
        await asyncio.sleep(0.5)  # the engine is idle and listening
        base = 10_000_000  # ids of their own, apart from the drained jobs'
        sent: dict[int, float] = {}
        t0 = time.perf_counter() + 0.05
        for k in range(self.latency_jobs):
            delay = t0 + k * LATENCY_GAP - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            sent[base + k] = time.perf_counter()
            await client.enqueue(TASK_NAME, {"i": base + k}, queue=self.queue)
        deadline = time.perf_counter() + 30
        while len(self.task.started) < self.latency_jobs and time.perf_counter() < deadline:
            await asyncio.sleep(0.01)
        bar(self.latency_jobs)
        lat = [(self.task.started[i] - t) * 1000 for i, t in sent.items() if i in self.task.started]
        if len(lat) < self.latency_jobs:
            raise RuntimeError(
                f"only {len(lat)} of {self.latency_jobs} latency jobs started within 30 s"
            )
        self.results.append(BenchResult("insert -> start latency", len(lat), 0.0, lat))

    async def cleanup(self) -> int:
        """Delete every job of the bench's queue (their stages and events go with them)."""
        async with await aconnect(self.url, "durable-worker-bench") as conn:
            return await admin.delete_queue(conn, self.queue)

    # -- all of it --------------------------------------------------------------------------

    async def run(self) -> list[BenchResult]:
        from worker.daemon import Worker

        client = AsyncClient(self.url)
        engine = Worker(self.url, self.settings, registry={TASK_NAME: self.task})
        steps: list[tuple[str, int, Callable[[Callable[[int], None]], Awaitable[None]]]] = [
            ("enqueue, 1 per call", self.single_jobs, lambda b: self._enqueue_single(client, b)),
            ("enqueue_many", self.jobs, lambda b: self._enqueue_bulk(client, b)),
            ("drain", self.jobs + self.single_jobs, lambda b: self._drain(engine, b)),
            ("latency", self.latency_jobs, lambda b: self._latency(client, b)),
        ]
        try:
            with progress_bar(self.console, width=26) as progress:
                for title, total, step in steps:
                    tid = progress.add_task(title, total=total)

                    def advance(n: int, tid: TaskID = tid) -> None:
                        progress.advance(tid, n)

                    await step(advance)
        finally:
            engine.request_stop()
            if self._engine_run is not None:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(self._engine_run, 30)
            with contextlib.suppress(Exception):
                await client.engine.dispose()
            removed = await self.cleanup()
            self.console.print(f"removed the {removed} jobs of queue {self.queue}")
        return self.results


def render(results: list[BenchResult]) -> Table:
    """The results as a table (jobs/s, or latency percentiles)."""
    table = Table("measurement", "jobs", "result")
    for r in results:
        if r.latencies_ms:
            text = (
                f"p50 {r.percentile(50):.1f} ms · p95 {r.percentile(95):.1f} ms · "
                f"p99 {r.percentile(99):.1f} ms"
            )
        else:
            text = f"{r.rate:,.0f} jobs/s ({r.seconds:.2f} s)"
        table.add_row(r.name, f"{r.jobs:,}", text)
    return table


def run_bench(url: str, settings: Settings, **options: Any) -> list[BenchResult]:
    """Run `Bench(url, settings, **options)` to the end and return its results."""
    return asyncio.run(Bench(url, settings, **options).run())
