"""Enqueue on a plain psycopg connection (as Django's is): the job joins that connection's
transaction, and exists if and only if it commits; the client commits nothing of its own.

What other connections see is read from outside, on a fresh connection each time.
"""

from __future__ import annotations

import asyncio

import psycopg
import pytest
from psycopg.rows import dict_row
from support import query

from worker import AsyncClient, Client, JobSpec


def stored(url: str) -> list[tuple[str, str]]:
    """The jobs any other connection (a worker's) can see: task and unique key."""
    return [
        (str(task), str(key))
        for task, key in query(url, "SELECT task, unique_key FROM worker.jobs ORDER BY id")
    ]


def enqueue_three(client: Client, conn: psycopg.Connection) -> list[str]:
    """One job, one with a unique key, and a batch of two: every enqueue path."""
    jobs = [
        client.enqueue("add", {"a": 1, "b": 2}, connection=conn),
        client.enqueue("add", {"a": 1, "b": 2}, unique_key="k1", connection=conn),
        *client.enqueue_many([JobSpec("add", {"a": i, "b": 0}) for i in range(2)], connection=conn),
    ]
    return [j.job_id for j in jobs]


def test_psycopg_transaction_rolled_back_leaves_no_job(database_url):
    client = Client(database_url)
    with psycopg.connect(database_url) as conn:
        enqueue_three(client, conn)
        assert stored(database_url) == []  # not before the caller commits
        conn.rollback()
    assert stored(database_url) == []
    client.close()


def test_psycopg_transaction_committed_makes_its_jobs_visible(database_url):
    client = Client(database_url)
    # A caller's row factory does not change what the client reads back.
    with psycopg.connect(database_url, row_factory=dict_row) as conn:
        ids = enqueue_three(client, conn)
        assert stored(database_url) == []
        conn.commit()
    found = query(database_url, "SELECT id::text FROM worker.jobs ORDER BY id")
    assert sorted(r[0] for r in found) == sorted(ids)
    assert client.get(ids[0]).status == "pending"
    client.close()


def test_psycopg_connection_in_autocommit_writes_each_job_at_once(database_url):
    client = Client(database_url)
    with psycopg.connect(database_url, autocommit=True) as conn:
        client.enqueue("add", {"a": 1, "b": 2}, connection=conn)
        assert len(stored(database_url)) == 1
    client.close()


def test_async_psycopg_transaction_rolls_back_and_commits_with_the_caller(database_url):
    async def main() -> list[str]:
        client = AsyncClient(database_url)
        async with await psycopg.AsyncConnection.connect(database_url) as conn:
            await client.enqueue("add", {"a": 1, "b": 2}, connection=conn)
            await client.enqueue_many([("add", {"a": 2, "b": 2})], connection=conn)
            assert stored(database_url) == []
            await conn.rollback()
            assert stored(database_url) == []
            job = await client.enqueue("add", {"a": 3, "b": 2}, unique_key="k", connection=conn)
            batch = await client.enqueue_many([("add", {"a": 4, "b": 2})], connection=conn)
            assert stored(database_url) == []
            await conn.commit()
        await client.close()
        return [job.job_id, batch[0].job_id]

    ids = asyncio.run(main())
    assert stored(database_url) == [("add", "k"), ("add", "None")]
    found = query(database_url, "SELECT id::text FROM worker.jobs ORDER BY id")
    assert [r[0] for r in found] == ids


def test_psycopg_connection_of_the_other_kind_is_refused_before_anything_is_written(
    database_url,
):
    with (
        psycopg.connect(database_url) as conn,
        pytest.raises(TypeError, match="psycopg AsyncConnection"),
    ):
        asyncio.run(AsyncClient(database_url).enqueue("add", {}, connection=conn))  # type: ignore[arg-type]

    async def blocking_client_given_an_async_connection() -> None:
        async with await psycopg.AsyncConnection.connect(database_url) as conn:
            Client(database_url).enqueue("add", {}, connection=conn)  # type: ignore[arg-type]

    with pytest.raises(TypeError, match="psycopg Connection"):
        asyncio.run(blocking_client_given_an_async_connection())
    assert stored(database_url) == []
