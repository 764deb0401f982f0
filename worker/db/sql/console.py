"""The console's statements: the job list by tab and search, bulk verbs' sets, the workers
with the jobs they hold, the charts, and the rollup the workers write for them.

`worker.db.console` runs them. What this does not hold: one job's verbs (`actions`), which a
bulk verb calls for each job of its set.
"""

# The console's job sets are asked of each row through the schema's functions (migration
# 0015): `worker.in_console_tab` (a tab: a job's state as an operator reads it),
# `worker.bulk_verb_applies` (which jobs a bulk verb may change) and `worker.console_search`
# (a NULL argument skips its filter; the search is a substring of the id, the task, the
# payload's JSON or the error). PostgreSQL inlines them, and folds a tab or verb given as a
# parameter into the tab's own conditions, so each tab keeps its own plan (its partial index):
# `worker.db.console` has these statements planned for their parameters at every run, never
# from a plan kept for another tab.

# Read-only: one page of a tab, newest first, one row more than the page to tell whether more
# follow; the worker holding a running job comes with it. Keyset on (created_at, id), as
# `GET /jobs`: rows inserted meanwhile never shift a page.
LIST_JOBS = """
SELECT j.id, j.queue, j.task, j.status, j.priority, j.retry_count, j.max_retries,
       split_part(j.error, E'\\n', 1) AS error, j.created_at, j.run_at, j.started_at,
       j.finished_at, j.cancel_requested, w.hostname AS worker_host, w.pid AS worker_pid
FROM worker.jobs AS j LEFT JOIN worker.workers AS w ON w.id = j.worker_id
WHERE worker.in_console_tab(j, %(tab)s::text)
  AND worker.console_search(j, %(queue)s::text, %(task)s::text, %(since)s::timestamptz,
                            %(q)s::text)
  AND (%(before_at)s::timestamptz IS NULL
       OR (j.created_at, j.id) < (%(before_at)s::timestamptz, %(before_id)s::uuid))
ORDER BY j.created_at DESC, j.id DESC
LIMIT %(limit)s
"""

# Read-only: how many jobs each tab holds under the same search; finished jobs but the failed
# are left out, so the count reads live rows and the failed ones (`jobs_failed_idx`) only.
COUNT_TABS = """
SELECT count(*) FILTER (WHERE worker.in_console_tab(j, 'running')) AS running,
       count(*) FILTER (WHERE worker.in_console_tab(j, 'queued')) AS queued,
       count(*) FILTER (WHERE worker.in_console_tab(j, 'scheduled')) AS scheduled,
       count(*) FILTER (WHERE worker.in_console_tab(j, 'retrying')) AS retrying,
       count(*) FILTER (WHERE worker.in_console_tab(j, 'paused')) AS paused,
       count(*) FILTER (WHERE worker.in_console_tab(j, 'failed')) AS failed
FROM worker.jobs AS j
WHERE j.status IN ('processing', 'pending', 'paused', 'failed')
  AND worker.console_search(j, %(queue)s::text, %(task)s::text, %(since)s::timestamptz,
                            %(q)s::text)
"""

# Read-only: one batch of a bulk verb's set in a tab, walked by keyset; each job is then changed
# by the one-job statement (`RETRY`, `CANCEL`), whose row lock and rules apply to it as to a
# click.
BULK_IDS = """
SELECT j.id::text AS id, j.created_at FROM worker.jobs AS j
WHERE worker.in_console_tab(j, %(tab)s::text) AND worker.bulk_verb_applies(j, %(verb)s::text)
  AND worker.console_search(j, %(queue)s::text, %(task)s::text, %(since)s::timestamptz,
                            %(q)s::text)
  AND (%(before_at)s::timestamptz IS NULL
       OR (j.created_at, j.id) < (%(before_at)s::timestamptz, %(before_id)s::uuid))
ORDER BY j.created_at DESC, j.id DESC
LIMIT %(limit)s
"""

# Read-only: how many jobs of a tab a bulk verb would change, for its confirmation.
BULK_COUNT = """
SELECT count(*) FROM worker.jobs AS j
WHERE worker.in_console_tab(j, %(tab)s::text) AND worker.bulk_verb_applies(j, %(verb)s::text)
  AND worker.console_search(j, %(queue)s::text, %(task)s::text, %(since)s::timestamptz,
                            %(q)s::text)
"""

# Read-only: what the job view adds to `GET /jobs/{id}`: the worker holding the job and how
# long ago it beat, the stages its task runs as the workers registered them, and the retry
# limit that applies to it (its own, else its task's as the workers published it).
JOB_CONTEXT = """
SELECT j.task, j.worker_id, w.hostname AS worker_host, w.pid AS worker_pid,
       extract(epoch FROM now() - w.heartbeat_at)::float8 AS heartbeat_age,
       t.stages, t.cleanups, coalesce(j.max_retries, l.max_retries) AS retry_limit
FROM worker.jobs AS j
LEFT JOIN worker.workers AS w ON w.id = j.worker_id
LEFT JOIN worker.task_stages AS t ON t.task = j.task
LEFT JOIN worker.task_limits AS l ON l.task = j.task
WHERE j.id = %(id)s
"""

# Read-only: each registered worker and the jobs it holds (`jobs_processing_idx`), the
# longest-running first.
WORKERS = """
SELECT w.id, w.hostname, w.pid, w.queues, w.concurrency, w.started_at,
       extract(epoch FROM now() - w.heartbeat_at)::float8 AS heartbeat_age,
       coalesce((SELECT jsonb_agg(jsonb_build_object(
                    'id', j.id, 'task', j.task, 'queue', j.queue, 'started_at', j.started_at)
                  ORDER BY j.started_at)
                 FROM worker.jobs AS j
                 WHERE j.status = 'processing' AND j.worker_id = w.id), '[]'::jsonb) AS jobs
FROM worker.workers AS w ORDER BY w.hostname, w.pid, w.id
"""

# Read-only: the rollup in buckets of `bucket` seconds from `start`: outcomes summed, and each
# queue's depth as the most seen in any minute of the bucket.
CHART = """
WITH per_minute AS (
    SELECT minute, queue, sum(completed) AS completed, sum(failed) AS failed,
           sum(pending) AS pending, sum(processing) AS processing
    FROM worker.job_rollups
    WHERE minute >= %(start)s::timestamptz
      AND (%(queue)s::text IS NULL OR queue = %(queue)s::text)
      AND (%(task)s::text IS NULL OR task = %(task)s::text)
    GROUP BY minute, queue
)
SELECT date_bin(make_interval(secs => %(bucket)s), minute, %(start)s::timestamptz) AS bucket,
       queue, sum(completed)::int AS completed, sum(failed)::int AS failed,
       max(pending)::int AS pending, max(processing)::int AS processing
FROM per_minute GROUP BY 1, 2 ORDER BY 1, 2
"""

# The database's clock, which the page's relative times and the rollup's minutes go by.
NOW = "SELECT now()"

# -- the rollup the workers write (`worker.daemon.plugins.rollup`) ----------------------------

# One worker rolls up at a time; the others skip their turn rather than wait for the lock.
ROLLUP_TURN = "SELECT pg_try_advisory_xact_lock(hashtextextended('worker.job_rollups', 0))"

# Safe to repeat, by any worker: each minute's outcomes are counted again from the rows
# (`jobs_finished_idx`) and set, not added, from a little before the last minute rolled up (or
# a day back at most), so a run that overlaps another or follows a stop counts nothing twice.
ROLL_UP_OUTCOMES = """
INSERT INTO worker.job_rollups AS r (minute, queue, task, completed, failed)
SELECT date_trunc('minute', finished_at), queue, task,
       count(*) FILTER (WHERE status = 'completed'), count(*) FILTER (WHERE status = 'failed')
FROM worker.jobs
WHERE status IN ('completed', 'failed')
  AND finished_at >= greatest(
        date_trunc('minute', now()) - interval '1 day',
        (SELECT max(minute) FROM worker.job_rollups) - interval '2 minutes')
GROUP BY 1, 2, 3
ORDER BY 1, 2, 3
ON CONFLICT (minute, queue, task) DO UPDATE
SET completed = EXCLUDED.completed, failed = EXCLUDED.failed
"""

# The depth of every queue and task now, kept as the most seen in the current minute; reads
# the live rows only, each status by its own partial index (`jobs_runnable_idx`,
# `jobs_processing_idx`): one `status IN (...)` matches neither, and scans the whole history.
# A queue and task that had jobs in the last ten minutes and has none now is sampled as 0, so
# its drained minutes read 0 and a minute no worker sampled reads none.
SAMPLE_DEPTH = """
INSERT INTO worker.job_rollups AS r (minute, queue, task, pending, processing)
SELECT date_trunc('minute', now()), queue, task, sum(pending), sum(processing)
FROM (
    SELECT queue, task, count(*) FILTER (WHERE run_at <= now()) AS pending, 0 AS processing
    FROM worker.jobs WHERE status = 'pending' GROUP BY queue, task
    UNION ALL
    SELECT queue, task, 0, count(*) FROM worker.jobs WHERE status = 'processing'
    GROUP BY queue, task
    UNION ALL
    SELECT DISTINCT queue, task, 0, 0 FROM worker.job_rollups
    WHERE minute >= now() - interval '10 minutes' AND (pending > 0 OR processing > 0)
) AS seen
GROUP BY queue, task
ORDER BY queue, task
ON CONFLICT (minute, queue, task) DO UPDATE
SET pending = greatest(r.pending, EXCLUDED.pending),
    processing = greatest(r.processing, EXCLUDED.processing)
"""

# Rows past what any chart shows.
PRUNE_ROLLUPS = "DELETE FROM worker.job_rollups WHERE minute < now() - interval '2 days'"

# A worker's registry, published: the retry limit its claim applies to each task's jobs that
# set none (the task's own, else the worker's default), so `worker show` gives it without the
# task's code. Rows are written in key order, as the stages below, so two workers starting at
# once lock them in the same order; a row already right is not rewritten.
PUBLISH_LIMITS = """
INSERT INTO worker.task_limits (task, max_retries)
SELECT key, value::integer FROM jsonb_each_text(%(limits)s::jsonb) ORDER BY key
ON CONFLICT (task) DO UPDATE
SET max_retries = EXCLUDED.max_retries, updated_at = now()
WHERE task_limits.max_retries <> EXCLUDED.max_retries
"""

# A worker's registry, published: each pipeline's stages in the order they run.
PUBLISH_STAGES = """
INSERT INTO worker.task_stages (task, stages, cleanups)
SELECT key, array(SELECT jsonb_array_elements_text(value -> 'stages')),
       array(SELECT jsonb_array_elements_text(value -> 'cleanups'))
FROM jsonb_each(%(plans)s::jsonb) ORDER BY key
ON CONFLICT (task) DO UPDATE
SET stages = EXCLUDED.stages, cleanups = EXCLUDED.cleanups, updated_at = now()
WHERE (task_stages.stages, task_stages.cleanups) IS DISTINCT FROM
      (EXCLUDED.stages, EXCLUDED.cleanups)
"""
