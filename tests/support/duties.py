"""Running a duty of the daemon outside a worker: the duty as a worker runs it, on the
PostgreSQL driver a worker makes, so a test sees what a running fleet would write.

What this does not do: it starts no claim loop and registers no worker.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping

from worker.daemon.plugins.rollup import Rollup
from worker.db.postgres import PostgresDriver
from worker.tasks import Executable


def roll_up(
    url: str, registry: Mapping[str, Executable] | None = None, times: int = 1
) -> list[bool]:
    """Run the rollup duty `times` in a row on the database at `url`; each run's answer (False:
    another worker had the turn)."""

    async def run() -> list[bool]:
        driver = PostgresDriver(url)
        await driver.open()
        try:
            rollup = Rollup(driver, registry or {})
            return [await rollup.once() for _ in range(times)]
        finally:
            await driver.close()

    return asyncio.run(run())
