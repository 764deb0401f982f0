"""Shared pieces of the fault-injection tests: a server of their own, an audited workload, and
the checks every scenario ends with.

The audit is a statement trigger on `worker.jobs` that logs every status change into
`chaos_transitions`; tasks log their side effects into `chaos_effects` (see `faulttasks`).
From those two tables `verify` proves, for every job: one terminal status reached once, at
least one effect, a cleanup after the last stage of every pipeline, nothing left behind.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
from support import counts, query, wait_until
from support import kill_group as kill  # noqa: F401 - the scenarios kill workers with it
from support import worker_env as support_worker_env

from worker.db import migrate
from worker.db.embedded import LocalPostgres

TERMINAL = ("completed", "failed", "cancelled")

# Every status change the product may make (see worker/db/sql/); anything else is a bug.
LEGAL_TRANSITIONS = {
    (None, "pending"),
    ("pending", "processing"),  # claim
    ("pending", "cancelled"),  # cancel before start
    ("processing", "completed"),
    ("processing", "failed"),
    ("processing", "cancelled"),
    ("processing", "paused"),
    ("processing", "pending"),  # retry with backoff, snooze, rescue, release on shutdown
    ("paused", "pending"),  # resume, or cancel of a paused pipeline (its cleanup runs first)
    ("paused", "cancelled"),
    ("failed", "pending"),  # operator retry
    ("cancelled", "pending"),  # operator retry
    (None, "held"),  # a workflow's job with parents (migration 0014)
    ("held", "pending"),  # its last parent ended
    ("held", "cancelled"),  # a parent failed (policy cancel), or a cancel
    ("processing", "held"),  # a stage waits for its children (migration 0017)
    ("cancelled", "held"),  # the parent that cancelled it was retried (migration 0018)
}

# The audit also runs for writes made inside the schema's own functions, whose search path is
# pinned: it keeps the one it was created with, where its table is.
AUDIT = """
CREATE TABLE IF NOT EXISTS chaos_effects (
    job uuid NOT NULL, kind text NOT NULL, attempt int, pid int, value float8,
    at timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE INDEX IF NOT EXISTS chaos_effects_job ON chaos_effects (job);
CREATE TABLE IF NOT EXISTS chaos_transitions (
    job uuid NOT NULL, old text, new text NOT NULL,
    at timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE OR REPLACE FUNCTION chaos_audit() RETURNS trigger LANGUAGE plpgsql
SET search_path FROM CURRENT AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        INSERT INTO chaos_transitions (job, old, new) SELECT id, NULL, status FROM new_rows;
    ELSE
        INSERT INTO chaos_transitions (job, old, new)
        SELECT n.id, o.status, n.status FROM old_rows AS o JOIN new_rows AS n USING (id)
        WHERE o.status IS DISTINCT FROM n.status;
    END IF;
    RETURN NULL;
END $$;
DROP TRIGGER IF EXISTS chaos_audit_update ON worker.jobs;
DROP TRIGGER IF EXISTS chaos_audit_insert ON worker.jobs;
CREATE TRIGGER chaos_audit_update AFTER UPDATE ON worker.jobs
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION chaos_audit();
CREATE TRIGGER chaos_audit_insert AFTER INSERT ON worker.jobs
    REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION chaos_audit();
"""


def install_audit(url: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(AUDIT)


# -- a server of the test's own ------------------------------------------------------------


class OwnServer:
    """A throwaway PostgreSQL only one test uses, so it may be stopped, restarted and starved.

    The port stays the same across `stop()` / `start()`, as a restarted or failed-over
    server would from a worker's point of view.
    """

    def __init__(self, max_connections: int = 100) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="dw-own-"))
        self.root.chmod(0o755)
        self.pg = LocalPostgres(
            self.root / "pg", durable=False, max_connections=max_connections, prefer_system=True
        )
        self.pg.start()
        self.url = self.pg.url()
        migrate.upgrade(self.url)

    def stop(self, mode: str = "fast") -> None:
        self.pg.stop(mode)

    def start(self) -> None:
        self.pg.start()

    def destroy(self) -> None:
        self.pg.destroy()
        shutil.rmtree(self.root, ignore_errors=True)


def worker_env(url: str, **overrides: str) -> dict[str, str]:
    """Environment for `worker run` processes of these tests: quick timings, a short lease and
    retries enough that faults alone never exhaust them (so every job must end `completed`)."""
    settings = {
        "WORKER_MAX_RETRIES": "25",
        "WORKER_RETENTION_ENABLED": "false",
        "WORKER_LOG_LEVEL": "WARNING",
        **overrides,
    }
    return support_worker_env(url, drop=("WORKER_", "PG"), **settings)


# -- the workload ----------------------------------------------------------------------------


def enqueue_workload(url: str, n: int, sleep: float, *, task_mix: bool = True) -> None:
    """`n` jobs by plain SQL: a fifth of them pipelines with an ALL_DONE cleanup, the rest
    sync and async tasks. Each sleeps about `sleep` seconds, so faults catch them mid-run."""
    query(
        url,
        """
        INSERT INTO worker.jobs (task, payload)
        SELECT CASE WHEN NOT %(mix)s THEN 'chaos_sync'
                    WHEN i %% 5 = 0 THEN 'chaos_pipeline'
                    WHEN i %% 3 = 0 THEN 'chaos_async'
                    ELSE 'chaos_sync' END,
               jsonb_build_object('n', i, 'sleep', %(sleep)s * (0.5 + random()))
        FROM generate_series(1, %(n)s) AS i
        """,
        {"n": n, "sleep": sleep, "mix": task_mix},
    )


def wait_all_finished(url: str, n: int, timeout: float) -> float:
    return wait_until(
        lambda: sum(counts(url).get(s, 0) for s in TERMINAL) >= n,
        timeout,
        f"all {n} jobs to finish (now {counts(url)})",
        interval=0.25,
    )


def finished_count(url: str) -> int:
    return sum(counts(url).get(s, 0) for s in TERMINAL)


def worker_id_of(url: str, pid: int) -> str | None:
    rows = query(url, "SELECT id::text FROM worker.workers WHERE pid = %s", (pid,))
    return str(rows[0][0]) if rows else None


def held_by(url: str, worker_id: str) -> int:
    return int(
        query(
            url,
            "SELECT count(*) FROM worker.jobs WHERE status = 'processing' AND worker_id = %s",
            (worker_id,),
        )[0][0]
    )


def reachable_again_seconds(log_text: str) -> list[float]:
    """The outage lengths a worker reported ("database reachable again after X s")."""
    return [float(x) for x in re.findall(r"reachable again after ([0-9.]+) s", log_text)]


# -- the checks ------------------------------------------------------------------------------


@dataclass
class Report:
    scenario: str
    jobs: int
    statuses: dict[str, int]
    executions: int
    duplicates: int
    most_runs: int
    pipelines: int
    cleanups: int
    seconds: float
    extra: dict[str, Any] = field(default_factory=dict)

    def emit(self) -> None:
        """Print the figures, and append them to $CHAOS_RESULTS (JSON lines) when it is set."""
        line = json.dumps(self.__dict__, sort_keys=True)
        print(f"\nchaos {self.scenario}: {line}")
        if target := os.environ.get("CHAOS_RESULTS"):
            with open(target, "a") as out:
                out.write(line + "\n")


def verify(url: str, scenario: str, seconds: float) -> Report:
    """The end-of-scenario invariants; fails the test naming the first that does not hold."""
    statuses = counts(url)
    jobs = sum(statuses.values())
    assert statuses.get("processing", 0) == 0, f"jobs left processing: {statuses}"
    assert statuses.get("pending", 0) == 0, f"jobs left pending: {statuses}"
    assert statuses.get("paused", 0) == 0, f"jobs left paused: {statuses}"
    # Retries are plenty (WORKER_MAX_RETRIES=25): faults alone must never fail a job.
    assert statuses == {"completed": jobs}, f"not every job completed: {statuses}"

    illegal = query(
        url,
        "SELECT old, new, count(*) FROM chaos_transitions GROUP BY old, new",
    )
    bad = [(o, n, c) for o, n, c in illegal if (o, n) not in LEGAL_TRANSITIONS]
    assert not bad, f"illegal status transitions: {bad}"

    # Exactly one terminal status, reached once: one transition into a terminal status per job
    # and none out of it (no operator retries happen in these scenarios).
    wrong_terminal = query(
        url,
        """
        SELECT j.id, count(t.*) FILTER (WHERE t.new IN ('completed', 'failed', 'cancelled')),
               count(t.*) FILTER (WHERE t.old IN ('completed', 'failed', 'cancelled'))
        FROM worker.jobs AS j LEFT JOIN chaos_transitions AS t ON t.job = j.id
        GROUP BY j.id
        HAVING count(t.*) FILTER (WHERE t.new IN ('completed', 'failed', 'cancelled')) <> 1
            OR count(t.*) FILTER (WHERE t.old IN ('completed', 'failed', 'cancelled')) <> 0
        LIMIT 5
        """,
    )
    assert not wrong_terminal, f"jobs without exactly one terminal transition: {wrong_terminal}"

    # Every job's effect happened at least once (for a pipeline: each stage).
    missing = query(
        url,
        """
        SELECT j.id, j.task, j.status FROM worker.jobs AS j
        WHERE NOT EXISTS (SELECT 1 FROM chaos_effects AS e WHERE e.job = j.id
                          AND e.kind = CASE WHEN j.task = 'chaos_pipeline' THEN 'stage:store'
                                            ELSE 'effect' END)
           OR (j.task = 'chaos_pipeline' AND NOT EXISTS (
                SELECT 1 FROM chaos_effects AS e WHERE e.job = j.id AND e.kind = 'stage:fetch'))
        LIMIT 5
        """,
    )
    assert not missing, f"jobs whose effect never happened: {missing}"

    # The ALL_DONE cleanup ran after the last stage of every pipeline, and is recorded done.
    unclean = query(
        url,
        """
        SELECT j.id FROM worker.jobs AS j
        WHERE j.task = 'chaos_pipeline' AND (
            coalesce((SELECT max(at) FROM chaos_effects WHERE job = j.id AND kind = 'cleanup'),
                     '-infinity')
              < (SELECT max(at) FROM chaos_effects WHERE job = j.id AND kind LIKE 'stage:%%')
            OR NOT EXISTS (SELECT 1 FROM worker.job_stages AS s WHERE s.job_id = j.id
                           AND s.kind = 'cleanup' AND s.status = 'completed'))
        LIMIT 5
        """,
    )
    assert not unclean, f"pipelines whose cleanup did not run after their stages: {unclean}"

    ((executions, duplicates, most_runs),) = query(
        url,
        """
        SELECT coalesce(sum(runs), 0), coalesce(sum(runs - 1), 0), coalesce(max(runs), 0)
        FROM (SELECT job, kind, count(*) AS runs FROM chaos_effects
              WHERE kind IN ('effect', 'stage:fetch', 'stage:store') GROUP BY job, kind) AS r
        """,
    )
    ((pipelines, cleanups),) = query(
        url,
        "SELECT (SELECT count(*) FROM worker.jobs WHERE task = 'chaos_pipeline'), "
        "(SELECT count(*) FROM chaos_effects WHERE kind = 'cleanup')",
    )
    return Report(
        scenario=scenario,
        jobs=jobs,
        statuses=statuses,
        executions=int(executions),
        duplicates=int(duplicates),
        most_runs=int(most_runs),
        pipelines=int(pipelines),
        cleanups=int(cleanups),
        seconds=round(seconds, 2),
    )
