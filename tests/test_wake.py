"""Idle workers share a wake token: a new job wakes one of them, not all, and is never left
waiting for a worker that did not wake (one that is busy, or was killed as it was woken).

Each test runs real `worker run` processes, each under its own application name, so that the
token's holder is found in `pg_locks` and `pg_stat_activity`, and each serving its metrics,
so that its claims are counted.
"""

from __future__ import annotations

import os
import signal
import statistics
import subprocess
import urllib.request

from support import Processes, free_port, insert_job, query, wait_for, worker_env

from worker.daemon.wake import FALLBACK_POLLS

TASKS = "herdtasks"
TOKEN_SPACE = 2002873189  # `worker.db.sql.wake`
CLAIMS = "durable_worker_claim_duration_seconds_count"


class Fleet:
    """Worker processes named `<name>-<i>`, each serving its metrics on its own port."""

    def __init__(self, url: str, processes: Processes, name: str, n: int, **settings: str):
        self.url = url
        self.ports = [free_port() for _ in range(n)]
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        for i, port in enumerate(self.ports):
            app = f"{name}-{i}"
            env = worker_env(url, PGAPPNAME=app, **settings)
            self.procs[app] = processes.worker(env, TASKS, extra={"WORKER_METRICS_PORT": str(port)})

    def claims(self) -> int:
        """Claims sent so far by the processes still alive."""
        alive = zip(self.ports, self.procs.values(), strict=True)
        return sum(claims_of(port) for port, proc in alive if proc.poll() is None)

    def holder(self) -> str | None:
        """The application name of the session holding the token, if one does."""
        rows = query(
            self.url,
            "SELECT a.application_name FROM pg_locks l JOIN pg_stat_activity a USING (pid) "
            "WHERE l.locktype = 'advisory' AND l.classid = %s AND l.granted",
            (TOKEN_SPACE,),
        )
        return str(rows[0][0]) if rows else None

    def ready(self) -> None:
        """Every process has claimed once and listens, and one of them holds the token."""

        def up() -> bool:
            try:
                return all(claims_of(port) > 0 for port in self.ports)
            except OSError:
                return False

        wait_for(up, 60, message="every worker to claim")
        listening = (
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = ANY(%s) "
            "AND query LIKE 'LISTEN%%'"
        )
        names = list(self.procs)
        wait_for(
            lambda: query(self.url, listening, (names,))[0][0] == len(names),
            60,
            message="every listener",
        )
        wait_for(self.holder, 60, message="a token holder")


def claims_of(port: int) -> int:
    """The claims one process has sent, from its metrics."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        lines = r.read().decode().splitlines()
    return sum(int(float(line.split()[-1])) for line in lines if line.startswith(CLAIMS))


def start_delays(url: str, ids: list[str]) -> list[float]:
    rows = query(
        url,
        "SELECT extract(epoch FROM started_at - created_at)::float8 FROM worker.jobs "
        "WHERE id = ANY(%s::uuid[])",
        (ids,),
    )
    return [float(d) for (d,) in rows]


def completed(url: str, ids: list[str]) -> bool:
    done = query(
        url,
        "SELECT count(*) FROM worker.jobs WHERE id = ANY(%s::uuid[]) AND status = 'completed'",
        (ids,),
    )
    return bool(done[0][0] == len(ids))


def test_a_trickle_on_idle_workers_starts_each_job_promptly_with_about_one_claim_each(
    database_url: str, processes: Processes
) -> None:
    """Polls far apart, so that the claims counted are the notifications' answers: one per
    job from the token's holder, not one per idle worker."""
    url, workers, jobs = database_url, 4, 10
    fleet = Fleet(
        url,
        processes,
        "trickle",
        workers,
        WORKER_CONCURRENCY="10",
        WORKER_POLL_MIN="3",
        WORKER_POLL_MAX="3",
    )
    fleet.ready()
    before = fleet.claims()
    ids = []
    for _ in range(jobs):
        ids.append(insert_job(url, "noop", "{}"))
        wait_for(lambda: completed(url, ids), 30, message="the job to finish")
    claims = fleet.claims() - before
    delays = start_delays(url, ids)
    # Each job started on its notification, not at a poll 3 s later.
    assert statistics.median(delays) < 1.0, delays
    assert max(delays) < 3.0, delays
    # Every idle worker answering would make `jobs * workers`; the holder's own polls add a few.
    assert claims <= jobs + workers, f"{claims} claims for {jobs} jobs on {workers} workers"


def test_a_job_starts_at_once_while_the_token_holder_is_busy(
    database_url: str, processes: Processes
) -> None:
    """A holder whose slots fill gives the token back and says so: the next idle worker takes
    it at once, not at its next poll."""
    url = database_url
    fleet = Fleet(
        url,
        processes,
        "busy",
        2,
        WORKER_CONCURRENCY="1",
        WORKER_POLL_MIN="3",
        WORKER_POLL_MAX="3",
    )
    fleet.ready()
    long = insert_job(url, "busy", '{"sleep": 10, "steps": 2}')
    wait_for(
        lambda: (
            query(url, "SELECT status FROM worker.jobs WHERE id = %s", (long,))[0][0]
            == "processing"
        ),
        30,
        message="the long job to start",
    )
    quick = insert_job(url, "noop", "{}")
    wait_for(lambda: completed(url, [quick]), 30, message="the quick job")
    (delay,) = start_delays(url, [quick])
    assert delay < 1.5, f"the quick job waited {delay:.2f} s for the idle worker's poll"


def test_a_job_notified_as_the_token_holder_is_killed_still_starts(
    database_url: str, processes: Processes
) -> None:
    """SIGKILL of the woken worker right after the NOTIFY: its session ends and frees the
    token, which another worker takes at its next poll; a job it had claimed is rescued."""
    url = database_url
    fleet = Fleet(url, processes, "killed", 3, WORKER_CONCURRENCY="10")
    fleet.ready()
    holder = fleet.holder()
    assert holder is not None
    job_id = insert_job(url, "noop", "{}")
    os.kill(fleet.procs[holder].pid, signal.SIGKILL)
    wait_for(lambda: completed(url, [job_id]), 30, message="the job to finish")
    wait_for(lambda: fleet.holder() not in (None, holder), 30, message="a new holder")
    after = insert_job(url, "noop", "{}")
    wait_for(lambda: completed(url, [after]), 30, message="a job enqueued after")
    (delay,) = start_delays(url, [after])
    assert delay < 1.0, f"the next job waited {delay:.2f} s"


def test_workers_without_the_token_still_claim_at_their_fallback_poll(
    database_url: str, processes: Processes
) -> None:
    """A holder that keeps its token but claims nothing (here: stopped with SIGSTOP, as a
    blocked event loop would leave it) delays a job by a few polls, never for good."""
    url = database_url
    fleet = Fleet(url, processes, "stuck", 2, WORKER_POLL_MIN="0.2", WORKER_POLL_MAX="0.2")
    fleet.ready()
    holder = fleet.holder()
    assert holder is not None
    proc = fleet.procs[holder]
    os.kill(proc.pid, signal.SIGSTOP)
    try:
        job_id = insert_job(url, "noop", "{}")
        # Its fallback poll comes every `FALLBACK_POLLS` polls of 0.2 s.
        wait_for(lambda: completed(url, [job_id]), 10 + FALLBACK_POLLS, message="the job")
        assert fleet.holder() == holder, "the stopped holder kept its token"
    finally:
        os.kill(proc.pid, signal.SIGCONT)
