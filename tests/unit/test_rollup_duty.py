"""The console's rollup duty runs in every worker, on whichever driver it has (no database)."""

from __future__ import annotations

import asyncio
import logging

import psycopg
import pytest

from worker.daemon import Worker
from worker.daemon.plugins.rollup import Rollup
from worker.db.memory import MemoryDriver
from worker.events import MemoryBus
from worker.settings import Settings
from worker.stages.pipeline import Pipeline

URL = "postgresql://nobody@127.0.0.1:1/none"  # never connected to: the memory driver answers


def flow() -> Pipeline:
    pipeline = Pipeline("unit_flow")

    @pipeline.stage
    def fetch(ctx: object) -> int:
        return 1

    @pipeline.stage(rule="all_done")
    def tidy(ctx: object) -> None:
        return None

    return pipeline


def test_a_worker_publishes_its_pipelines_and_takes_its_rollup_turn_on_any_driver() -> None:
    driver = MemoryDriver()
    settings = Settings(DATABASE_URL=URL, WORKER_RETENTION_ENABLED=False)

    async def main() -> None:
        worker = Worker(
            URL, settings, registry={"unit_flow": flow()}, bus=MemoryBus(), driver=driver
        )
        run = asyncio.create_task(worker.run())
        try:
            async with asyncio.timeout(5):
                while driver.rollups == 0:
                    await asyncio.sleep(0.01)
        finally:
            worker.request_stop()
            await asyncio.wait_for(run, 10)

    asyncio.run(main())
    assert driver.stage_plans == {"unit_flow": (["fetch"], ["tidy"])}


class _Unmigrated(MemoryDriver):
    """A database one migration behind the workers: the rollup's table is not there."""

    async def roll_up(self) -> bool:
        raise psycopg.errors.UndefinedTable('relation "worker.job_rollups" does not exist')


def test_a_database_without_the_rollup_s_table_is_said_once_and_jobs_still_run(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def main() -> None:
        rollup = asyncio.create_task(Rollup(_Unmigrated(), {}, interval=0.001).run())
        await asyncio.sleep(0.2)
        assert not rollup.done()  # the duty goes on: an ended duty would stop the worker
        rollup.cancel()

    with caplog.at_level(logging.DEBUG, logger="worker.daemon"):
        asyncio.run(main())
    said = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(said) == 1 and "worker migrate" in said[0].getMessage()
