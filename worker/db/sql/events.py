"""Progress events: their writes and reads."""

# Safe: the per-job advisory locks (taken in hash order, so two writers cannot deadlock) are
# all held before the first id is drawn and until commit, so two workers writing events of one
# job (a rescued job whose old worker still runs) commit them in id order: a reader resuming
# after id N never misses a later-committed event with a smaller id. Events of a job that no
# longer exists are left out (no foreign key checks them, see migration 0006); the answer names
# those jobs. One NOTIFY per job.
PUBLISH_EVENTS = """
WITH e AS MATERIALIZED (
    SELECT * FROM ROWS FROM (json_to_recordset(CAST(%(events)s AS json)) AS (
        job_id uuid, step text, status text, message json, created_at timestamptz
    )) WITH ORDINALITY AS e(job_id, step, status, message, created_at, n)
), known AS MATERIALIZED (
    -- `= ANY(ARRAY(...))`: probes of the primary key, however few or many the planner expects.
    SELECT id AS job_id FROM worker.jobs WHERE id = ANY(ARRAY(SELECT DISTINCT job_id FROM e))
), locked AS (
    SELECT count(pg_advisory_xact_lock(2003138164, h)) AS n
    FROM (SELECT DISTINCT hashtext(job_id::text) AS h FROM known ORDER BY h) AS d
), ins AS (
    INSERT INTO worker.job_events (job_id, step, status, message, created_at)
    SELECT e.job_id, e.step, e.status, CAST(e.message AS jsonb), e.created_at FROM locked, e
    WHERE e.job_id IN (SELECT job_id FROM known)
    ORDER BY e.n  -- ids in publish order
)
SELECT (SELECT count(pg_notify('worker_events', job_id::text)) FROM known),
       ARRAY(SELECT DISTINCT job_id::text FROM e
             WHERE job_id NOT IN (SELECT job_id FROM known)) AS gone
"""

READ_EVENTS = """
SELECT id, job_id, step, status, message, created_at FROM worker.job_events
WHERE job_id = %(job_id)s AND id > %(after)s ORDER BY id LIMIT %(limit)s
"""
