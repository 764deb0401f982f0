"""What operators and clients do to one job: cancel, resume, retry, read; and retention."""

# Safe: the row lock orders this against a claim and an outcome. A job that is not running
# and owes no ALL_DONE cleanup is cancelled at once. A running job only gets the request (a
# worker honours it at the next stage boundary, then runs the cleanup). A waiting job whose
# stages ran without their cleanup (paused, snoozed, rescued) goes back to a worker at once,
# which runs only that cleanup and settles it cancelled. Which attempt owes a cleanup is
# `worker.owed_cleanup_attempt` (migration 0007), the rule a resuming worker reads too. A
# held job (waiting for parents) is cancelled at once; the trigger `jobs_ended` (migration
# 0014) settles its own held children in this statement.
CANCEL = """
WITH target AS (
    SELECT j.id, j.status, worker.owed_cleanup_attempt(j.id) IS NOT NULL AS owes_cleanup
    FROM worker.jobs AS j WHERE j.id = %(id)s FOR UPDATE
), changed AS (
    UPDATE worker.jobs AS j SET
        status = CASE WHEN t.status = 'processing' THEN j.status
                      WHEN t.owes_cleanup THEN 'pending'
                      ELSE 'cancelled' END,
        finished_at = CASE WHEN t.status <> 'processing' AND NOT t.owes_cleanup
                           THEN now() ELSE j.finished_at END,
        run_at = CASE WHEN t.status <> 'processing' THEN now() ELSE j.run_at END,
        cancel_requested = true
    FROM target AS t
    WHERE j.id = t.id AND t.status IN ('pending', 'paused', 'processing', 'held')
    RETURNING j.id, j.status, j.queue
)
SELECT (SELECT status FROM target) AS before, c.status AS after,
       CASE c.status WHEN 'cancelled' THEN pg_notify('worker_done', c.id::text)
                     WHEN 'processing' THEN pg_notify('worker_cancel', c.id::text)
                     WHEN 'pending' THEN pg_notify('worker_jobs', c.queue) END IS NULL AS _
FROM (SELECT 1) AS one LEFT JOIN changed AS c ON true
"""

# Only a paused job can be resumed; the row lock makes two resumes of one job run in turn.
RESUME = """
UPDATE worker.jobs SET status = 'pending', answer = %(answer)s::jsonb, run_at = now()
WHERE id = %(id)s AND status = 'paused'
RETURNING id, pg_notify('worker_jobs', queue) IS NULL AS _
"""

# A failed or cancelled job runs again from its first unfinished stage, with fresh retries.
# Its stage rows are renumbered to attempt 0 in the same statement, because attempts count
# from 1 again and the stage runner tells an owed cleanup by attempt number (nothing is owed
# here: a job only becomes failed or cancelled once its cleanup ran).
# A job whose unique key another live job holds stays as it is (`jobs_unique_key_idx`). A job
# of a workflow re-arms the descendants its ending cancelled: the trigger `jobs_ended` does it
# in this statement (migration 0018), for this statement and every other that retries.
RETRY = """
WITH job AS (
    UPDATE worker.jobs AS j SET status = 'pending', retry_count = 0, run_at = now(),
           finished_at = NULL, cancel_requested = false, error = NULL, final_error = NULL
    WHERE id = %(id)s AND status IN ('failed', 'cancelled')
      AND NOT EXISTS (SELECT FROM worker.jobs AS holder
                      WHERE holder.unique_key = j.unique_key
                        AND holder.status IN ('pending', 'processing', 'paused', 'held')
                        AND holder.id <> j.id)
    RETURNING id, queue
), renumbered AS (
    UPDATE worker.job_stages AS s SET attempt = 0 FROM job WHERE s.job_id = job.id
)
SELECT id, pg_notify('worker_jobs', queue) IS NULL AS _ FROM job
"""

JOB_STATUS = "SELECT status FROM worker.jobs WHERE id = %(id)s"

GET_JOB = """
SELECT id, queue, task, payload, status, priority, run_at, retry_count, max_retries, result,
       error, created_at, started_at, finished_at, worker_id, cancel_requested, question, answer,
       unique_key, concurrency_key
FROM worker.jobs WHERE id = %(id)s
"""

# In the order they ran; cleanups that have yet to run (`waiting`) last.
GET_STAGES = """
SELECT stage, kind, status, output, error, attempt, started_at, finished_at
FROM worker.job_stages WHERE job_id = %(id)s ORDER BY status = 'waiting', started_at, stage
"""

# A resuming worker's read: the job's stage rows in the order `GET_STAGES` gives, each with
# the attempt that owes its cleanups (the same for every row; the subquery runs once).
LOAD_STAGES = """
SELECT stage, kind, status, output, error, attempt,
       (SELECT worker.owed_cleanup_attempt(%(id)s)) AS owed_cleanup
FROM worker.job_stages WHERE job_id = %(id)s ORDER BY status = 'waiting', started_at, stage
"""

# Retention: a bounded batch per statement, so no lock is held for long; stages and events go
# with their job (the trigger `jobs_deleted`). The fixed status list keeps live jobs out
# whatever the caller passes, and matches the partial index jobs_finished_idx; SKIP LOCKED lets
# two pruners (or an operator retrying a failed job) pass each other instead of waiting.
# `worker.history_kept` (migration 0018) keeps a workflow's jobs until all of them have ended,
# and a job until every job waiting for it has ended.
PRUNE_BATCH = """
WITH doomed AS (
    SELECT id FROM worker.jobs AS j
    WHERE status = ANY(%(statuses)s::text[]) AND finished_at < %(before)s
      AND status IN ('completed', 'failed', 'cancelled') AND NOT worker.history_kept(j)
    ORDER BY finished_at
    LIMIT %(batch)s
    FOR UPDATE SKIP LOCKED
)
DELETE FROM worker.jobs AS j USING doomed WHERE j.id = doomed.id
"""
