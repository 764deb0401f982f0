"""A polling stage keeps its pace: on an idle worker, and under a burst of watcher-shaped
pipelines (`backlogtasks.polled_export`) over two real `worker run` processes, at the default
settings. A snoozed stage due again is claimed ahead of jobs never started
(`worker.db.sql.claim`), and the worker that snoozed it looks for it when it is due instead of
at its next idle poll (`worker.daemon.local_queue`)."""

from __future__ import annotations

from support import Processes, query, wait_for
from support.processes import QUICK

from worker import Client, JobSpec

BURST = 1000
PROCESSES = 2


def at_default_settings(env: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items() if k not in QUICK}


def registered(url: str, *procs: object) -> None:
    pids = [p.pid for p in procs]  # type: ignore[attr-defined]
    wait_for(
        lambda: (
            len(query(url, "SELECT 1 FROM worker.workers WHERE pid = ANY(%s)", (pids,)))
            == len(pids)
        ),
        message=f"workers {pids} registered",
    )


def ended(url: str) -> int:
    rows = query(
        url, "SELECT count(*) FROM worker.jobs WHERE status IN ('completed', 'failed', 'cancelled')"
    )
    return int(rows[0][0])


def poll_gaps(url: str) -> list[float]:
    """Seconds between each job's consecutive polls."""
    rows = query(
        url,
        """
        SELECT extract(epoch FROM at - lag(at) OVER (PARTITION BY job ORDER BY at))::float
        FROM effects WHERE kind = 'poll'
        """,
    )
    return [gap for (gap,) in rows if gap is not None]


def test_a_snoozed_stage_on_an_idle_worker_polls_at_the_interval_it_asked_for(
    env, database_url, processes: Processes
):
    # Nothing notifies a worker that a snoozed job is due again: at the default idle backoff
    # it would find the job only at its next poll, up to WORKER_POLL_MAX late.
    poll = 2.0
    worker = processes.worker(at_default_settings(env), "backlogtasks")
    registered(database_url, worker)
    job = Client(database_url).enqueue("polled_export", {"ready_after": 3 * poll, "poll": poll})
    job.wait_sync(timeout=60)
    gaps = poll_gaps(database_url)
    assert gaps and max(gaps) < 1.25 * poll, f"polls {gaps} s apart, {poll} s asked for"
    assert len(gaps) == 3  # polled at 0, 1, 2 and 3 intervals: ready at the last


def test_a_burst_of_polling_pipelines_meets_its_deadlines_and_polls_at_its_interval(
    env, database_url, processes: Processes
):
    poll = 1.0
    defaults = at_default_settings(env)
    registered(
        database_url, *(processes.worker(defaults, "backlogtasks") for _ in range(PROCESSES))
    )

    Client(database_url).enqueue_many(
        [JobSpec("polled_export", {"ready_after": poll, "poll": poll}) for _ in range(BURST)]
    )
    wait_for(lambda: ended(database_url) == BURST, timeout=240, interval=0.5, message="the burst")

    outcomes = dict(query(database_url, "SELECT status, count(*) FROM worker.jobs GROUP BY status"))
    errors = query(
        database_url,
        "SELECT DISTINCT split_part(error, E'\\n', 1) FROM worker.jobs WHERE status <> 'completed'",
    )
    assert outcomes == {"completed": BURST}, errors  # no StageDeadlineExceeded, nothing failed
    cleanups = query(database_url, "SELECT count(DISTINCT job) FROM effects WHERE kind = 'cleanup'")
    assert cleanups[0][0] == BURST
    gaps = poll_gaps(database_url)
    # Every export is ready a poll after it started, so every job polls at least twice.
    assert len(gaps) >= BURST
    # The widest gap follows the machine's load; nearly all of them must keep the pace.
    gaps.sort()
    p99 = gaps[int(0.99 * (len(gaps) - 1))]
    assert p99 < 3 * poll, f"1% of the polls were over {p99:.2f} s apart (widest {gaps[-1]:.2f})"
