"""The progress bus: the in-memory adapter, and the PostgreSQL one across processes."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import textwrap
import threading
import time
import uuid

import httpx
from support import ROOT, Processes, query, wait_for

from worker import Client, ProgressEvent
from worker.api import create_app
from worker.daemon import Worker
from worker.events import MemoryBus, PostgresBus
from worker.settings import Settings


def event(job_id: str, step: str = "load", status: str = "progress", **message) -> ProgressEvent:
    return ProgressEvent(job_id=job_id, step=step, status=status, message=message or None)


def stored(url: str, job_id: str) -> list[tuple[object, ...]]:
    return query(
        url,
        "SELECT id, step, status, message FROM worker.job_events WHERE job_id = %s ORDER BY id",
        (job_id,),
    )


# -- the in-memory bus ---------------------------------------------------------------------


def test_memory_bus_ids_increase_across_jobs_and_threads():
    bus = MemoryBus()

    def publish(job: str) -> None:
        for i in range(500):
            bus.publish(event(job, i=i))

    threads = [threading.Thread(target=publish, args=(f"job-{n}",)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    per_job = [asyncio.run(bus.history(f"job-{n}")) for n in range(4)]
    for events in per_job:
        assert [e.message["i"] for e in events] == list(range(500))  # type: ignore[index]
        ids = [e.id for e in events]
        assert ids == sorted(ids) and len(set(ids)) == 500
    every_id = sorted(e.id for events in per_job for e in events)
    assert every_id == list(range(1, 2001))
    later = asyncio.run(bus.history("job-0", after=per_job[0][249].id))
    assert [e.message["i"] for e in later] == list(range(250, 500))  # type: ignore[index]


def test_memory_bus_follow_gets_past_then_live_events_published_from_other_threads():
    bus = MemoryBus()
    bus.publish(event("j", status="started"))

    async def main() -> list[ProgressEvent]:
        got: list[ProgressEvent] = []

        def later() -> None:
            for i in range(5):
                time.sleep(0.05)
                bus.publish(event("j", i=i))
                bus.publish(event("other", i=i))
            bus.publish(event("j", step="job", status="completed"))

        threading.Thread(target=later).start()
        async with asyncio.timeout(10):
            async for e in bus.follow("j"):
                got.append(e)
                if e.step == "job":
                    return got
        return got

    got = asyncio.run(main())
    assert [e.status for e in got] == ["started"] + ["progress"] * 5 + ["completed"]
    assert all(e.job_id == "j" for e in got)
    assert [e.id for e in got] == sorted(e.id for e in got)


def test_memory_bus_keeps_memory_bounded_dropping_the_oldest():
    bus = MemoryBus(max_events_per_job=10, max_jobs=3)
    for i in range(25):
        bus.publish(event("busy", i=i))
    kept = asyncio.run(bus.history("busy"))
    assert [e.message["i"] for e in kept] == list(range(15, 25))  # type: ignore[index]
    for name in ("a", "b", "c"):
        bus.publish(event(name))
    assert asyncio.run(bus.history("busy")) == []  # the least recently active job went first
    bus.publish(event("a"))  # "a" is active again, so "b" is now the oldest
    bus.publish(event("d"))
    assert asyncio.run(bus.history("b")) == []
    assert len(asyncio.run(bus.history("a"))) == 2
    bus.forget("a")
    assert asyncio.run(bus.history("a")) == []


def test_memory_bus_carries_an_in_process_workers_events_to_the_api(database_url):
    """Single-process use: a worker and the API in one process share a MemoryBus."""
    import testtasks  # noqa: F401 - registers the pipelines with this process

    bus = MemoryBus()
    settings = Settings(DATABASE_URL=database_url, WORKER_POLL_MIN=0.02, WORKER_POLL_MAX=0.2)
    job_id = Client(database_url).enqueue("watched_export", {"ticks": 3, "tick": 0.05}).job_id

    async def main() -> httpx.Response:
        worker = Worker(database_url, settings, bus=bus)
        running = asyncio.create_task(worker.run())
        app = create_app(database_url, bus=bus)
        transport = httpx.ASGITransport(app=app)
        try:
            async with httpx.AsyncClient(transport=transport, base_url="http://api") as http:
                async with asyncio.timeout(60):
                    return await http.get(f"/jobs/{job_id}/events")
        finally:
            worker.request_stop()
            await running

    response = asyncio.run(main())
    assert response.status_code == 200
    steps = [
        line.split('"step":"')[1].split('"')[0]
        for line in response.text.splitlines()
        if line.startswith("data:") and '"step"' in line
    ]
    assert steps[:3] == ["spawn", "spawn", "poll"] and steps[-1] == "job"
    last = response.text.rstrip().splitlines()[-1]
    assert last.startswith("data:") and json.loads(last[5:])["status"] == "completed"
    # Nothing went through the database: the events were in this process only.
    assert stored(database_url, job_id) == []


# -- the PostgreSQL bus ----------------------------------------------------------------------

PUBLISHER = textwrap.dedent(
    """
    import asyncio, sys
    from worker import ProgressEvent
    from worker.events import PostgresBus

    async def main(url, job_id, name, count):
        bus = PostgresBus(url, flush_interval=0.005)
        await bus.start()
        for i in range(count):
            bus.publish(ProgressEvent(job_id=job_id, step=name, status="progress",
                                      message={"i": i}))
            if i % 5 == 0:
                await asyncio.sleep(0)
        await bus.aclose()

    asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])))
    """
)


def start_publisher(url: str, job_id: str, name: str, count: int) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-c", PUBLISHER, url, job_id, name, str(count)],
        cwd=ROOT,
        start_new_session=True,
    )


def test_events_published_in_other_processes_reach_a_follower_once_and_in_order(database_url):
    """Several processes write events of one job at once (as a rescued job's old worker may);
    a follower in another process never skips or repeats one."""
    job_id = Client(database_url).enqueue("add", {}).job_id
    names, count = ("a", "b", "c"), 1000

    async def follow() -> list[ProgressEvent]:
        bus = PostgresBus(database_url)
        got: list[ProgressEvent] = []

        async def collect() -> None:
            async for e in bus.follow(job_id):
                got.append(e)

        collector = asyncio.create_task(collect())
        publishers = [start_publisher(database_url, job_id, n, count) for n in names]
        try:
            async with asyncio.timeout(120):
                while any(p.poll() is None for p in publishers):
                    await asyncio.sleep(0.1)
            # Everything is written now; a follower that skipped an event never gets it.
            deadline = time.monotonic() + 5
            while len(got) < len(names) * count and time.monotonic() < deadline:
                await asyncio.sleep(0.1)
        finally:
            collector.cancel()
            for p in publishers:
                if p.poll() is None:
                    p.kill()
                p.wait()
            await bus.aclose()
        return got

    got = asyncio.run(follow())
    ids = [e.id for e in got]
    assert ids == [r[0] for r in stored(database_url, job_id)], "the follower missed events"
    assert len(set(ids)) == len(ids) == len(names) * count
    for name in names:
        assert [e.message["i"] for e in got if e.step == name] == list(range(count))  # type: ignore[index]


def test_worker_events_are_stored_and_a_bad_message_does_not_fail_the_job(
    env, database_url, processes: Processes
):
    processes.worker(env, "testtasks")
    job = Client(database_url).enqueue("messy_progress", {})
    assert job.wait_sync(timeout=30) == "ok"
    wait_for(lambda: len(stored(database_url, job.job_id)) == 2, message="2 events stored")
    first, second = (r[3] for r in stored(database_url, job.job_id))
    assert first["pct"] == 50  # type: ignore[index]
    assert first["thing"].startswith("<object object")  # type: ignore[index]
    assert first["ratio"] == "nan"  # type: ignore[index]
    assert first["text"] == "nul\ufffdchar"  # type: ignore[index]
    assert second == {"pct": 100, "step_done": True}


def test_publish_never_blocks_or_raises_while_the_database_is_away(tmp_path):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    bus = PostgresBus(f"postgresql://postgres@127.0.0.1:{port}/none", max_buffer=1000)

    async def main() -> float:
        await bus.start()
        started = time.monotonic()
        for i in range(20_000):
            bus.publish(event(str(uuid.uuid4()), i=i))
        elapsed = time.monotonic() - started
        await asyncio.sleep(0.3)  # the flusher fails and retries meanwhile
        closing = time.monotonic()
        await bus.aclose()
        assert time.monotonic() - closing < 15
        return elapsed

    elapsed = asyncio.run(main())
    assert elapsed < 10  # 20,000 publishes: a few microseconds each, never a network wait
    assert bus.dropped == 19_000  # the buffer kept the newest 1,000


def test_an_event_the_database_refuses_is_dropped_alone(database_url):
    job_id = Client(database_url).enqueue("add", {}).job_id
    gone = str(uuid.uuid4())  # a job deleted meanwhile: its events cannot be stored

    async def main() -> int:
        bus = PostgresBus(database_url)
        await bus.start()
        bus.publish(event(job_id, i=1))
        bus.publish(event(gone, i=2))
        bus.publish(event(job_id, i=3))
        await bus.aclose()
        return bus.dropped

    assert asyncio.run(main()) == 1
    assert [r[3] for r in stored(database_url, job_id)] == [{"i": 1}, {"i": 3}]


def test_postgres_bus_stores_step_names_and_messages_exactly(database_url):
    job_id = Client(database_url).enqueue("add", {}).job_id
    steps = ['say "hi"', "back\\slash", "tab\tnew\nline", "schön, 東京 🚀", "{", ""]

    async def main() -> None:
        bus = PostgresBus(database_url)
        await bus.start()
        for i, step in enumerate(steps):
            bus.publish(event(job_id, step, note=step, i=i))
        bus.publish(event(job_id, "none", "started"))
        await bus.aclose()

    asyncio.run(main())
    rows = [r[1:] for r in stored(database_url, job_id)]
    expected = [(step, "progress", {"note": step, "i": i}) for i, step in enumerate(steps)]
    assert rows == [*expected, ("none", "started", None)]
    assert query(
        database_url,
        "SELECT count(*) FROM worker.job_events WHERE job_id = %s AND created_at > now() - "
        "interval '1 minute'",
        (job_id,),
    ) == [(len(steps) + 1,)]


def test_postgres_bus_writes_again_after_its_connections_are_killed(database_url):
    job_id = Client(database_url).enqueue("add", {}).job_id

    async def main() -> None:
        bus = PostgresBus(database_url)
        await bus.start()
        bus.publish(event(job_id, i=0))
        async with asyncio.timeout(30):
            while len(stored(database_url, job_id)) < 1:
                await asyncio.sleep(0.05)
        query(
            database_url,
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()",
        )
        for i in range(1, 4):
            bus.publish(event(job_id, i=i))
        async with asyncio.timeout(30):
            while len(stored(database_url, job_id)) < 4:
                await asyncio.sleep(0.05)
        await bus.aclose()

    asyncio.run(main())
    assert [r[3]["i"] for r in stored(database_url, job_id)] == [0, 1, 2, 3]  # type: ignore[index]


def test_retention_removes_events_with_their_jobs(database_url):
    client = Client(database_url)
    old = client.enqueue("add", {}).job_id
    recent = client.enqueue("add", {}).job_id

    async def publish() -> None:
        bus = PostgresBus(database_url)
        await bus.start()
        for job_id in (old, recent):
            for i in range(5):
                bus.publish(event(job_id, i=i))
        await bus.aclose()

    asyncio.run(publish())
    query(
        database_url,
        "UPDATE worker.jobs SET status = 'completed', finished_at = now() - interval '10 days' "
        "WHERE id = %s",
        (old,),
    )
    query(
        database_url,
        "UPDATE worker.jobs SET status = 'completed', finished_at = now() WHERE id = %s",
        (recent,),
    )
    assert client.cleanup_jobs(older_than="7d") == 1
    assert stored(database_url, old) == []
    assert len(stored(database_url, recent)) == 5
