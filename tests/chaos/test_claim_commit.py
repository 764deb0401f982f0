"""The claim commits without waiting for the WAL flush, and that costs no guarantee.

`sql.CLAIM` turns `synchronous_commit` off for its own transaction. A claim lost in a server
crash leaves its job `pending` with the attempt unchanged; the worker still running that attempt
cannot write its outcome (the guard: `processing` AND its worker id AND the attempt), so the
job runs again and completes: at-least-once, as after a worker crash. These tests show both
halves: the setting applies to the claim's transaction and nothing else, and a real
`pg_ctl stop -m immediate` right after claims loses some of them and no job.
"""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from typing import Any

import psycopg
import pytest
from support import Processes, insert_job, insert_worker
from support.factories import claim_params

from chaos.harness import query, verify, wait_until, worker_env
from worker.db import sql


def commit_mode_inside(conn: psycopg.Connection[Any], statement: str, params: Any) -> str:
    """`synchronous_commit` as seen inside the transaction of `statement`, just after it ran."""
    with conn.transaction():
        conn.execute(statement, params)
        row = conn.execute("SHOW synchronous_commit").fetchone()
    assert row is not None
    return str(row[0])


@pytest.mark.parametrize("one_queue", [True, False])
def test_claim_commits_asynchronously_and_leaves_the_session_as_it_was(database_url, one_queue):
    worker_id = insert_worker(database_url)
    job_id = insert_job(database_url, task="add")
    statement = sql.CLAIM_ONE_QUEUE if one_queue else sql.CLAIM
    queues = ["default"] if one_queue else ["default", "other"]
    with psycopg.connect(database_url) as conn:
        conn.execute("SET synchronous_commit = on")
        conn.commit()
        params = claim_params(worker_id, ["add"], queues=queues)
        assert commit_mode_inside(conn, statement, params) == "off"
        claimed = query(database_url, "SELECT status FROM worker.jobs WHERE id = %s", (job_id,))
        assert claimed == [("processing",)]
        # The next transaction on the same session commits durably again.
        assert commit_mode_inside(conn, "SELECT 1", None) == "on"


def test_enqueue_and_outcome_writes_keep_waiting_for_the_flush(database_url):
    worker_id = insert_worker(database_url)
    with psycopg.connect(database_url) as conn:
        conn.execute("SET synchronous_commit = on")
        conn.commit()
        enqueue = {
            "id": str(uuid.uuid4()),
            "task": "add",
            "payload": "{}",
            "queue": "default",
            "priority": 0,
            "run_at": None,
            "delay": 0.0,
            "max_retries": None,
            "unique_key": None,
            "concurrency_key": None,
            "trace_context": None,
        }
        assert commit_mode_inside(conn, sql.ENQUEUE, enqueue) == "on"
        params = claim_params(worker_id, ["add"])
        commit_mode_inside(conn, sql.CLAIM_ONE_QUEUE, params)
        outcome = (
            f'[{{"id": "{enqueue["id"]}", "retries": 0, "max_retries": 3, '
            '"outcome": "completed", "result": 1}]'
        )
        written = {
            "outcomes": outcome,
            "worker_id": worker_id,
            "backoff_base": 1.0,
            "backoff_max": 1.0,
        }
        assert commit_mode_inside(conn, sql.RECORD_OUTCOMES, written) == "on"
        assert query(database_url, "SELECT status FROM worker.jobs") == [("completed",)]


# -- a real crash ----------------------------------------------------------------------------

JOBS = 6
ROUNDS = 3  # a claim survives a crash only if some other commit flushed it first: rare


def commit_durably(url: str) -> None:
    """The server's defaults for commits (the test servers turn them off for speed), and a WAL
    writer that waits long before flushing, so an asynchronous commit is still in memory when
    the server is stopped moments later."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("ALTER SYSTEM SET synchronous_commit = on")
        conn.execute("ALTER SYSTEM SET wal_writer_delay = '10s'")
        conn.execute("SELECT pg_reload_conf()")


def states(url: str, ids: list[str]) -> dict[str, tuple[str, str | None, int]]:
    rows = query(
        url,
        "SELECT id::text, status, worker_id::text, retry_count FROM worker.jobs "
        "WHERE id = ANY(%s::uuid[])",
        (ids,),
    )
    return {job_id: (status, worker, retries) for job_id, status, worker, retries in rows}


@pytest.mark.chaos
def test_claims_lost_in_a_server_crash_run_again_and_no_job_is_lost(
    own_server, processes: Processes, tmp_path: Path
):
    server = own_server()
    url = server.url
    commit_durably(url)
    env = worker_env(url, WORKER_LEASE_SECONDS="60")  # no heartbeat commit in the crash window
    proc = processes.worker(env, "chaos.claimtasks", extra={"WORKER_CONCURRENCY": str(JOBS)})
    wait_until(lambda: query(url, "SELECT 1 FROM worker.workers"), 60, "the worker to register")
    time.sleep(0.5)  # its start-up writes are behind it
    started = time.monotonic()

    lost: list[str] = []
    kept: list[str] = []
    for round_ in range(ROUNDS):
        release = tmp_path / f"release-{round_}"
        ids = [
            str(row[0])
            for row in query(
                url,
                "INSERT INTO worker.jobs (task, payload) SELECT 'held_until_released', "
                "jsonb_build_object('release', %s::text) FROM generate_series(1, %s) "
                "RETURNING id",
                (str(release), JOBS),
            )
        ]
        wait_until(
            lambda ids=ids: all(s[0] == "processing" for s in states(url, ids).values()),
            30,
            "every job claimed",
            interval=0.005,
        )
        server.stop("immediate")  # as a crash: nothing more is written
        server.start()
        after = states(url, ids)
        for job_id, (status, worker, retries) in after.items():
            if status == "pending":
                # The claim never happened, as far as the database knows: attempt unchanged.
                assert (worker, retries) == (None, 0), after
                lost.append(job_id)
            else:
                assert status == "processing", after
                kept.append(job_id)
        release.touch()
        wait_until(
            lambda ids=ids: all(s[0] == "completed" for s in states(url, ids).values()),
            90,
            "every job of the round completed",
            interval=0.1,
        )
        if lost:
            break

    report = verify(url, "claim_commit_crash", time.monotonic() - started)
    report.extra = {"claims_lost": len(lost), "claims_kept": len(kept)}
    report.emit()
    assert lost, "no claim was lost in any crash: the claim waited for the WAL flush"
    assert proc.poll() is None, processes.log(proc)

    runs: dict[str, list[float]] = {}
    for job_id, value in query(url, "SELECT job::text, value FROM chaos_effects ORDER BY at", None):
        runs.setdefault(job_id, []).append(value)
    results = dict(query(url, "SELECT id::text, result FROM worker.jobs", None))
    for job_id in lost:
        # The attempt whose claim was lost ran to its end, but its outcome was refused by the
        # guard: the job kept the outcome of the run after it.
        assert len(runs[job_id]) == 2, (job_id, runs[job_id])
        assert results[job_id] == runs[job_id][-1] != runs[job_id][0]
    for job_id in kept:
        assert len(runs[job_id]) == 1, (job_id, runs[job_id])
        assert results[job_id] == runs[job_id][0]
