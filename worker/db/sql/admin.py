"""Read-only questions of the HTTP edge, the CLI and the metrics, and the CLI's bulk writes.

`worker.db.admin` runs each of them and reads its rows; the demo's and the bench's questions
about their own jobs are here too. What this does not hold: one job's verbs (`actions`).
"""

# Read-only: counts per queue and status; the pending age counts from when a job became due
# (`run_at`), so a job delayed on purpose is not reported as waiting.
JOB_STATS = """
SELECT queue, status, count(*) AS jobs,
       extract(epoch FROM now() - min(run_at) FILTER (WHERE status = 'pending'
                                                      AND run_at <= now())) AS oldest_pending
FROM worker.jobs GROUP BY queue, status ORDER BY queue, status
"""

# The health check: the database answers and holds the worker schema.
HEALTH = "SELECT to_regclass('worker.jobs') IS NOT NULL AS has_schema"

# Read-only: whether Alembic's version table exists yet, then the revision it records.
HAS_VERSION_TABLE = "SELECT to_regclass('worker.alembic_version') IS NOT NULL"
SCHEMA_REVISION = "SELECT version_num FROM worker.alembic_version"

# -- operators' tools (the `worker` CLI, metrics) -----------------------------------------

# Read-only. Newest first; a NULL parameter skips its filter; ages are seconds before now()
# on the database's clock. Two ways to page: keyset on (created_at, id) for the API, so rows
# inserted meanwhile never shift a page, and OFFSET for the CLI's numbered pages. One row more
# than the page is read, to tell whether more follow.
FIND_JOBS = """
SELECT id, queue, task, status, priority, retry_count, split_part(error, E'\\n', 1) AS error,
       created_at, run_at, started_at, finished_at
FROM worker.jobs
WHERE (%(status)s::text IS NULL OR status = %(status)s::text)
  AND (%(queue)s::text IS NULL OR queue = %(queue)s::text)
  AND (%(task)s::text IS NULL OR task = %(task)s::text)
  AND (%(older)s::float8 IS NULL OR created_at < now() - make_interval(secs => %(older)s))
  AND (%(newer)s::float8 IS NULL OR created_at >= now() - make_interval(secs => %(newer)s))
  AND (%(before_at)s::timestamptz IS NULL
       OR (created_at, id) < (%(before_at)s::timestamptz, %(before_id)s::uuid))
ORDER BY created_at DESC, id DESC
LIMIT %(limit)s OFFSET %(offset)s
"""

# Read-only: the jobs whose id begins with some hex digits, as the range of uuids that begin
# with them (both ends given whole), so the primary key's index finds them in a few pages.
JOBS_BY_ID_PREFIX = """
SELECT id::text FROM worker.jobs WHERE id >= %(lower)s::uuid AND id <= %(upper)s::uuid
ORDER BY id LIMIT %(limit)s
"""

# Read-only: the jobs whose id ends with some hex digits (the pattern is '%' and hex digits
# only, so nothing in it is a wildcard). No index serves a suffix: this reads every row of
# worker.jobs, so it costs what a sequential scan of the table costs.
JOBS_BY_ID_SUFFIX = """
SELECT id::text FROM worker.jobs WHERE replace(id::text, '-', '') LIKE %(pattern)s
ORDER BY id LIMIT %(limit)s
"""

# Read-only: the newest events of one job (job_events_job_idx), for `worker show`.
LAST_EVENTS = """
SELECT id, step, status, message, created_at FROM worker.job_events
WHERE job_id = %(job_id)s ORDER BY id DESC LIMIT %(limit)s
"""

# Read-only: the admin view (migration 0002), live rows and the last hour only.
QUEUE_STATS = """
SELECT queue, pending, scheduled, processing, paused, failed_last_hour, oldest_pending_seconds,
       completed_last_minute
FROM worker.queue_stats ORDER BY queue
"""

# Read-only: registered workers with the jobs they hold (jobs_processing_idx); a heartbeat
# older than the lease means the worker is presumed dead and its jobs are due for rescue.
LIST_WORKERS = """
SELECT w.id, w.hostname, w.pid, w.queues, w.concurrency, w.started_at, w.heartbeat_at,
       extract(epoch FROM now() - w.heartbeat_at)::float8 AS heartbeat_age,
       array(SELECT j.id::text FROM worker.jobs AS j
             WHERE j.status = 'processing' AND j.worker_id = w.id ORDER BY j.started_at) AS jobs
FROM worker.workers AS w ORDER BY w.started_at, w.id
"""

# Read-only: how many jobs a bulk retry will move (for its progress bar), and the cutoff that
# keeps a job failing again during the retry from being picked up a second time.
COUNT_RETRYABLE = """
SELECT count(*) AS jobs, now() AS cutoff FROM worker.jobs
WHERE status = %(status)s::text AND status IN ('failed', 'cancelled')
  AND (%(task)s::text IS NULL OR task = %(task)s::text)
  AND (%(queue)s::text IS NULL OR queue = %(queue)s::text)
  AND (finished_at <= now() OR finished_at IS NULL)
"""

# Safe: a bounded batch per statement under SKIP LOCKED, so a bulk retry never waits on a
# worker or an operator holding a row; moved rows leave the filter (and the cutoff keeps them
# out if they fail again), so repeating the statement walks the set once. Same reset as RETRY;
# one NOTIFY per queue and batch.
RETRY_BATCH = """
WITH batch AS (
    SELECT id, unique_key FROM worker.jobs AS j
    WHERE status = %(status)s::text AND status IN ('failed', 'cancelled')
      AND (%(task)s::text IS NULL OR task = %(task)s::text)
      AND (%(queue)s::text IS NULL OR queue = %(queue)s::text)
      AND (finished_at <= %(cutoff)s::timestamptz OR finished_at IS NULL)
      AND NOT EXISTS (SELECT FROM worker.jobs AS holder
                      WHERE holder.unique_key = j.unique_key
                        AND holder.status IN ('pending', 'processing', 'paused', 'held')
                        AND holder.id <> j.id)
    LIMIT %(batch)s
    FOR UPDATE SKIP LOCKED
), moved AS (
    -- Of the jobs of the batch sharing a unique key, one goes back: the key takes one.
    UPDATE worker.jobs AS j SET status = 'pending', retry_count = 0, run_at = now(),
           finished_at = NULL, cancel_requested = false, error = NULL, final_error = NULL
    FROM (SELECT DISTINCT ON (coalesce(unique_key, id::text)) id FROM batch) AS one
    WHERE j.id = one.id
    RETURNING j.id, j.queue
), renumbered AS (
    UPDATE worker.job_stages AS s SET attempt = 0 FROM moved WHERE s.job_id = moved.id
)
SELECT queue, count(*) AS moved, pg_notify('worker_jobs', queue) IS NULL AS _
FROM moved GROUP BY queue
"""

# Read-only: how many finished jobs a prune will delete, per status (jobs_finished_idx), for
# its dry run, its question and its progress.
COUNT_PRUNABLE = """
SELECT status, count(*) FROM worker.jobs AS j
WHERE status = ANY(%(statuses)s::text[]) AND finished_at < %(before)s
  AND NOT worker.history_kept(j)
GROUP BY status ORDER BY status
"""

# The lease the worker.stuck_jobs view applies in this transaction (it cannot read WORKER_*);
# not the session's: behind a transaction pooler that would reach other clients.
SET_LEASE = "SELECT set_config('worker.lease_seconds', %(lease)s::text, true)"

# Read-only: stuck jobs per queue, for the metrics (the view decides with SET_LEASE's lease).
STUCK_BY_QUEUE = "SELECT queue, count(*) FROM worker.stuck_jobs GROUP BY queue"

# Read-only: workers whose heartbeat is within the lease.
COUNT_LIVE_WORKERS = """
SELECT count(*) FROM worker.workers
WHERE heartbeat_at >= now() - make_interval(secs => %(lease)s)
"""

# Read-only: the pending jobs no live worker of their queue serves, per queue and task
# (`worker.unserved_tasks`, migration 0012: each worker's own lease decides whether it lives),
# most jobs first.
UNSERVED_TASKS = """
SELECT queue, task, jobs, oldest_created_at, queue_workers FROM worker.unserved_tasks
ORDER BY jobs DESC, queue, task
"""

# -- the demo and the bench, over jobs of their own ------------------------------------------

# Read-only: how many of a set of jobs are finished (the primary key finds each).
COUNT_FINISHED = """
SELECT count(*) FROM worker.jobs
WHERE id = ANY(%(ids)s::uuid[]) AND status = ANY(%(statuses)s)
"""

# Read-only: a set of jobs by status, with their mean run time and their retries.
SUMMARY_BY_STATUS = """
SELECT status, count(*) AS jobs,
       round(avg(extract(epoch FROM finished_at - started_at))::numeric, 3) AS avg_seconds,
       sum(retry_count) AS retries
FROM worker.jobs WHERE id = ANY(%(ids)s::uuid[])
GROUP BY status ORDER BY status
"""

# Read-only: what became of a set of jobs, leaving one task's out; the error's first line only.
OUTCOMES = """
SELECT task, status, retry_count,
       coalesce(result::text, split_part(error, E'\\n', 1)) AS outcome
FROM worker.jobs WHERE id = ANY(%(ids)s::uuid[]) AND task <> %(except_task)s
ORDER BY task
"""

# Read-only: how many jobs of one queue are not completed yet.
COUNT_UNCOMPLETED = """
SELECT count(*) FROM worker.jobs WHERE queue = %(queue)s AND status <> 'completed'
"""

# Safe: only the bench's own queue, whose jobs no one else enqueues; stages and events go with
# their jobs (ON DELETE CASCADE).
DELETE_QUEUE = "DELETE FROM worker.jobs WHERE queue = %(queue)s"

# Read-only, and only what `worker.testing.drain` waits for: the due pending jobs of its queues
# and tasks (as a claim would see them, bar pauses and limits) and the jobs its worker holds.
LEFT_TO_RUN = """
SELECT count(*) FILTER (WHERE status = 'pending') AS due,
       count(*) FILTER (WHERE status = 'processing') AS held
FROM worker.jobs
WHERE queue = ANY(%(queues)s::text[])
  AND ((status = 'pending' AND run_at <= now() AND task = ANY(%(tasks)s::text[]))
       OR (status = 'processing' AND worker_id = %(worker_id)s))
"""

# Read-only: the failures of the last `since` seconds (`jobs_failed_idx`), grouped by task,
# error type and message as `worker.job_failures` (migration 0013) keys them, most frequent
# first; a NULL task skips its filter.
FAILURE_GROUPS = """
SELECT task, error_type, message, count(*) AS failures,
       min(finished_at) AS first_seen, max(finished_at) AS last_seen,
       (array_agg(id ORDER BY finished_at DESC))[1] AS example_job_id
FROM worker.job_failures
WHERE finished_at >= now() - make_interval(secs => %(since)s)
  AND (%(task)s::text IS NULL OR task = %(task)s::text)
GROUP BY task, error_type, message
ORDER BY failures DESC, last_seen DESC, task
LIMIT %(limit)s
"""

# Read-only: the retry limit that applies to one job: its own, else the one its task's workers
# published (`worker.task_limits`, migration 0013); NULL if neither is known.
RETRY_LIMIT = """
SELECT coalesce(j.max_retries, l.max_retries) AS max_retries
FROM worker.jobs AS j LEFT JOIN worker.task_limits AS l ON l.task = j.task
WHERE j.id = %(id)s
"""
