"""The worker's hot path: the claim, and the write of each attempt's outcome."""


def _compact(statement: str) -> str:
    """The statement without its indentation and comment lines: psycopg keeps the parse of a
    statement only up to `psycopg._queries.MAX_CACHED_STATEMENT_LENGTH`, and parses a longer
    one at every run."""
    lines = (line.strip() for line in statement.splitlines())
    return "\n".join(line for line in lines if line and not line.startswith("--"))


# The claim comes in two forms, which differ only in how they pick the jobs (`next`): the
# lease before it and the writes after it are the same text in both, as is the scan of one
# queue (`tests/test_statements.py` holds them to it).
#
# Safe: SKIP LOCKED gives each pending row to exactly one claimer; the CTE fences the LIMIT
# before the UPDATE, so a worker never takes more jobs than it has free slots, nor more of a
# queue than its budget (`worker.queue_budget`, migration 0008: a pause, a concurrency limit,
# a rate); within a queue a priority is only scanned while that LIMIT is not met, so no row
# beyond it is locked.
#
# `lease`: every claim renews the worker's lease, and claims nothing if its row is gone: a
# rescuer removed it after a silent lease (a stall, a partition), and jobs it claimed now would
# look orphaned at once, to be run elsewhere while it runs them. It claims again once its
# heartbeat has registered it anew. A rescuer deleting the row meanwhile waits for the claim,
# then finds the lease fresh.
#
# The claim alone commits without waiting for its WAL to reach the disk: `set_config(...,
# true)` turns `synchronous_commit` off for this transaction only, inside the statement, so no
# session keeps the setting (a pooled connection's next transaction commits as usual). That
# costs no guarantee. A claim lost in a server crash leaves its job `pending`, its attempt
# unchanged; the worker that held it can write nothing for it, since every outcome and stage
# write is guarded by `processing` AND its worker id AND the attempt (the outcome guard), and the
# job runs again: the at-least-once a worker crash gives. Enqueues, outcomes and stage writes
# keep waiting for the flush: losing one of those would lose a job or a finished result.
#
# `next`, for one queue: its due pending jobs in claim order (priority; within it, jobs started
# before ahead of jobs never started; then due time), locked: at most the queue's budget of
# them (what `worker.queue_budget` allows), none whose concurrency key is at its task's limit
# (`worker.concurrency_key_free`, 1 for a task that sets none), and, while the budget is
# spent, the jobs that only settle (their cancel was requested, or an attempt failed them for
# good before their cleanups ran: `j.cancel_requested OR j.final_error IS NOT NULL`), which no
# pause, limit or concurrency key holds back.
#
# Work already started comes first: a snoozed stage polling for its export, a retry or a
# rescued job would otherwise wait behind every job enqueued before it became due again, and a
# backlog of new jobs would starve it past its deadline.
#
# Two short scans of jobs_runnable_idx per priority present, highest first: the started jobs',
# then the new jobs' (the second runs only if the first held too few), each stopping at the
# first job not due yet; the next priority is found by one index probe, and only if the ones
# before held too few due jobs. A queue with fewer due jobs than the claim's limit (an idle
# one) costs a probe and two scans per priority its pending jobs use, due or not: at most 201
# (`PRIORITY_RANGE`), usually one or two. One ordered scan of the whole queue instead would
# walk every job due later, however many are scheduled for tomorrow.
#
# Only the tasks the worker registered (`tasks`) are claimed, in both branches: a job of
# another task waits for a worker that has it (a newer release in a rolling deploy), never
# failed for a name this one lacks; the claimer of a job that only settles runs its cleanups,
# so it needs the task too. Such a job shows in `worker.unserved_tasks` while no live worker
# serves it.
# A job this worker still runs, or whose outcome it has not written yet, is skipped (`running`):
# after a missed lease a rescued job waits for its old attempt here to end, or goes to another
# worker; never two attempts at once. A job whose claim a server crash lost (its attempt
# unchanged) is not claimed again here before the old attempt's outcome is refused.
#
# `claimed`: what a claim does with the jobs `next` picked: mark them ours and, for a pipeline
# job with no stage row yet, start its first stage in the same commit. The jobs are found by
# primary key probes (`= ANY(ARRAY(...))`) whatever the limit: the claim runs on a plan made
# for any limit (`worker.db.postgres.claim_pool`), and a join alone would then hash the whole
# table. `started_at` is the moment the row is taken, not the statement's start: a claim that
# waited (a key's lock, a busy server) takes a job once the job before it on its key has
# finished.
#
# A worker of one queue (the usual case) claims with the scans of that queue alone: on an idle
# queue its round trip is shorter than the several-queue form's.
CLAIM_ONE_QUEUE = _compact(
    """
WITH lease AS (
    UPDATE worker.workers SET heartbeat_at = now() WHERE id = %(worker_id)s
    RETURNING id, set_config('synchronous_commit', 'off', true) AS commit_mode
), budget AS (
    SELECT worker.queue_budget((%(queues)s::text[])[1], %(limit)s) AS n
), next AS (
    WITH RECURSIVE level AS (
        (SELECT priority FROM worker.jobs
         WHERE status = 'pending' AND queue = (%(queues)s::text[])[1]
           AND EXISTS (SELECT FROM lease)
         ORDER BY priority DESC LIMIT 1)
        UNION ALL
        SELECT (SELECT j.priority FROM worker.jobs AS j
                WHERE j.status = 'pending' AND j.queue = (%(queues)s::text[])[1]
                  AND j.priority < level.priority
                ORDER BY j.priority DESC LIMIT 1)
        FROM level WHERE level.priority IS NOT NULL
    )
    (SELECT d.* FROM level CROSS JOIN LATERAL (
        -- A priority's started jobs, then its new ones: the phases loop inside the level, so
        -- no plan can take every level's started jobs before a higher level's new ones.
        SELECT p.* FROM (VALUES (false), (true)) AS phase(fresh) CROSS JOIN LATERAL (
            SELECT id, priority, run_at, error, started_at IS NULL AS fresh
            FROM worker.jobs AS j
            WHERE j.status = 'pending' AND j.queue = (%(queues)s::text[])[1]
              AND j.priority = level.priority
              AND (j.started_at IS NULL) = phase.fresh
              AND j.run_at <= now() AND j.id <> ALL(%(running)s::uuid[])
              AND j.task = ANY(%(tasks)s::text[])
              AND EXISTS (SELECT FROM lease)
              AND CASE WHEN j.concurrency_key IS NULL
                            OR (j.cancel_requested OR j.final_error IS NOT NULL) THEN true
                       ELSE worker.concurrency_key_free(j.concurrency_key, coalesce(
                           (SELECT m.n FROM unnest(%(key_tasks)s::text[], %(key_limits)s::int[])
                                AS m(task, n) WHERE m.task = j.task), 1)) END
            ORDER BY j.run_at
            LIMIT (SELECT n FROM budget)
            FOR UPDATE SKIP LOCKED
        ) AS p
        LIMIT (SELECT n FROM budget)
    ) AS d
    LIMIT (SELECT n FROM budget))
    UNION ALL
    SELECT s.* FROM (
        SELECT id, priority, run_at, error, started_at IS NULL AS fresh FROM worker.jobs AS j
        WHERE (SELECT n FROM budget) = 0 AND j.status = 'pending'
          AND j.queue = (%(queues)s::text[])[1]
          AND (j.cancel_requested OR j.final_error IS NOT NULL)
          AND j.run_at <= now() AND j.id <> ALL(%(running)s::uuid[])
          AND j.task = ANY(%(tasks)s::text[])
          AND EXISTS (SELECT FROM lease)
        LIMIT %(limit)s
        FOR UPDATE SKIP LOCKED
    ) AS s
), claimed AS (
    UPDATE worker.jobs AS j
    SET status = 'processing', worker_id = %(worker_id)s, started_at = clock_timestamp(),
        error = NULL
    FROM next WHERE j.id = ANY(ARRAY(SELECT id FROM next)) AND j.id = next.id
    RETURNING j.id, j.task, j.payload, j.queue, j.priority, j.retry_count,
              coalesce(j.max_retries,
                       (SELECT m.n FROM unnest(%(retry_tasks)s::text[], %(retry_limits)s::int[])
                            AS m(task, n) WHERE m.task = j.task),
                       %(default_max_retries)s) AS max_retries,
              j.cancel_requested, j.answer, next.error AS last_error, j.final_error,
              j.trace_context, j.workflow_id
), first_stage AS (
    -- A pipeline job with no stage row yet starts its first stage with the claim: one commit
    -- less per job. Jobs that will not run (as `settled_before_start`) get no row. Only the
    -- claimer writes a job's stages: it holds the job's row.
    INSERT INTO worker.job_stages (job_id, stage, kind, status, attempt)
    SELECT c.id, p.stage, 'stage', 'running', c.retry_count + 1
    FROM claimed AS c
    JOIN unnest(%(pipelines)s::text[], %(first_stages)s::text[]) AS p(task, stage)
        ON p.task = c.task
    WHERE NOT c.cancel_requested AND c.retry_count <= c.max_retries
      AND NOT EXISTS (SELECT FROM worker.job_stages AS s WHERE s.job_id = c.id)
    ON CONFLICT (job_id, stage) DO NOTHING
    RETURNING job_id
), spent AS (
    -- A rate-limited queue's bucket pays for the jobs claimed from it: `worker.queue_budget`
    -- locked its row, so no other claim spends meanwhile.
    UPDATE worker.queues AS q
    SET tokens = worker.queue_tokens(q) - c.n, refilled_at = now()
    FROM (SELECT queue, count(*) AS n FROM claimed GROUP BY queue) AS c
    WHERE q.name = c.queue AND q.rate IS NOT NULL
)
-- In claim order: the worker starts jobs it claimed ahead of its free slots in this order.
-- A job of a workflow reads its parents' results with its claim (`worker.parent_results`).
SELECT c.*, c.id IN (SELECT job_id FROM first_stage) AS first_stage_started,
       CASE WHEN c.workflow_id IS NOT NULL THEN worker.parent_results(c.id) END AS parents
FROM claimed AS c JOIN next ON next.id = c.id
ORDER BY next.priority DESC, next.fresh, next.run_at
"""
)

# The same for a worker of several queues: the scans of each queue (`queue = ANY(...)` cannot
# use the index order, and sorting every pending row would make each claim cost O(backlog)).
# Rows a queue locked beyond the outer LIMIT are released at commit.
CLAIM = _compact(
    """
WITH lease AS (
    UPDATE worker.workers SET heartbeat_at = now() WHERE id = %(worker_id)s
    RETURNING id, set_config('synchronous_commit', 'off', true) AS commit_mode
), next AS (
    SELECT c.* FROM unnest(%(queues)s::text[]) AS q(name)
    CROSS JOIN LATERAL (SELECT worker.queue_budget(q.name, %(limit)s) AS n) AS budget
    CROSS JOIN LATERAL (
        WITH RECURSIVE level AS (
            (SELECT priority FROM worker.jobs
             WHERE status = 'pending' AND queue = q.name
               AND EXISTS (SELECT FROM lease)
             ORDER BY priority DESC LIMIT 1)
            UNION ALL
            SELECT (SELECT j.priority FROM worker.jobs AS j
                    WHERE j.status = 'pending' AND j.queue = q.name
                      AND j.priority < level.priority
                    ORDER BY j.priority DESC LIMIT 1)
            FROM level WHERE level.priority IS NOT NULL
        )
        (SELECT d.* FROM level CROSS JOIN LATERAL (
            -- A priority's started jobs, then its new ones: the phases loop inside the level, so
            -- no plan can take every level's started jobs before a higher level's new ones.
            SELECT p.* FROM (VALUES (false), (true)) AS phase(fresh) CROSS JOIN LATERAL (
                SELECT id, priority, run_at, error, started_at IS NULL AS fresh
                FROM worker.jobs AS j
                WHERE j.status = 'pending' AND j.queue = q.name
                  AND j.priority = level.priority
                  AND (j.started_at IS NULL) = phase.fresh
                  AND j.run_at <= now() AND j.id <> ALL(%(running)s::uuid[])
                  AND j.task = ANY(%(tasks)s::text[])
                  AND EXISTS (SELECT FROM lease)
                  AND CASE WHEN j.concurrency_key IS NULL
                                OR (j.cancel_requested OR j.final_error IS NOT NULL) THEN true
                           ELSE worker.concurrency_key_free(j.concurrency_key, coalesce(
                               (SELECT m.n
                                FROM unnest(%(key_tasks)s::text[], %(key_limits)s::int[])
                                    AS m(task, n) WHERE m.task = j.task), 1)) END
                ORDER BY j.run_at
                LIMIT budget.n
                FOR UPDATE SKIP LOCKED
            ) AS p
            LIMIT budget.n
        ) AS d
        LIMIT budget.n)
        UNION ALL
        SELECT s.* FROM (
            SELECT id, priority, run_at, error, started_at IS NULL AS fresh FROM worker.jobs AS j
            WHERE budget.n = 0 AND j.status = 'pending'
              AND j.queue = q.name
              AND (j.cancel_requested OR j.final_error IS NOT NULL)
              AND j.run_at <= now() AND j.id <> ALL(%(running)s::uuid[])
              AND j.task = ANY(%(tasks)s::text[])
              AND EXISTS (SELECT FROM lease)
            LIMIT %(limit)s
            FOR UPDATE SKIP LOCKED
        ) AS s
    ) AS c
    ORDER BY c.priority DESC, c.fresh, c.run_at
    LIMIT %(limit)s
), claimed AS (
    UPDATE worker.jobs AS j
    SET status = 'processing', worker_id = %(worker_id)s, started_at = clock_timestamp(),
        error = NULL
    FROM next WHERE j.id = ANY(ARRAY(SELECT id FROM next)) AND j.id = next.id
    RETURNING j.id, j.task, j.payload, j.queue, j.priority, j.retry_count,
              coalesce(j.max_retries,
                       (SELECT m.n FROM unnest(%(retry_tasks)s::text[], %(retry_limits)s::int[])
                            AS m(task, n) WHERE m.task = j.task),
                       %(default_max_retries)s) AS max_retries,
              j.cancel_requested, j.answer, next.error AS last_error, j.final_error,
              j.trace_context, j.workflow_id
), first_stage AS (
    -- A pipeline job with no stage row yet starts its first stage with the claim: one commit
    -- less per job. Jobs that will not run (as `settled_before_start`) get no row. Only the
    -- claimer writes a job's stages: it holds the job's row.
    INSERT INTO worker.job_stages (job_id, stage, kind, status, attempt)
    SELECT c.id, p.stage, 'stage', 'running', c.retry_count + 1
    FROM claimed AS c
    JOIN unnest(%(pipelines)s::text[], %(first_stages)s::text[]) AS p(task, stage)
        ON p.task = c.task
    WHERE NOT c.cancel_requested AND c.retry_count <= c.max_retries
      AND NOT EXISTS (SELECT FROM worker.job_stages AS s WHERE s.job_id = c.id)
    ON CONFLICT (job_id, stage) DO NOTHING
    RETURNING job_id
), spent AS (
    -- A rate-limited queue's bucket pays for the jobs claimed from it: `worker.queue_budget`
    -- locked its row, so no other claim spends meanwhile.
    UPDATE worker.queues AS q
    SET tokens = worker.queue_tokens(q) - c.n, refilled_at = now()
    FROM (SELECT queue, count(*) AS n FROM claimed GROUP BY queue) AS c
    WHERE q.name = c.queue AND q.rate IS NOT NULL
)
-- In claim order: the worker starts jobs it claimed ahead of its free slots in this order.
-- A job of a workflow reads its parents' results with its claim (`worker.parent_results`).
SELECT c.*, c.id IN (SELECT job_id FROM first_stage) AS first_stage_started,
       CASE WHEN c.workflow_id IS NOT NULL THEN worker.parent_results(c.id) END AS parents
FROM claimed AS c JOIN next ON next.id = c.id
ORDER BY next.priority DESC, next.fresh, next.run_at
"""
)

# Safe: guarded by the outcome guard (processing, ours, in the attempt that
# claimed it), so a job rescued from this worker (then finished by another, or claimed again by
# this one) is never overwritten by the attempt the rescue ended; the NOTIFY is sent at commit,
# after the rows are visible, so a waiter woken by it reads the final state.
# `outcome` is completed | retry | failed | cancelled | paused | snoozed | waiting. A retry
# becomes pending while fewer than the attempt's `max_retries` were made (as its claim read
# them: the job's own, else its task's, else the worker's), else failed; it waits for the delay
# its task chose, or else the worker's backoff with jitter. `stage`, if not NULL,
# is a pipeline stage that finished with the attempt: it is recorded in the same statement (one
# commit less per job), only where `done` took the outcome (the job is ours). Rows: see
# `json_records` (a JSON null result or output arrives as SQL NULL, hence the coalesce).
# A job waiting for the children it spawned is `held`; the trigger `jobs_awaiting_children`
# (migration 0017) settles it in this transaction, once it has counted its children.
# A retry, snooze, pause or wait that meets a cancel request (it landed after the job's last
# look) is due at once instead: the next claim settles it cancelled, after the cleanup it owes.
# (The cancel request is read from the row being updated, so one committed meanwhile is seen.)
# A job whose row another client holds locked (an operator's open transaction) is skipped, not
# waited for: the batch goes through, and the job comes back with a NULL status, to be written
# again later (it is still ours, in this attempt). NO KEY UPDATE: the lock the UPDATE takes.
RECORD_OUTCOMES = _compact(
    """
WITH r AS (
    SELECT * FROM json_to_recordset(CAST(%(outcomes)s AS json)) AS r(
        id uuid, retries int, max_retries int, outcome text, result json, error text,
        delay float8,
        stage text, stage_status text, stage_output json)
), mine AS MATERIALIZED (
    SELECT j.id FROM worker.jobs AS j JOIN r ON r.id = j.id
    WHERE j.status = 'processing' AND j.worker_id = %(worker_id)s AND j.retry_count = r.retries
    FOR NO KEY UPDATE OF j SKIP LOCKED
), done AS (
    UPDATE worker.jobs AS j SET
        status = CASE
            WHEN r.outcome IN ('retry', 'snoozed', 'paused', 'waiting') AND j.cancel_requested
            THEN 'pending'
            WHEN r.outcome = 'retry' THEN
                CASE WHEN j.retry_count < r.max_retries
                     THEN 'pending' ELSE 'failed' END
            WHEN r.outcome = 'snoozed' THEN 'pending'
            WHEN r.outcome = 'waiting' THEN 'held'
            ELSE r.outcome END,
        retry_count = j.retry_count + CASE
            WHEN r.outcome = 'retry' AND NOT j.cancel_requested
                 AND j.retry_count < r.max_retries
            THEN 1 ELSE 0 END,
        run_at = CASE
            WHEN r.outcome IN ('retry', 'snoozed', 'paused', 'waiting') AND j.cancel_requested
            THEN now()
            WHEN r.outcome = 'retry' THEN now() + make_interval(secs => coalesce(r.delay,
                least(%(backoff_max)s, %(backoff_base)s * power(2, j.retry_count))
                * (0.5 + random() / 2)))
            WHEN r.outcome = 'snoozed' THEN now() + make_interval(secs => r.delay)
            ELSE j.run_at END,
        result = CASE WHEN r.outcome = 'completed' THEN coalesce(CAST(r.result AS jsonb), 'null')
                      ELSE j.result END,
        question = CASE WHEN r.outcome = 'paused' THEN coalesce(CAST(r.result AS jsonb), 'null')
                        ELSE j.question END,
        error = coalesce(r.error, CASE WHEN r.outcome = 'snoozed' THEN j.error END),
        finished_at = CASE WHEN r.outcome IN ('completed', 'failed', 'cancelled') THEN now()
                           WHEN r.outcome = 'retry' AND NOT j.cancel_requested
                                AND j.retry_count >= r.max_retries
                           THEN now() END
    FROM r JOIN mine ON mine.id = r.id
    -- By primary key alone: `mine` checked the guard on the rows it locked, and they stay
    -- locked. With the guard here too, the planner would look each job up through
    -- jobs_processing_idx, reading all this worker's entries for every job written.
    WHERE j.id = mine.id
    RETURNING j.id, j.status, j.task, j.queue, j.retry_count, j.started_at
), stage_done AS (
    UPDATE worker.job_stages AS s SET
        status = r.stage_status,
        output = CASE WHEN r.stage_status = 'completed'
                      THEN coalesce(CAST(r.stage_output AS jsonb), 'null') END,
        error = CASE WHEN r.stage_status <> 'completed' THEN r.error END,
        finished_at = now()
    FROM r JOIN done ON done.id = r.id
    WHERE s.job_id = r.id AND s.stage = r.stage
)
SELECT id, status, task, queue, retry_count,
       extract(epoch FROM now() - started_at) AS duration,
       pg_notify('worker_done', id::text) IS NULL AS _
FROM done
UNION ALL
SELECT r.id, NULL, NULL, NULL, NULL, NULL, NULL FROM r
WHERE NOT EXISTS (SELECT FROM mine WHERE mine.id = r.id)
  AND EXISTS (SELECT FROM worker.jobs AS j
              WHERE j.id = r.id AND j.status = 'processing' AND j.worker_id = %(worker_id)s
                AND j.retry_count = r.retries)
"""
)
