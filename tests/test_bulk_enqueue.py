"""`enqueue_many`: thousands of jobs in one statement, all or nothing, one wake-up per queue."""

from __future__ import annotations

import asyncio
from typing import Any

import psycopg
import pytest
from support import query
from support.statements import statements_of

from worker import AsyncClient, Client, InvalidJob, JobSpec

N = 10_000


def specs(n: int) -> list[JobSpec]:
    return [
        JobSpec("add", {"i": i, "b": 1}, queue="bulk" if i % 2 else "default", priority=i % 7)
        for i in range(n)
    ]


def test_enqueue_many_writes_ten_thousand_jobs_in_one_statement(database_url, monkeypatch):
    client = Client(database_url)
    sent = statements_of(client, monkeypatch)
    jobs = client.enqueue_many(specs(N))
    monkeypatch.undo()
    assert len(sent) == 1 and sent[0].startswith("COPY worker.jobs")
    assert len(jobs) == N and len({j.job_id for j in jobs}) == N
    rows = query(
        database_url,
        "SELECT id::text, (payload->>'i')::int, queue, priority, status FROM worker.jobs",
    )
    assert len(rows) == N
    # Every handle names the row holding its own job.
    stored = {r[0]: r[1:] for r in rows}
    for i, job in enumerate(jobs):
        expected = (i, "bulk" if i % 2 else "default", i % 7, "pending")
        assert stored[job.job_id] == expected, i
        assert job.payload == {"i": i, "b": 1}


def test_enqueue_many_wakes_idle_workers_once_per_queue(database_url):
    with psycopg.connect(database_url, autocommit=True) as listener:
        listener.execute("LISTEN worker_jobs")
        Client(database_url).enqueue_many(specs(N))
        heard = [n.payload for n in listener.notifies(timeout=1.5)]
    assert sorted(heard) == ["bulk", "default"]


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        (JobSpec("add", {"x": float("nan")}), "payload is not JSON-serialisable"),
        (JobSpec("add", [1, 2]), "payload must be a JSON object"),  # type: ignore[arg-type]
        (JobSpec("add", {"x": "a\x00b"}), "NUL character"),
        (JobSpec("add", {}, priority=101), "priority must be an integer from -100 to 100"),
        (JobSpec("", {}), "task name"),
        (JobSpec("add", {}, delay=-1), "delay must be a number of seconds or a timedelta, from 0"),
        ("add", "expected a JobSpec or a (task, payload) tuple, not str"),
    ],
)
def test_one_bad_job_refuses_the_whole_batch_and_names_its_index(
    database_url, bad, message, monkeypatch
):
    client = Client(database_url)
    sent = statements_of(client, monkeypatch)
    batch: list[Any] = specs(N)
    batch[7345] = bad
    with pytest.raises(InvalidJob) as raised:
        client.enqueue_many(batch)
    assert str(raised.value).startswith("job 7345: ")
    assert message in str(raised.value)
    assert sent == []  # refused before anything was sent
    assert query(database_url, "SELECT count(*) FROM worker.jobs") == [(0,)]


def test_backslash_text_that_only_looks_like_an_escaped_nul_is_accepted(database_url):
    jobs = Client(database_url).enqueue_many([("add", {"path": "C:\\u0000\\dir"})])
    stored = query(
        database_url, "SELECT payload->>'path' FROM worker.jobs WHERE id = %s", (jobs[0].job_id,)
    )
    assert stored == [("C:\\u0000\\dir",)]


def test_async_enqueue_many_writes_the_batch_in_one_statement(database_url, monkeypatch):
    async def main() -> list[str]:
        client = AsyncClient(database_url)
        sent = statements_of(client, monkeypatch)
        jobs = await client.enqueue_many([("add", {"a": i, "b": 0}) for i in range(N)])
        monkeypatch.undo()
        await client.close()
        assert len(sent) == 1 and sent[0].startswith("COPY worker.jobs")
        return [j.job_id for j in jobs]

    ids = asyncio.run(main())
    assert len(set(ids)) == N
    assert query(database_url, "SELECT count(*), sum((payload->>'a')::int) FROM worker.jobs") == [
        (N, N * (N - 1) // 2)
    ]


def test_enqueue_many_of_nothing_writes_nothing(database_url, monkeypatch):
    client = Client(database_url)
    sent = statements_of(client, monkeypatch)
    assert client.enqueue_many([]) == []
    assert sent == []


ODD_TASK = "add\tthe\\ numbers\n\r"
ODD_QUEUE = "q\\N\t1"
ODD_PAYLOAD: dict[str, Any] = {"s": "a\tb\nc\\d \u00e9 \u2028 \\N", "k\\": ["\\", "\\\\t"]}


@pytest.mark.parametrize("delay", [0, 60], ids=["copied", "inserted"])
def test_enqueue_many_stores_names_and_payloads_exactly(database_url, monkeypatch, delay):
    # Jobs that run now go by COPY, whose text format has its own escapes; a batch with a
    # waiting job goes by INSERT, its run_at from the server's clock.
    client = Client(database_url)
    sent = statements_of(client, monkeypatch)
    (job,) = client.enqueue_many(
        [JobSpec(ODD_TASK, ODD_PAYLOAD, queue=ODD_QUEUE, delay=delay, max_retries=3)]
    )
    monkeypatch.undo()
    assert sent[0].split()[0] == ("COPY" if delay == 0 else "INSERT")
    ((task, queue, payload, max_retries, wait),) = query(
        database_url,
        "SELECT task, queue, payload, max_retries, extract(epoch FROM run_at - created_at) "
        "FROM worker.jobs WHERE id = %s",
        (job.job_id,),
    )
    assert (task, queue, payload, max_retries) == (ODD_TASK, ODD_QUEUE, ODD_PAYLOAD, 3)
    assert float(wait) == pytest.approx(delay, abs=1)
