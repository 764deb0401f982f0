"""Every statement that moves a job, in one place.

Parameters use psycopg's `%(name)s` style; the client runs these through SQLAlchemy's
`exec_driver_sql`, the daemon through psycopg directly. Each statement that can race another
says in one line why it is safe.
"""

# -- enqueue ------------------------------------------------------------------------------

# The statement trigger `worker.jobs_notify` sends one NOTIFY per inserting transaction and queue,
# delivered at commit: in the caller's transaction, no worker sees or hears of the job before.
# Casts are written CAST(x AS t) so the client can run this on any driver's connection. The
# client makes the id (time-ordered, like the column default), so a retry can be idempotent.
ENQUEUE = """
INSERT INTO worker.jobs (id, task, payload, queue, priority, run_at, max_retries)
VALUES (CAST(%(id)s AS uuid), %(task)s, CAST(%(payload)s AS jsonb), %(queue)s,
        CAST(%(priority)s AS smallint),
        coalesce(CAST(%(run_at)s AS timestamptz),
                 now() + make_interval(secs => CAST(%(delay)s AS float8))),
        CAST(%(max_retries)s AS integer))
RETURNING id, run_at
"""

# ENQUEUE again after the connection died with the outcome unknown: if the first try did commit,
# its row (same id) stands and nothing is inserted twice; `run_at` is read back either way.
ENQUEUE_AGAIN = """
WITH ins AS (
    INSERT INTO worker.jobs (id, task, payload, queue, priority, run_at, max_retries)
    VALUES (CAST(%(id)s AS uuid), %(task)s, CAST(%(payload)s AS jsonb), %(queue)s,
            CAST(%(priority)s AS smallint),
            coalesce(CAST(%(run_at)s AS timestamptz),
                     now() + make_interval(secs => CAST(%(delay)s AS float8))),
            CAST(%(max_retries)s AS integer))
    ON CONFLICT (id) DO NOTHING
    RETURNING id, run_at
)
SELECT id, run_at FROM ins
UNION ALL
SELECT id, run_at FROM worker.jobs WHERE id = CAST(%(id)s AS uuid) AND NOT EXISTS (SELECT FROM ins)
"""

# One statement (one round trip) for any number of jobs: one JSON array of rows, unpacked
# server-side (much cheaper for the client to build than parallel arrays, whose text form it
# must escape element by element); one NOTIFY per queue for the whole batch. The client makes
# the ids, so each handle matches its row whatever order the rows are written in. A row:
# {"i": id, "t": task, "p": payload object, "q": queue, "pr": priority, "ra": run_at or null,
#  "d": delay seconds, "mr": max_retries or null}. Used in a caller's transaction (any driver)
# and for batches with waiting jobs; other batches go by ENQUEUE_MANY_COPY.
ENQUEUE_MANY = """
INSERT INTO worker.jobs (id, task, payload, queue, priority, run_at, max_retries)
SELECT i, t, CAST(p AS jsonb), q, pr, coalesce(ra, now() + make_interval(secs => d)), mr
FROM json_to_recordset(CAST(%(jobs)s AS json))
    AS x(i uuid, t text, p json, q text, pr smallint, ra timestamptz, d float8, mr integer)
"""

# A batch of jobs that all run now, on the client's own connection: COPY, about a sixth
# quicker than ENQUEUE_MANY at 1,000 jobs. The columns left out take their defaults: `pending`,
# and run_at now() from the server's clock. Rows are tab-separated text (`_Batch.copy_rows`).
# Like an INSERT, it fires the statement trigger: one NOTIFY per queue, at commit.
ENQUEUE_MANY_COPY = "COPY worker.jobs (id, task, payload, queue, priority, max_retries) FROM STDIN"

# ENQUEUE_MANY (or its COPY) again after the connection died with the outcome unknown: the batch
# is one statement, so it committed whole or not at all; the ids make the second try a no-op if
# it did.
ENQUEUE_MANY_AGAIN = ENQUEUE_MANY + "ON CONFLICT (id) DO NOTHING\n"

# -- the worker's hot path ----------------------------------------------------------------

# Every claim renews the worker's lease, and claims nothing if its row is gone: a rescuer
# removed it after a silent lease (a stall, a partition), and jobs it claimed now would look
# orphaned at once, to be run elsewhere while it runs them. It claims again once its heartbeat
# has registered it anew. A rescuer deleting the row meanwhile waits for the claim, then finds
# the lease fresh.
_LEASE = """
WITH lease AS (
    UPDATE worker.workers SET heartbeat_at = now() WHERE id = %(worker_id)s RETURNING id
)"""

# What a claim does with the jobs its `next` CTE picked: mark them ours and, for a pipeline
# job with no stage row yet, start its first stage in the same commit. The jobs are found by
# primary key probes (`= ANY(ARRAY(...))`) whatever the limit: the claim runs on a plan made
# for any limit (`daemon.db.claim_pool`), and a join alone would then hash the whole table.
_CLAIMED = """), claimed AS (
    UPDATE worker.jobs AS j
    SET status = 'processing', worker_id = %(worker_id)s, started_at = now(), error = NULL
    FROM next WHERE j.id = ANY(ARRAY(SELECT id FROM next)) AND j.id = next.id
    RETURNING j.id, j.task, j.payload, j.queue, j.priority, j.retry_count,
              coalesce(j.max_retries, %(default_max_retries)s) AS max_retries,
              j.cancel_requested, j.answer, next.error AS last_error, j.final_error
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
)
-- In claim order: the worker starts jobs it claimed ahead of its free slots in this order.
SELECT c.*, c.id IN (SELECT job_id FROM first_stage) AS first_stage_started
FROM claimed AS c JOIN next ON next.id = c.id
ORDER BY next.priority DESC, next.run_at
"""


def _due(queue: str) -> str:
    """The due pending jobs of one queue in claim order (priority, then due time), locked.

    One short scan of jobs_runnable_idx per priority present, highest first, each stopping at
    the first job not due yet; the next priority is found by one index probe, and only if the
    ones before held too few due jobs. A queue with fewer due jobs than the claim's limit (an
    idle one) costs a probe and a scan per priority its pending jobs use, due or not: at most
    201 (`PRIORITY_RANGE`), usually one or two. One ordered scan of the whole queue instead
    walked every job due later (9 ms per claim with 200,000 jobs due tomorrow).
    """
    return f"""
    WITH RECURSIVE level AS (
        (SELECT priority FROM worker.jobs
         WHERE status = 'pending' AND queue = {queue} AND EXISTS (SELECT FROM lease)
         ORDER BY priority DESC LIMIT 1)
        UNION ALL
        SELECT (SELECT j.priority FROM worker.jobs AS j
                WHERE j.status = 'pending' AND j.queue = {queue} AND j.priority < level.priority
                ORDER BY j.priority DESC LIMIT 1)
        FROM level WHERE level.priority IS NOT NULL
    )
    SELECT d.* FROM level CROSS JOIN LATERAL (
        SELECT id, priority, run_at, error FROM worker.jobs AS j
        WHERE j.status = 'pending' AND j.queue = {queue} AND j.priority = level.priority
          AND j.run_at <= now() AND j.id <> ALL(%(running)s::uuid[])
          AND EXISTS (SELECT FROM lease)
        ORDER BY j.run_at
        LIMIT %(limit)s
        FOR UPDATE SKIP LOCKED
    ) AS d
    LIMIT %(limit)s"""


# Safe: SKIP LOCKED gives each pending row to exactly one claimer; the CTE fences the LIMIT
# before the UPDATE, so a worker never takes more jobs than it has free slots; within a queue
# a priority is only scanned while that LIMIT is not met, so no row beyond it is locked.
# A job this worker still runs is skipped (`running`): after a missed lease a rescued job
# waits for its old attempt here to end, or goes to another worker; never two attempts at once.
# A worker of one queue (the usual case) claims with the scans of that queue alone: on an idle
# queue its round trip is about 0.8 ms shorter than the several-queue form's.
CLAIM_ONE_QUEUE = _LEASE + ", next AS (" + _due("(%(queues)s::text[])[1]") + _CLAIMED

# The same for a worker of several queues: the scans of each queue (`queue = ANY(...)` cannot
# use the index order, and sorting every pending row made each claim cost O(backlog): 50 ms vs
# 0.6 ms at 10,000 pending). Rows a queue locked beyond the outer LIMIT are released at commit.
CLAIM = (
    _LEASE
    + """, next AS (
    SELECT c.* FROM unnest(%(queues)s::text[]) AS q(name) CROSS JOIN LATERAL ("""
    + _due("q.name")
    + """
    ) AS c
    ORDER BY c.priority DESC, c.run_at
    LIMIT %(limit)s
"""
    + _CLAIMED
)

# Safe: guarded by status = 'processing', worker_id = us and the attempt (`retry_count` as
# claimed), so a job rescued from this worker (then finished by another, or claimed again by
# this one) is never overwritten by the attempt the rescue ended; the NOTIFY is sent at commit,
# after the rows are visible, so a waiter woken by it reads the final state.
# `outcome` is completed | retry | failed | cancelled | paused | snoozed. A retry becomes
# pending after a backoff with jitter while retries remain, else failed. `stage`, if not NULL,
# is a pipeline stage that finished with the attempt: it is recorded in the same statement (one
# commit less per job), only where `done` took the outcome (the job is ours). Rows: see
# `json_records` (a JSON null result or output arrives as SQL NULL, hence the coalesce).
# A retry, snooze or pause that meets a cancel request (it landed after the job's last look)
# is due at once instead: the next claim settles it cancelled, after the cleanup it owes. (The
# cancel request is read from the row being updated, so one committed meanwhile is seen.)
# A job whose row another client holds locked (an operator's open transaction) is skipped, not
# waited for: the batch goes through, and the job comes back with a NULL status, to be written
# again later (it is still ours, in this attempt). NO KEY UPDATE: the lock the UPDATE takes.
RECORD_OUTCOMES = """
WITH r AS (
    SELECT * FROM json_to_recordset(CAST(%(outcomes)s AS json)) AS r(
        id uuid, retries int, outcome text, result json, error text, delay float8,
        stage text, stage_status text, stage_output json)
), mine AS MATERIALIZED (
    SELECT j.id FROM worker.jobs AS j JOIN r ON r.id = j.id
    WHERE j.status = 'processing' AND j.worker_id = %(worker_id)s AND j.retry_count = r.retries
    FOR NO KEY UPDATE OF j SKIP LOCKED
), done AS (
    UPDATE worker.jobs AS j SET
        status = CASE
            WHEN r.outcome IN ('retry', 'snoozed', 'paused') AND j.cancel_requested
            THEN 'pending'
            WHEN r.outcome = 'retry' THEN
                CASE WHEN j.retry_count < coalesce(j.max_retries, %(default_max_retries)s)
                     THEN 'pending' ELSE 'failed' END
            WHEN r.outcome = 'snoozed' THEN 'pending'
            ELSE r.outcome END,
        retry_count = j.retry_count + CASE
            WHEN r.outcome = 'retry' AND NOT j.cancel_requested
                 AND j.retry_count < coalesce(j.max_retries, %(default_max_retries)s)
            THEN 1 ELSE 0 END,
        run_at = CASE
            WHEN r.outcome IN ('retry', 'snoozed', 'paused') AND j.cancel_requested
            THEN now()
            WHEN r.outcome = 'retry' THEN now() + make_interval(secs => least(
                %(backoff_max)s, %(backoff_base)s * power(2, j.retry_count)) * (0.5 + random() / 2))
            WHEN r.outcome = 'snoozed' THEN now() + make_interval(secs => r.delay)
            ELSE j.run_at END,
        result = CASE WHEN r.outcome = 'completed' THEN coalesce(CAST(r.result AS jsonb), 'null')
                      ELSE j.result END,
        question = CASE WHEN r.outcome = 'paused' THEN coalesce(CAST(r.result AS jsonb), 'null')
                        ELSE j.question END,
        error = coalesce(r.error, CASE WHEN r.outcome = 'snoozed' THEN j.error END),
        finished_at = CASE WHEN r.outcome IN ('completed', 'failed', 'cancelled') THEN now()
                           WHEN r.outcome = 'retry' AND NOT j.cancel_requested
                                AND j.retry_count >= coalesce(j.max_retries,
                                                              %(default_max_retries)s)
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
  AND EXISTS (SELECT FROM worker.jobs AS j WHERE j.id = r.id AND j.status = 'processing'
              AND j.worker_id = %(worker_id)s AND j.retry_count = r.retries)
"""

# -- liveness -----------------------------------------------------------------------------

REGISTER_WORKER = """
INSERT INTO worker.workers (id, hostname, pid, queues, concurrency)
VALUES (%(id)s, %(hostname)s, %(pid)s, %(queues)s, %(concurrency)s)
ON CONFLICT (id) DO UPDATE SET heartbeat_at = now()
"""

# One row per worker, not per job: the heartbeat is the lease on every job the worker holds.
HEARTBEAT = "UPDATE worker.workers SET heartbeat_at = now() WHERE id = %(id)s"

DEREGISTER_WORKER = "DELETE FROM worker.workers WHERE id = %(id)s"

# Safe: only workers silent for a whole lease are removed, and a live worker beats every
# lease/3; SKIP LOCKED lets two rescuers split the orphans instead of waiting on each other.
# A rescued job counts the lost attempt; the claim decides what to do when none remain.
RESCUE = """
WITH dead AS (
    DELETE FROM worker.workers
    WHERE heartbeat_at < now() - make_interval(secs => %(lease)s)
    RETURNING id
), orphans AS (
    SELECT j.id FROM worker.jobs AS j
    WHERE j.status = 'processing'
      AND (j.worker_id IN (SELECT id FROM dead)
           OR NOT EXISTS (SELECT 1 FROM worker.workers AS w WHERE w.id = j.worker_id))
    FOR UPDATE SKIP LOCKED
)
UPDATE worker.jobs AS j
SET status = 'pending', retry_count = j.retry_count + 1, run_at = now(),
    error = 'the worker running this job was lost (no heartbeat for '
            || %(lease)s::text || ' s)'
FROM orphans WHERE j.id = orphans.id
RETURNING j.id, j.task, j.queue, pg_notify('worker_jobs', j.queue) IS NULL AS _
"""

# Read-only (jobs_processing_idx): what the database says this worker holds. After a claim whose
# answer was lost, the jobs here that the worker does not run are handed back with RELEASE.
HELD_JOBS = """
SELECT id FROM worker.jobs WHERE status = 'processing' AND worker_id = %(worker_id)s
"""

# A clean stop (or a claim whose answer was lost) hands unfinished jobs back without counting
# an attempt. Safe: guarded by status and worker_id, so a job already finished or rescued from
# this worker is left alone.
RELEASE = """
UPDATE worker.jobs SET status = 'pending', run_at = now()
WHERE status = 'processing' AND worker_id = %(worker_id)s AND id = ANY(%(ids)s::uuid[])
RETURNING id, pg_notify('worker_jobs', queue) IS NULL AS _
"""

# -- operator actions ---------------------------------------------------------------------

# Safe: the row lock orders this against a claim and an outcome. A job that is not running
# and owes no ALL_DONE cleanup is cancelled at once. A running job only gets the request (a
# worker honours it at the next stage boundary, then runs the cleanup). A waiting job whose
# stages ran without their cleanup (paused, snoozed, rescued) goes back to a worker at once,
# which runs only that cleanup and settles it cancelled. "Owes" mirrors
# `Pipeline._unclean_attempt`: a stage row newer than the oldest finished cleanup (a cleanup
# not run yet is `waiting` from its attempt's first cleanup on, so none is missed for lack of
# a row).
CANCEL = """
WITH target AS (
    SELECT j.id, j.status,
           EXISTS (
               SELECT 1 FROM worker.job_stages AS s
               WHERE s.job_id = j.id AND s.kind = 'stage' AND s.attempt > coalesce(
                   (SELECT min(CASE WHEN c.status IN ('running', 'waiting') THEN 0
                                    ELSE c.attempt END)
                    FROM worker.job_stages AS c WHERE c.job_id = j.id AND c.kind = 'cleanup'),
                   0)
           ) AS owes_cleanup
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
    WHERE j.id = t.id AND t.status IN ('pending', 'paused', 'processing')
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
RETRY = """
WITH job AS (
    UPDATE worker.jobs SET status = 'pending', retry_count = 0, run_at = now(),
           finished_at = NULL, cancel_requested = false, error = NULL, final_error = NULL
    WHERE id = %(id)s AND status IN ('failed', 'cancelled')
    RETURNING id, queue
), renumbered AS (
    UPDATE worker.job_stages AS s SET attempt = 0 FROM job WHERE s.job_id = job.id
)
SELECT id, pg_notify('worker_jobs', queue) IS NULL AS _ FROM job
"""

JOB_STATUS = "SELECT status FROM worker.jobs WHERE id = %(id)s"

GET_JOB = """
SELECT id, queue, task, payload, status, priority, run_at, retry_count, max_retries, result,
       error, created_at, started_at, finished_at, worker_id, cancel_requested, question, answer
FROM worker.jobs WHERE id = %(id)s
"""

# In the order they ran; cleanups that have yet to run (`waiting`) last.
GET_STAGES = """
SELECT stage, kind, status, output, error, attempt, started_at, finished_at
FROM worker.job_stages WHERE job_id = %(id)s ORDER BY status = 'waiting', started_at, stage
"""

# Retention: a bounded batch per statement, so no lock is held for long; stages and events go
# with their job (the trigger `jobs_deleted`). The fixed status list keeps live jobs out
# whatever the caller passes, and matches the partial index jobs_finished_idx; SKIP LOCKED lets
# two pruners (or an operator retrying a failed job) pass each other instead of waiting.
PRUNE_BATCH = """
WITH doomed AS (
    SELECT id FROM worker.jobs
    WHERE status = ANY(%(statuses)s::text[]) AND finished_at < %(before)s
      AND status IN ('completed', 'failed', 'cancelled')
    ORDER BY finished_at
    LIMIT %(batch)s
    FOR UPDATE SKIP LOCKED
)
DELETE FROM worker.jobs AS j USING doomed WHERE j.id = doomed.id
"""

# -- stages -------------------------------------------------------------------------------

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
  AND EXISTS (SELECT FROM worker.jobs AS j WHERE j.id = b.job AND j.status = 'processing'
              AND j.worker_id = %(worker_id)s AND j.retry_count = b.retries)
"""

# Safe: guarded as the stage writes are (status, worker_id, the attempt), so only the attempt
# that holds the job records that it failed for good. Read back by the claim (`final_error`).
RECORD_FINAL_ERROR = """
UPDATE worker.jobs SET final_error = %(error)s
WHERE id = %(id)s AND status = 'processing' AND worker_id = %(worker_id)s
  AND retry_count = %(retries)s
RETURNING id
"""

# -- progress events ----------------------------------------------------------------------

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

# -- the HTTP edge (read-only) ------------------------------------------------------------

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
    SELECT id FROM worker.jobs
    WHERE status = %(status)s::text AND status IN ('failed', 'cancelled')
      AND (%(task)s::text IS NULL OR task = %(task)s::text)
      AND (%(queue)s::text IS NULL OR queue = %(queue)s::text)
      AND (finished_at <= %(cutoff)s::timestamptz OR finished_at IS NULL)
    LIMIT %(batch)s
    FOR UPDATE SKIP LOCKED
), moved AS (
    UPDATE worker.jobs AS j SET status = 'pending', retry_count = 0, run_at = now(),
           finished_at = NULL, cancel_requested = false, error = NULL, final_error = NULL
    FROM batch WHERE j.id = batch.id
    RETURNING j.id, j.queue
), renumbered AS (
    UPDATE worker.job_stages AS s SET attempt = 0 FROM moved WHERE s.job_id = moved.id
)
SELECT queue, count(*) AS moved, pg_notify('worker_jobs', queue) IS NULL AS _
FROM moved GROUP BY queue
"""

# Read-only: how many finished jobs a prune will delete (jobs_finished_idx), for its progress.
COUNT_PRUNABLE = """
SELECT count(*) FROM worker.jobs
WHERE status = ANY(%(statuses)s::text[]) AND finished_at < %(before)s
"""

# The lease the worker.stuck_jobs view applies in this session (it cannot read WORKER_*).
SET_LEASE = "SELECT set_config('worker.lease_seconds', %(lease)s::text, false)"

# Read-only: stuck jobs per queue, for the metrics (the view decides with SET_LEASE's lease).
STUCK_BY_QUEUE = "SELECT queue, count(*) FROM worker.stuck_jobs GROUP BY queue"

# Read-only: workers whose heartbeat is within the lease.
COUNT_LIVE_WORKERS = """
SELECT count(*) FROM worker.workers
WHERE heartbeat_at >= now() - make_interval(secs => %(lease)s)
"""
