"""Enqueueing: one job, a batch, and their idempotent twins for a retry after a lost connection."""

# The statement trigger `worker.jobs_notify` sends one NOTIFY per inserting transaction and queue,
# delivered at commit: in the caller's transaction, no worker sees or hears of the job before.
# Casts are written CAST(x AS t) so the client can run this on any driver's connection. The
# client makes the id (time-ordered, like the column default), so a retry can be idempotent.
ENQUEUE = """
INSERT INTO worker.jobs (id, task, payload, queue, priority, run_at, max_retries, unique_key,
                         concurrency_key, trace_context)
VALUES (CAST(%(id)s AS uuid), %(task)s, CAST(%(payload)s AS jsonb), %(queue)s,
        CAST(%(priority)s AS smallint),
        coalesce(CAST(%(run_at)s AS timestamptz),
                 now() + make_interval(secs => CAST(%(delay)s AS float8))),
        CAST(%(max_retries)s AS integer), %(unique_key)s, %(concurrency_key)s,
        CAST(%(trace_context)s AS jsonb))
RETURNING id, run_at
"""

# ENQUEUE again after the connection died with the outcome unknown: if the first try did commit,
# its row (same id) stands and nothing is inserted twice; `run_at` is read back either way.
ENQUEUE_AGAIN = """
WITH ins AS (
    INSERT INTO worker.jobs (id, task, payload, queue, priority, run_at, max_retries, unique_key,
                             concurrency_key, trace_context)
    VALUES (CAST(%(id)s AS uuid), %(task)s, CAST(%(payload)s AS jsonb), %(queue)s,
            CAST(%(priority)s AS smallint),
            coalesce(CAST(%(run_at)s AS timestamptz),
                     now() + make_interval(secs => CAST(%(delay)s AS float8))),
            CAST(%(max_retries)s AS integer), %(unique_key)s, %(concurrency_key)s,
            CAST(%(trace_context)s AS jsonb))
    ON CONFLICT (id) DO NOTHING
    RETURNING id, run_at
)
SELECT id, run_at FROM ins
UNION ALL
SELECT id, run_at FROM worker.jobs WHERE id = CAST(%(id)s AS uuid) AND NOT EXISTS (SELECT FROM ins)
"""

# A job with a unique key: inserted, or else the live job holding the key (`jobs_unique_key_idx`)
# is returned in its place; the caller tells the two apart by id. Also safe to run again after
# the connection died: a first try that committed is found by its id. No row: the job holding
# the key committed after this statement's snapshot (the insert waited for it), so it cannot
# be read here; the caller runs this again, and a new snapshot sees it.
# A live job is written `status IN ('pending', 'processing', 'paused', 'held')` here and wherever a
# statement asks who holds a key: the predicate of `jobs_unique_key_idx` (`worker.schema.LIVE`)
# as written, so the index serves the question.
ENQUEUE_UNIQUE = """
WITH ins AS (
    INSERT INTO worker.jobs (id, task, payload, queue, priority, run_at, max_retries, unique_key,
                             concurrency_key, trace_context)
    VALUES (CAST(%(id)s AS uuid), %(task)s, CAST(%(payload)s AS jsonb), %(queue)s,
            CAST(%(priority)s AS smallint),
            coalesce(CAST(%(run_at)s AS timestamptz),
                     now() + make_interval(secs => CAST(%(delay)s AS float8))),
            CAST(%(max_retries)s AS integer), %(unique_key)s, %(concurrency_key)s,
            CAST(%(trace_context)s AS jsonb))
    ON CONFLICT DO NOTHING
    RETURNING id, run_at
)
SELECT id, run_at FROM ins
UNION ALL
(SELECT id, run_at FROM worker.jobs
 WHERE id = CAST(%(id)s AS uuid) AND NOT EXISTS (SELECT FROM ins)
 UNION ALL
 SELECT id, run_at FROM worker.jobs
 WHERE unique_key = %(unique_key)s AND status IN ('pending', 'processing', 'paused', 'held')
   AND NOT EXISTS (SELECT FROM ins)
 LIMIT 1)
"""

# One statement (one round trip) for any number of jobs: one JSON array of rows, unpacked
# server-side (much cheaper for the client to build than parallel arrays, whose text form it
# must escape element by element); one NOTIFY per queue for the whole batch. The client makes
# the ids, so each handle matches its row whatever order the rows are written in. A row:
# {"i": id, "t": task, "p": payload object, "q": queue, "pr": priority, "ra": run_at or null,
#  "d": delay seconds, "mr": max_retries or null, "u": unique_key or null, "ck":
# concurrency_key or null}. Used in a caller's transaction (any driver) and for batches with
# waiting jobs or keys; other batches go by ENQUEUE_MANY_COPY.
ENQUEUE_MANY = """
INSERT INTO worker.jobs (id, task, payload, queue, priority, run_at, max_retries, unique_key,
                         concurrency_key, trace_context)
SELECT i, t, CAST(p AS jsonb), q, pr, coalesce(ra, now() + make_interval(secs => d)), mr, u, ck,
       CAST(%(trace_context)s AS jsonb)
FROM json_to_recordset(CAST(%(jobs)s AS json))
    AS x(i uuid, t text, p json, q text, pr smallint, ra timestamptz, d float8, mr integer,
         u text, ck text)
"""

# A batch with unique keys (no two of the batch share one): each row's job, inserted or the
# live one already holding its key, as ENQUEUE_UNIQUE does for one; NULL where the holder
# committed after this statement's snapshot (the caller asks again for those rows alone).
ENQUEUE_MANY_UNIQUE = """
WITH ins AS (
    INSERT INTO worker.jobs (id, task, payload, queue, priority, run_at, max_retries, unique_key,
                             concurrency_key, trace_context)
    SELECT i, t, CAST(p AS jsonb), q, pr, coalesce(ra, now() + make_interval(secs => d)), mr,
           u, ck, CAST(%(trace_context)s AS jsonb)
    FROM json_to_recordset(CAST(%(jobs)s AS json))
        AS x(i uuid, t text, p json, q text, pr smallint, ra timestamptz, d float8, mr integer,
             u text, ck text)
    ON CONFLICT DO NOTHING
    RETURNING id
)
SELECT x.i AS asked, coalesce(
    (SELECT ins.id FROM ins WHERE ins.id = x.i),
    (SELECT j.id FROM worker.jobs AS j WHERE j.id = x.i),
    (SELECT j.id FROM worker.jobs AS j
     WHERE j.unique_key = x.u AND j.status IN ('pending', 'processing', 'paused', 'held'))) AS id
FROM json_to_recordset(CAST(%(jobs)s AS json))
    AS x(i uuid, t text, p json, q text, pr smallint, ra timestamptz, d float8, mr integer,
         u text, ck text)
"""

# A batch of jobs that all run now, on the client's own connection: COPY, as it is quicker than
# ENQUEUE_MANY for the server to take in. The columns left out take their defaults: `pending`,
# and run_at now() from the server's clock. Rows are tab-separated text (`Batch.copy_chunks`).
# Like an INSERT, it fires the statement trigger: one NOTIFY per queue, at commit.
ENQUEUE_MANY_COPY = "COPY worker.jobs (id, task, payload, queue, priority, max_retries) FROM STDIN"
# The same, for a batch enqueued inside a trace: each row ends with the trace context
# (`worker.tracing`), the same for the whole batch.
ENQUEUE_MANY_COPY_TRACED = (
    "COPY worker.jobs (id, task, payload, queue, priority, max_retries, trace_context) FROM STDIN"
)

# ENQUEUE_MANY (or its COPY) again after the connection died with the outcome unknown: the batch
# is one statement, so it committed whole or not at all; the ids make the second try a no-op if
# it did.
ENQUEUE_MANY_AGAIN = """
INSERT INTO worker.jobs (id, task, payload, queue, priority, run_at, max_retries, unique_key,
                         concurrency_key, trace_context)
SELECT i, t, CAST(p AS jsonb), q, pr, coalesce(ra, now() + make_interval(secs => d)), mr, u, ck,
       CAST(%(trace_context)s AS jsonb)
FROM json_to_recordset(CAST(%(jobs)s AS json))
    AS x(i uuid, t text, p json, q text, pr smallint, ra timestamptz, d float8, mr integer,
         u text, ck text)
ON CONFLICT (id) DO NOTHING
"""
