"""Periodic tasks against a real PostgreSQL: each tick is enqueued exactly once however many
workers fire it, downtime gives one catch-up job at most, and a changed schedule stops firing
in its old form."""

from __future__ import annotations

import asyncio
import itertools
import json
import signal
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta

import psycopg
import pytest
from support import Processes, query, wait_for

from worker.db import sql
from worker.db.postgres import PostgresDriver

TASKS = "scheduledtasks"
TICK = "tick every 1s"
# The workers serve another queue, so the periodic jobs stay as they were enqueued: running,
# retrying or handing back a job at a stop moves its run_at.
ELSEWHERE = {"WORKER_QUEUES": "elsewhere"}


def tick_times(url: str, task: str = "tick") -> list[datetime]:
    rows = query(url, "SELECT run_at FROM worker.jobs WHERE task = %s ORDER BY run_at", (task,))
    return [at for (at,) in rows]


def gaps(times: list[datetime]) -> list[float]:
    return [(b - a).total_seconds() for a, b in itertools.pairwise(times)]


def stop(processes: Processes, *procs: subprocess.Popen[bytes]) -> None:
    for proc in procs:
        proc.send_signal(signal.SIGTERM)
    for proc in procs:
        assert proc.wait(timeout=30) == 0, processes.log(proc)


def test_concurrent_firings_of_one_tick_insert_one_job(database_url):
    tick = datetime(2026, 1, 1, 12, tzinfo=UTC)

    async def fire_together(driver: PostgresDriver, at: datetime) -> list[str | None]:
        fire = driver.fire_tick
        calls = [fire("t every 60s", "t", "every 60s", at, "default") for _ in range(10)]
        return await asyncio.gather(*calls)

    async def main() -> list[list[str | None]]:
        drivers = [PostgresDriver(database_url, concurrency=20) for _ in range(2)]
        for driver in drivers:
            await driver.open()
        try:
            answers = []
            for at in (tick, tick + timedelta(minutes=1), tick + timedelta(minutes=1), tick):
                both = await asyncio.gather(*(fire_together(d, at) for d in drivers))
                answers.append([job for firings in both for job in firings])
            return answers
        finally:
            for driver in drivers:
                await driver.close()

    first_sight, next_tick, same_again, older = asyncio.run(main())
    assert first_sight == [None] * 20  # a new schedule fires from its next tick
    assert len([job for job in next_tick if job is not None]) == 1
    assert same_again == [None] * 20 and older == [None] * 20
    rows = query(database_url, "SELECT task, payload, queue, run_at FROM worker.jobs")
    assert rows == [("t", {}, "default", tick + timedelta(minutes=1))]
    assert query(database_url, "SELECT last_tick, fired FROM worker.schedules") == [
        (tick + timedelta(minutes=1), 1)
    ]


def test_three_workers_enqueue_each_tick_exactly_once(env, database_url, processes: Processes):
    started = datetime.now(UTC)
    procs = [
        processes.worker({**env, **ELSEWHERE, "WORKER_LOG_LEVEL": "INFO"}, TASKS) for _ in range(3)
    ]
    wait_for(
        lambda: query(database_url, "SELECT count(*) FROM worker.workers") == [(3,)],
        message="three workers registered",
    )
    wait_for(lambda: len(tick_times(database_url)) >= 6, timeout=60, message="six ticks")
    stop(processes, *procs)
    stopped = datetime.now(UTC)

    times = tick_times(database_url)
    assert len(set(times)) == len(times)  # one job per tick
    assert gaps(times) == [1.0] * (len(times) - 1)  # every tick, none skipped
    assert all(at.microsecond == 0 for at in times)
    assert started < times[0] and times[-1] <= stopped  # first sight: no catch-up
    fired = sum(processes.log(p).count("scheduled job") for p in procs)
    assert fired == len(times)
    assert query(database_url, "SELECT fired FROM worker.schedules WHERE key = %s", (TICK,)) == [
        (len(times),)
    ]
    # The yearly schedule was seen for the first time: its row, but no catch-up job.
    assert tick_times(database_url, "new_year") == []
    assert query(database_url, "SELECT fired FROM worker.schedules WHERE task = 'new_year'") == [
        (0,)
    ]


def test_downtime_gives_one_catch_up_job_for_the_latest_missed_tick(
    env, database_url, processes: Processes
):
    two_years_ago = datetime(datetime.now(UTC).year - 2, 1, 1, tzinfo=UTC)
    query(
        database_url,
        "INSERT INTO worker.schedules (key, task, spec, last_tick, fired) "
        "VALUES ('new_year cron 0 0 1 1 * UTC', 'new_year', 'cron 0 0 1 1 * UTC', %s, 1)",
        (two_years_ago,),
    )
    proc = processes.worker({**env, **ELSEWHERE}, TASKS)
    wait_for(lambda: len(tick_times(database_url)) >= 2, timeout=60, message="two ticks")
    stop(processes, proc)
    time.sleep(3.5)  # three ticks or more missed: no worker runs
    proc = processes.worker({**env, **ELSEWHERE}, TASKS)
    before = len(tick_times(database_url))
    wait_for(lambda: len(tick_times(database_url)) >= before + 3, timeout=60, message="more ticks")
    stop(processes, proc)

    steps = gaps(tick_times(database_url))
    missed = [step for step in steps if step != 1.0]
    assert len(missed) == 1 and missed[0] >= 3.0, steps  # the downtime: one job stands for it
    # The yearly schedule last fired two years ago: one job, for this year's tick only.
    this_year = datetime(datetime.now(UTC).year, 1, 1, tzinfo=UTC)
    assert tick_times(database_url, "new_year") == [this_year]


def test_a_changed_schedule_stops_firing_in_its_old_form(env, database_url, processes):
    proc = processes.worker({**env, **ELSEWHERE}, TASKS)
    wait_for(lambda: len(tick_times(database_url)) >= 2, timeout=60, message="two ticks")
    stop(processes, proc)
    old = query(
        database_url, "SELECT last_tick, fired FROM worker.schedules WHERE key = %s", (TICK,)
    )
    before = len(tick_times(database_url))

    proc = processes.worker({**env, **ELSEWHERE, "TICK_EVERY": "2"}, TASKS)
    wait_for(lambda: len(tick_times(database_url)) >= before + 3, timeout=60, message="new ticks")
    stop(processes, proc)

    new_times = tick_times(database_url)[before:]
    assert all(int(at.timestamp()) % 2 == 0 for at in new_times), new_times
    assert gaps(new_times) == [2.0] * (len(new_times) - 1)
    # The old form's row stays as it was: no worker fires it any more.
    assert (
        query(database_url, "SELECT last_tick, fired FROM worker.schedules WHERE key = %s", (TICK,))
        == old
    )
    assert query(
        database_url, "SELECT fired FROM worker.schedules WHERE key = 'tick every 2s'"
    ) == [(len(new_times),)]


def test_worker_schedule_lists_each_entry_with_its_next_run(env, database_url):
    def listing(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "worker", "schedule", TASKS, *args],
            env={**env, "COLUMNS": "200"},
            capture_output=True,
            text=True,
            timeout=60,
        )

    query(
        database_url,
        "INSERT INTO worker.schedules (key, task, spec, last_tick, fired) "
        "VALUES ('new_year cron 0 0 1 1 * UTC', 'new_year', 'cron 0 0 1 1 * UTC', "
        "'2026-01-01T00:00:00Z', 3)",
    )
    now = datetime.now(UTC)
    done = listing("--json")
    assert done.returncode == 0, done.stderr
    entries = {e["task"]: e for e in json.loads(done.stdout)}
    assert set(entries) == {"tick", "new_year", "nightly"}
    assert entries["tick"]["schedule"] == "every 1s"
    assert entries["tick"]["timezone"] == "-"
    assert entries["tick"]["last_fired"] is None and entries["tick"]["fired"] == 0
    next_tick = datetime.fromisoformat(entries["tick"]["next_run"])
    assert now < next_tick <= now + timedelta(seconds=5)
    assert entries["new_year"]["next_run"] == f"{now.year + 1}-01-01T00:00:00+00:00"
    assert entries["new_year"]["last_fired"] == "2026-01-01T00:00:00+00:00"
    assert entries["nightly"]["schedule"] == "30 2 * * mon-fri"
    assert entries["nightly"]["timezone"] == "Europe/Paris"
    assert (entries["tick"]["queue"], entries["nightly"]["queue"]) == ("default", "reports")
    assert entries["nightly"]["next_run"].endswith(("02:30:00+01:00", "02:30:00+02:00"))

    text = listing()
    assert text.returncode == 0, text.stderr
    lines = text.stdout.splitlines()
    assert lines[0].split() == [
        *("task", "schedule", "timezone", "queue", "next", "run", "last", "fired")
    ]
    row = next(line for line in lines if line.startswith("new_year"))
    assert "2026-01-01 00:00:00+00:00" in row and f"{now.year + 1}-01-01 00:00:00" in row
    assert "never" in next(line for line in lines if line.startswith("tick"))

    unreachable = subprocess.run(
        [sys.executable, "-m", "worker", "schedule", TASKS],
        env={**env, "DATABASE_URL": "postgresql://u:p@127.0.0.1:9/x", "COLUMNS": "200"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert unreachable.returncode == 0, unreachable.stderr
    assert "last runs unknown" in unreachable.stderr
    assert "unknown" in next(line for line in unreachable.stdout.splitlines() if "tick" in line)


def test_periodic_jobs_go_to_their_schedules_queue_where_its_workers_run_them(
    env, database_url, processes: Processes
):
    """A worker serving only `reports` runs the jobs of a schedule declared with
    `queue="reports"`: none is left in `default`, which nothing there drains."""
    proc = processes.worker({**env, "WORKER_QUEUES": "reports"}, "queuedschedules")

    def reports_done() -> int:
        statement = (
            "SELECT count(*) FROM worker.jobs WHERE task = 'report' AND status = 'completed'"
        )
        return int(query(database_url, statement)[0][0])

    wait_for(lambda: reports_done() >= 2, timeout=60, message="two periodic jobs run")
    stop(processes, proc)
    assert query(database_url, "SELECT DISTINCT queue FROM worker.jobs") == [("reports",)]


def test_the_runner_role_may_fire_ticks_and_the_client_role_only_read_them(database_url):
    tick = datetime(2026, 1, 1, tzinfo=UTC)
    params = {"key": "t every 1s", "task": "t", "spec": "every 1s", "tick": tick, "queue": "q"}
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute("SET ROLE worker_runner")
        for at in (tick, tick + timedelta(seconds=1)):
            conn.execute(sql.FIRE_TICK, {**params, "tick": at})
        conn.execute("SET ROLE worker_client")
        assert conn.execute("SELECT fired FROM worker.schedules").fetchall() == [(1,)]
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute(sql.FIRE_TICK, {**params, "tick": tick + timedelta(seconds=2)})
