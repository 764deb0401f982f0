"""A pipeline's stage bookkeeping."""

# The stage bookkeeping of any number of running jobs in one statement, so one commit: each
# write ends a stage (`ended`, with `status`, `output`, `error`), starts one (`started`), or
# both, which stores a stage's output before the next one runs with no gap in which the attempt
# has no open stage (its cleanup would not be known to be owed). A snoozed stage keeps its
# first start, so a deadline counts from when the stage first ran (a pause does not count: a
# human may take days). The start of an attempt's first cleanup records the cleanups after it
# as `waiting` (a JSON array of names), so that cleanups never started are known to be owed.
# Rows: see `json_records`; `n` numbers them for the answer.
# Safe: only jobs this worker holds, in the attempt that writes, are written (FOR SHARE: a
# cancel waits for this commit, a rescue skips the job until its next round, and a job they
# took first is left alone); a job has one write in flight at a time, so no row is written
# twice in one statement. A job whose row another client holds locked is skipped, not waited
# for with the whole batch: it comes back with a NULL age, to be written again later.
STAGE_WRITES = """
WITH batch AS (
    SELECT * FROM json_to_recordset(CAST(%(writes)s AS json)) AS b(
        n int, job uuid, retries int, ended text, status text, output json, error text,
        started text, kind text, attempt int, waiting json)
), w AS (
    SELECT b.* FROM batch AS b JOIN worker.jobs AS j ON j.id = b.job
    WHERE j.status = 'processing' AND j.worker_id = %(worker_id)s AND j.retry_count = b.retries
    FOR SHARE OF j SKIP LOCKED
), ended AS (
    UPDATE worker.job_stages AS s SET
        status = w.status,
        output = CASE WHEN w.status = 'completed'
                      THEN coalesce(CAST(w.output AS jsonb), 'null') END,
        error = w.error,
        finished_at = CASE WHEN w.status IN ('snoozed', 'paused') THEN NULL ELSE now() END
    FROM w WHERE s.job_id = w.job AND s.stage = w.ended
), started AS (
    INSERT INTO worker.job_stages AS s (job_id, stage, kind, status, attempt)
    SELECT w.job, w.started, w.kind, 'running', w.attempt FROM w WHERE w.started IS NOT NULL
    ON CONFLICT (job_id, stage) DO UPDATE SET
        status = 'running', attempt = EXCLUDED.attempt, output = NULL, error = NULL,
        finished_at = NULL,
        started_at = CASE WHEN s.status = 'snoozed' THEN s.started_at ELSE now() END
    RETURNING s.job_id, extract(epoch FROM now() - s.started_at) AS age
), waiting AS (
    INSERT INTO worker.job_stages AS s (job_id, stage, kind, status, attempt)
    SELECT w.job, name.value, 'cleanup', 'waiting', w.attempt
    FROM w CROSS JOIN LATERAL json_array_elements_text(w.waiting) AS name(value)
    ON CONFLICT (job_id, stage) DO UPDATE SET
        status = 'waiting', attempt = EXCLUDED.attempt, output = NULL, error = NULL,
        finished_at = NULL, started_at = now()
)
SELECT w.n, coalesce(started.age, 0) FROM w LEFT JOIN started ON started.job_id = w.job
UNION ALL
SELECT b.n, NULL FROM batch AS b
WHERE NOT EXISTS (SELECT FROM w WHERE w.n = b.n)
  AND EXISTS (SELECT FROM worker.jobs AS j
              WHERE j.id = b.job AND j.status = 'processing' AND j.worker_id = %(worker_id)s
                AND j.retry_count = b.retries)
"""

# Safe: guarded as the stage writes are (status, worker_id, the attempt), so only the attempt
# that holds the job records that it failed for good. Read back by the claim (`final_error`).
RECORD_FINAL_ERROR = """
UPDATE worker.jobs AS j SET final_error = %(error)s
WHERE j.id = %(id)s
  AND j.status = 'processing' AND j.worker_id = %(worker_id)s AND j.retry_count = %(retries)s
RETURNING j.id
"""
