"""A worker process holds at most three server sessions whatever its concurrency: the claim
loop's, one for every other statement, and the listener's; running jobs hold none.

Each test runs a real `worker run` process under its own application name, so that
`pg_stat_activity` shows exactly its sessions.
"""

from __future__ import annotations

from support import Processes, query, wait_for, worker_env

TASKS = "herdtasks"
MOST = 3


def sessions(url: str, name: str) -> int:
    return int(
        query(url, "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s", (name,))[0][
            0
        ]
    )


def heartbeats(url: str) -> object:
    return query(url, "SELECT max(heartbeat_at) FROM worker.workers")[0][0]


def beaten(url: str, times: int) -> None:
    """Wait for `times` more heartbeats: the duties (heartbeat, rescuer) ran meanwhile."""
    for _ in range(times):
        before = heartbeats(url)
        wait_for(lambda b=before: heartbeats(url) not in (None, b), 30, message="a heartbeat")


def test_an_idle_worker_at_concurrency_ten_holds_at_most_three_sessions(
    database_url: str, processes: Processes
) -> None:
    url, name = database_url, "sessions-idle"
    processes.worker(worker_env(url, PGAPPNAME=name, WORKER_CONCURRENCY="10"), TASKS)
    listening = (
        "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s "
        "AND query LIKE 'LISTEN%%'"
    )
    wait_for(lambda: query(url, listening, (name,))[0][0], 60, message="the listener")
    seen = []
    for _ in range(3):
        beaten(url, 1)
        seen.append(sessions(url, name))
    assert 2 <= max(seen) <= MOST, seen


def test_a_busy_worker_at_concurrency_ten_holds_at_most_three_sessions(
    database_url: str, processes: Processes
) -> None:
    """Ten jobs running at once, publishing progress, their outcomes written as they end."""
    url, name = database_url, "sessions-busy"
    processes.worker(worker_env(url, PGAPPNAME=name, WORKER_CONCURRENCY="10"), TASKS)
    query(
        url,
        "INSERT INTO worker.jobs (task, payload) "
        "SELECT 'busy', '{\"sleep\": 3}' FROM generate_series(1, 20)",
    )
    seen: list[int] = []

    def counted(status: str, n: int) -> bool:
        seen.append(sessions(url, name))
        found = query(url, "SELECT count(*) FROM worker.jobs WHERE status = %s", (status,))
        return bool(found[0][0] == n)

    wait_for(lambda: counted("processing", 10), 60, message="ten jobs running at once")
    wait_for(lambda: counted("completed", 20), 60, message="the jobs to finish")
    events = query(url, "SELECT count(*) FROM worker.job_events")[0][0]
    assert events >= 20 * 5, "the jobs published their progress"
    assert 2 <= max(seen) <= MOST, seen
