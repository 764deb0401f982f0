"""Enqueue inside the caller's transaction: the job exists if and only if it commits.

Each test runs a real worker polling every 0.5 s at most, holds the caller's transaction open
for several polls, and checks from outside that nothing is visible (and nothing ran) before
the commit; then commits (the job runs) or rolls back (no job, no effect, no business row).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import pytest
from sqlalchemy import Connection, create_engine, text
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession, create_async_engine
from sqlalchemy.orm import Session
from support import Processes, query

from worker import AsyncClient, Client, JobSpec
from worker.urls import sqlalchemy_url

HELD_OPEN = 1.5  # three times WORKER_POLL_MAX in the test environment


def visible(url: str) -> dict[str, object]:
    """What any other connection (a worker's) can see."""
    has_effects = query(url, "SELECT to_regclass('effects')")[0][0]
    return {
        "jobs": query(url, "SELECT count(*) FROM worker.jobs")[0][0],
        "orders": query(url, "SELECT count(*) FROM orders")[0][0],
        "effects": query(url, "SELECT count(*) FROM effects")[0][0] if has_effects else 0,
    }


NOTHING = {"jobs": 0, "orders": 0, "effects": 0}


@pytest.fixture
def shop(database_url: str, env, processes: Processes) -> Iterator[str]:
    """The test database with a business table, and a worker running."""
    query(database_url, "CREATE TABLE orders (id int PRIMARY KEY)")
    processes.worker(env, "testtasks")
    yield database_url


def business(order: int) -> str:
    return f"INSERT INTO orders (id) VALUES ({order})"


# -- blocking: Connection and Session -----------------------------------------------------


@pytest.mark.parametrize("kind", ["Connection", "Session"])
def test_job_enqueued_in_a_rolled_back_transaction_never_exists(shop, kind):
    engine = create_engine(sqlalchemy_url(shop))
    client = Client(shop)
    target: Connection | Session
    with engine.connect() as conn, Session(engine) as session:
        target = conn if kind == "Connection" else session
        target.execute(text(business(1)))
        client.enqueue("effect", {"key": "rolled-back"}, connection=target)
        client.enqueue_many(
            [JobSpec("effect", {"key": f"many-{i}"}) for i in range(3)], connection=target
        )
        time.sleep(HELD_OPEN)
        assert visible(shop) == NOTHING
        target.rollback()
    time.sleep(HELD_OPEN)
    assert visible(shop) == NOTHING
    engine.dispose()


@pytest.mark.parametrize("kind", ["Connection", "Session"])
def test_job_enqueued_in_a_committed_transaction_runs_after_the_commit(shop, kind):
    engine = create_engine(sqlalchemy_url(shop))
    client = Client(shop)
    with engine.connect() as conn, Session(engine) as session:
        target = conn if kind == "Connection" else session
        target.execute(text(business(1)))
        job = client.enqueue("effect", {"key": "committed"}, connection=target)
        time.sleep(HELD_OPEN)
        assert visible(shop) == NOTHING  # no worker sees the job before the commit
        committed_at = time.time()
        target.commit()
    assert job.wait_sync(timeout=30) == "done"
    assert visible(shop) == {"jobs": 1, "orders": 1, "effects": 1}
    assert job.started_at is not None and job.started_at.timestamp() >= committed_at - 0.5
    engine.dispose()


# -- asyncio: AsyncConnection and AsyncSession, on psycopg and on asyncpg -------------------

ASYNC_KINDS = [
    ("AsyncConnection", "psycopg"),
    ("AsyncSession", "psycopg"),
    ("AsyncConnection", "asyncpg"),
    ("AsyncSession", "asyncpg"),
]


def async_url(url: str, driver: str) -> str:
    return sqlalchemy_url(url).replace("+psycopg", f"+{driver}")


@pytest.mark.parametrize(("kind", "driver"), ASYNC_KINDS)
def test_async_enqueue_rolls_back_and_commits_with_the_callers_transaction(shop, kind, driver):
    async def main() -> None:
        engine = create_async_engine(async_url(shop, driver))
        client = AsyncClient(shop)
        for outcome in ("rollback", "commit"):
            async with engine.connect() as conn, AsyncSession(engine) as session:
                target: AsyncConnection | AsyncSession = (
                    conn if kind == "AsyncConnection" else session
                )
                await target.execute(text(business(1)))
                job = await client.enqueue("effect", {"key": outcome}, connection=target)
                many = await client.enqueue_many(
                    [("effect", {"key": f"{outcome}-{i}"}) for i in range(2)], connection=target
                )
                await asyncio.sleep(HELD_OPEN)
                assert visible(shop) == NOTHING
                if outcome == "rollback":
                    await target.rollback()
                    await asyncio.sleep(HELD_OPEN)
                    assert visible(shop) == NOTHING
                else:
                    await target.commit()
        assert [await j.wait(timeout=30) for j in [job, *many]] == ["done"] * 3
        assert visible(shop) == {"jobs": 3, "orders": 1, "effects": 3}
        await engine.dispose()
        await client.engine.dispose()

    asyncio.run(main())


def test_connection_of_the_wrong_kind_is_refused_before_anything_is_written(database_url):
    engine = create_engine(sqlalchemy_url(database_url))
    with (
        engine.connect() as conn,
        pytest.raises(TypeError, match="AsyncConnection or AsyncSession"),
    ):
        asyncio.run(AsyncClient(database_url).enqueue("add", {}, connection=conn))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="Connection or Session"):
        Client(database_url).enqueue("add", {}, connection=object())  # type: ignore[arg-type]
    assert query(database_url, "SELECT count(*) FROM worker.jobs") == [(0,)]
    engine.dispose()
