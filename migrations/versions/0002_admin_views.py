"""admin views: queue_stats, stuck_jobs, failed_recently, slowest_tasks

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-30 08:10:00.000000

Every view reads live rows through the partial indexes on pending / processing / paused jobs
and finished rows only through `jobs_finished_idx` over a recent time range, so a table with
millions of finished jobs costs them nothing more than its last hour.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


# Per queue: live counts, failures in the last hour, how long the oldest runnable job has
# waited, and jobs completed in the last minute. Each UNION arm matches one partial index.
QUEUE_STATS = """
CREATE VIEW worker.queue_stats AS
SELECT queue,
       count(*) FILTER (WHERE status = 'pending') AS pending,
       count(*) FILTER (WHERE status = 'pending' AND run_at > now()) AS scheduled,
       count(*) FILTER (WHERE status = 'processing') AS processing,
       count(*) FILTER (WHERE status = 'paused') AS paused,
       count(*) FILTER (WHERE status = 'failed') AS failed_last_hour,
       coalesce(extract(epoch FROM now() - min(run_at) FILTER (
           WHERE status = 'pending' AND run_at <= now())), 0)::float8 AS oldest_pending_seconds,
       count(*) FILTER (WHERE status = 'completed'
                          AND finished_at > now() - interval '1 minute') AS completed_last_minute
FROM (
    SELECT queue, status, run_at, NULL::timestamptz AS finished_at
    FROM worker.jobs WHERE status = 'pending'
    UNION ALL
    SELECT queue, status, run_at, NULL FROM worker.jobs WHERE status = 'processing'
    UNION ALL
    SELECT queue, status, run_at, NULL FROM worker.jobs WHERE status = 'paused'
    UNION ALL
    SELECT queue, status, run_at, finished_at FROM worker.jobs
    WHERE status IN ('completed', 'failed', 'cancelled')
      AND finished_at > now() - interval '1 hour'
) AS recent
GROUP BY queue
"""

# The lease is the worker's WORKER_LEASE_SECONDS; the database cannot read the worker's
# environment, so the view reads the `worker.lease_seconds` parameter (set it per database or
# per session to match), defaulting to the setting's default of 15 s.
STUCK_JOBS = """
CREATE VIEW worker.stuck_jobs AS
SELECT j.id, j.queue, j.task, j.worker_id, w.hostname, w.pid, j.started_at, w.heartbeat_at,
       extract(epoch FROM now() - w.heartbeat_at)::float8 AS heartbeat_age_seconds,
       extract(epoch FROM now() - j.started_at)::float8 AS running_seconds,
       j.retry_count
FROM worker.jobs AS j
LEFT JOIN worker.workers AS w ON w.id = j.worker_id
WHERE j.status = 'processing'
  AND (w.id IS NULL
       OR w.heartbeat_at < now() - make_interval(secs => coalesce(
           nullif(current_setting('worker.lease_seconds', true), '')::float8, 15)))
"""

# Jobs that ran out of retries in the last 24 hours, newest first, with the last error's
# first line (`Type: message`; a traceback follows it) beside the full text.
FAILED_RECENTLY = """
CREATE VIEW worker.failed_recently AS
SELECT id, queue, task, retry_count, finished_at,
       split_part(error, E'\\n', 1) AS error_line,
       error
FROM worker.jobs
WHERE status = 'failed' AND finished_at > now() - interval '24 hours'
ORDER BY finished_at DESC
"""

# Duration of each task's last attempt (claim to finish) over the last hour, slowest first, for
# jobs that completed or failed. The status list repeats jobs_finished_idx's predicate so the
# planner may use that index; cancelled jobs are then filtered out (a cancel is not a run).
SLOWEST_TASKS = """
CREATE VIEW worker.slowest_tasks AS
SELECT task,
       count(*) AS jobs,
       percentile_cont(0.5) WITHIN GROUP (
           ORDER BY extract(epoch FROM finished_at - started_at))::float8 AS p50_seconds,
       percentile_cont(0.95) WITHIN GROUP (
           ORDER BY extract(epoch FROM finished_at - started_at))::float8 AS p95_seconds,
       max(extract(epoch FROM finished_at - started_at))::float8 AS max_seconds
FROM worker.jobs
WHERE status IN ('completed', 'failed', 'cancelled')
  AND finished_at > now() - interval '1 hour'
  AND status <> 'cancelled' AND started_at IS NOT NULL
GROUP BY task
ORDER BY p95_seconds DESC
"""

VIEWS = ("slowest_tasks", "failed_recently", "stuck_jobs", "queue_stats")


def upgrade() -> None:
    # Paused jobs are few, so this index costs the hot path nothing; it keeps the paused
    # count of queue_stats off the finished rows.
    op.create_index(
        "jobs_paused_idx",
        "jobs",
        ["queue"],
        unique=False,
        schema="worker",
        postgresql_where=sa.text("status = 'paused'"),
    )
    # Failed jobs are few too: failed_recently, `worker jobs --status failed` and the bulk
    # retry read them newest first without touching the completed ones.
    op.create_index(
        "jobs_failed_idx",
        "jobs",
        ["finished_at"],
        unique=False,
        schema="worker",
        postgresql_where=sa.text("status = 'failed'"),
    )
    for statement in (QUEUE_STATS, STUCK_JOBS, FAILED_RECENTLY, SLOWEST_TASKS):
        op.execute(statement)


def downgrade() -> None:
    for name in VIEWS:
        op.execute(f"DROP VIEW worker.{name}")
    op.drop_index(
        "jobs_failed_idx",
        table_name="jobs",
        schema="worker",
        postgresql_where=sa.text("status = 'failed'"),
    )
    op.drop_index(
        "jobs_paused_idx",
        table_name="jobs",
        schema="worker",
        postgresql_where=sa.text("status = 'paused'"),
    )
