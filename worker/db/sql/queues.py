"""Queue controls: pause, resume, limit, and each queue's state (migration 0008).

A queue has a row in `worker.queues` once an operator paused or limited it. The claim reads
the row through `worker.queue_budget`; these statements only write it. A resume or a new limit
wakes idle workers (`worker_jobs`, the queue's name), so claims start again at once.
"""

# A queue's settings and depth, for one queue (`name`) or for all (NULL): every queue with a
# row or with live jobs. Depth counts live rows only, each status by its own partial index
# (`jobs_runnable_idx`, `jobs_processing_idx`): one `status IN (...)` would scan the history.
QUEUE_STATES = """
WITH live AS (
    SELECT queue, 1 AS pending, 0 AS processing FROM worker.jobs WHERE status = 'pending'
    UNION ALL
    SELECT queue, 0, 1 FROM worker.jobs WHERE status = 'processing'
), depth AS (
    SELECT queue, sum(pending) AS pending, sum(processing) AS processing FROM live
    WHERE CAST(%(name)s AS text) IS NULL OR queue = %(name)s
    GROUP BY queue
)
SELECT coalesce(q.name, d.queue) AS name, coalesce(q.paused, false) AS paused,
       q.concurrency, q.rate, q.burst,
       coalesce(d.pending, 0) AS pending, coalesce(d.processing, 0) AS processing
FROM (SELECT * FROM worker.queues
      WHERE CAST(%(name)s AS text) IS NULL OR name = %(name)s) AS q
FULL JOIN depth AS d ON d.queue = q.name
ORDER BY 1
"""

# Claims of the queue take nothing from their next statement on; running jobs go on.
PAUSE_QUEUE = """
INSERT INTO worker.queues (name, paused) VALUES (%(name)s, true)
ON CONFLICT (name) DO UPDATE SET paused = true, updated_at = now()
"""

RESUME_QUEUE = """
WITH resumed AS (
    UPDATE worker.queues SET paused = false, updated_at = now() WHERE name = %(name)s
    RETURNING name
)
SELECT pg_notify('worker_jobs', name) FROM resumed
"""

# NULL clears a limit. A new rate starts with a full bucket.
LIMIT_QUEUE = """
WITH limited AS (
    INSERT INTO worker.queues AS q (name, concurrency, rate, burst, tokens)
    VALUES (%(name)s, CAST(%(concurrency)s AS integer), CAST(%(rate)s AS float8),
            CAST(%(burst)s AS float8),
            coalesce(CAST(%(burst)s AS float8), greatest(CAST(%(rate)s AS float8), 1), 0))
    ON CONFLICT (name) DO UPDATE SET
        concurrency = EXCLUDED.concurrency, rate = EXCLUDED.rate, burst = EXCLUDED.burst,
        tokens = EXCLUDED.tokens, refilled_at = now(), updated_at = now()
    RETURNING name
)
SELECT pg_notify('worker_jobs', name) FROM limited
"""
