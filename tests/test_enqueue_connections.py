"""Enqueue outside a caller's transaction: kept connections, a dead one replaced without an
error reaching the caller, never a job written twice, and time-ordered (UUIDv7) ids."""

from __future__ import annotations

import asyncio
import json
import time
import uuid

import psycopg
from support import query

from worker import AsyncClient, Client, JobSpec
from worker.db import sql
from worker.db.direct import APPLICATION_NAME


def kill_client_connections(url: str) -> int:
    """What a server restart does to a client's kept connections: the server ends them."""
    (killed,) = query(
        url,
        "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
        "WHERE application_name = %s AND pid <> pg_backend_pid()",
        (APPLICATION_NAME,),
    )
    return int(killed[0])  # type: ignore[call-overload]


def stored_ids(url: str) -> list[str]:
    return [str(r[0]) for r in query(url, "SELECT id FROM worker.jobs ORDER BY id")]


def test_enqueue_on_a_connection_the_server_ended_succeeds_and_writes_the_job_once(
    database_url,
):
    client = Client(database_url)
    first = client.enqueue("add", {"a": 1})
    assert kill_client_connections(database_url) == 1
    second = client.enqueue("add", {"a": 2})
    assert kill_client_connections(database_url) == 1
    batch = client.enqueue_many([("add", {"a": i}) for i in range(3, 6)])
    client.close()
    expected = [first.job_id, second.job_id, *(j.job_id for j in batch)]
    assert sorted(stored_ids(database_url)) == sorted(expected)


def test_async_enqueue_on_a_connection_the_server_ended_succeeds_and_writes_the_job_once(
    database_url,
):
    async def main() -> list[str]:
        client = AsyncClient(database_url)
        first = await client.enqueue("add", {"a": 1})
        assert kill_client_connections(database_url) == 1
        second = await client.enqueue("add", {"a": 2})
        assert kill_client_connections(database_url) == 1
        batch = await client.enqueue_many([JobSpec("add", {"a": i}) for i in range(3, 6)])
        await client.close()
        return [first.job_id, second.job_id, *(j.job_id for j in batch)]

    expected = asyncio.run(main())
    assert sorted(stored_ids(database_url)) == sorted(expected)


def test_enqueue_keeps_its_connection_between_calls(database_url):
    client = Client(database_url)
    for i in range(20):
        client.enqueue("add", {"a": i})
    (count,) = query(
        database_url,
        "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s",
        (APPLICATION_NAME,),
    )
    client.close()
    assert count == (1,)


def test_enqueue_sent_again_after_a_commit_in_doubt_does_not_write_a_second_job(database_url):
    # The first try committed but its reply was lost: the second try finds the same id.
    params = {
        "id": str(uuid.uuid4()),
        "task": "add",
        "payload": '{"a": 1}',
        "queue": "default",
        "priority": 0,
        "run_at": None,
        "delay": 60.0,
        "max_retries": None,
        "unique_key": None,
        "concurrency_key": None,
        "trace_context": None,
    }
    (first,) = query(database_url, sql.ENQUEUE, params)
    (again,) = query(database_url, sql.ENQUEUE_AGAIN, params)
    assert again == first  # same id and run_at, read back
    assert stored_ids(database_url) == [params["id"]]


def test_enqueue_many_sent_again_after_a_commit_in_doubt_does_not_write_the_batch_twice(
    database_url,
):
    ids = [str(uuid.uuid4()) for _ in range(3)]
    rows = [{"i": i, "t": "add", "p": {"a": 1}, "q": "default", "pr": 0, "d": 0.0} for i in ids]
    params = {"jobs": json.dumps(rows), "trace_context": None}
    query(database_url, sql.ENQUEUE_MANY, params)
    query(database_url, sql.ENQUEUE_MANY_AGAIN, params)
    assert stored_ids(database_url) == sorted(ids)


def test_job_ids_are_time_ordered_uuid_v7_from_the_client_and_the_column_default(database_url):
    client = Client(database_url)
    made = [client.enqueue("add", {"a": i}).job_id for i in range(3)]
    client.close()
    with psycopg.connect(database_url, autocommit=True) as conn:
        defaulted = [
            str(conn.execute("SELECT worker.enqueue('add')").fetchone()[0])  # type: ignore[index]
            for _ in range(3)
        ]
    for job_id in made + defaulted:
        assert uuid.UUID(job_id).version == 7, job_id
    # The first 48 bits are Unix milliseconds: now, and never going back.
    stamps = [uuid.UUID(i).int >> 80 for i in made + defaulted]
    assert stamps == sorted(stamps)
    assert all(abs(ms / 1000 - time.time()) < 120 for ms in stamps), stamps
