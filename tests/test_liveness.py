"""A dead worker process's jobs start again within seconds, at the default lease: the server
ends the sessions of a process that died, and its claim session held the worker's liveness
lock (`worker.db.sql.liveness`). Real `worker run` processes, killed with SIGKILL."""

from __future__ import annotations

import os
import signal
import subprocess
import time

from support import Processes, query, wait_for

from worker import Client

DEFAULTS = {"WORKER_LEASE_SECONDS": "15", "WORKER_CONCURRENCY": "10"}
RESTARTED_WITHIN = 3.0  # seconds, at default settings


def held_by(url: str, worker_id: object) -> int:
    rows = query(
        url,
        "SELECT count(*) FROM worker.jobs WHERE status = 'processing' AND worker_id = %s",
        (worker_id,),
    )
    return int(rows[0][0])


def worker_of(url: str, pid: int) -> object:
    rows = query(url, "SELECT id FROM worker.workers WHERE pid = %s", (pid,))
    return rows[0][0] if rows else None


def restarted(url: str, ids: list[str]) -> bool:
    """Every one of `ids` taken again after its lost attempt, and running."""
    rows = query(
        url,
        "SELECT count(*) FROM worker.jobs WHERE id = ANY(%s::uuid[]) "
        "AND status = 'processing' AND retry_count = 1",
        (ids,),
    )
    return int(rows[0][0]) == len(ids)


def server_up_for_a_lease(url: str) -> None:
    # Nothing is judged dead in the first lease after the server started (its restart would
    # have ended every session): a test server may be younger than that.
    wait_for(
        lambda: query(url, "SELECT pg_postmaster_start_time() < now() - interval '16 s'")[0][0],
        timeout=30,
        message="the test server to have run for a lease",
    )


def victim_holding_ten_jobs(
    env: dict[str, str], url: str, processes: Processes
) -> tuple[subprocess.Popen[bytes], list[str]]:
    """A worker at the default settings running ten long jobs, on a server up for a lease."""
    server_up_for_a_lease(url)
    client = Client(url)
    victim = processes.worker(env, "testtasks", extra=DEFAULTS)
    ids = [client.enqueue("effect", {"key": str(i), "sleep": 120}).job_id for i in range(10)]
    wait_for(lambda: worker_of(url, victim.pid), message="the victim registered")
    victim_id = worker_of(url, victim.pid)
    wait_for(lambda: held_by(url, victim_id) == 10, message="the victim holds 10 jobs")
    return victim, ids


def test_a_killed_workers_ten_jobs_start_again_within_seconds_at_the_default_lease(
    env, database_url, processes
):
    victim, ids = victim_holding_ten_jobs(env, database_url, processes)
    survivor = processes.worker(env, "testtasks", extra=DEFAULTS)
    wait_for(lambda: worker_of(database_url, survivor.pid), message="the survivor registered")

    os.killpg(victim.pid, signal.SIGKILL)
    killed_at = time.monotonic()
    wait_for(lambda: restarted(database_url, ids), timeout=30, interval=0.02)
    took = time.monotonic() - killed_at
    assert took < RESTARTED_WITHIN, f"the jobs started again {took:.2f} s after the kill"
    assert "rescued: its worker was lost" in processes.log(survivor)


def test_a_worker_started_after_the_whole_fleet_died_rescues_at_once(env, database_url, processes):
    victim, ids = victim_holding_ten_jobs(env, database_url, processes)
    # And a worker with no liveness lock (an older release, or one behind a transaction
    # pooler) whose lease ran out a minute ago, still holding a job.
    ((stale,),) = query(
        database_url,
        "INSERT INTO worker.workers (id, hostname, pid, queues, concurrency, heartbeat_at) "
        "VALUES (gen_random_uuid(), 'gone', 1, '{default}', 1, now() - interval '1 minute') "
        "RETURNING id",
    )
    payload = {"key": "old", "sleep": 120}
    old = Client(database_url).enqueue("effect", payload, queue="elsewhere").job_id
    query(
        database_url,
        "UPDATE worker.jobs SET status = 'processing', worker_id = %s, started_at = now(), "
        "queue = 'default' WHERE id = %s",
        (stale, old),
    )
    os.killpg(victim.pid, signal.SIGKILL)
    victim.wait(timeout=10)

    fresh = processes.worker(env, "testtasks", extra={**DEFAULTS, "WORKER_CONCURRENCY": "11"})
    wait_for(lambda: worker_of(database_url, fresh.pid), interval=0.02, message="registered")
    registered_at = time.monotonic()
    wait_for(lambda: restarted(database_url, [*ids, old]), timeout=30, interval=0.02)
    took = time.monotonic() - registered_at
    assert took < RESTARTED_WITHIN, f"the jobs started again {took:.2f} s after it registered"
