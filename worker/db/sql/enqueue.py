"""Enqueueing: one job, a batch, and their idempotent twins for a retry after a lost connection."""

# The statement trigger `worker.jobs_notify` sends one NOTIFY per inserting transaction and queue,
# delivered at commit: in the caller's transaction, no worker sees or hears of the job before.
# Casts are written CAST(x AS t) so the client can run this on any driver's connection. The
# client makes the id (time-ordered, like the column default), so a retry can be idempotent.
_INSERT_ONE = """
INSERT INTO worker.jobs (id, task, payload, queue, priority, run_at, max_retries)
VALUES (CAST(%(id)s AS uuid), %(task)s, CAST(%(payload)s AS jsonb), %(queue)s,
        CAST(%(priority)s AS smallint),
        coalesce(CAST(%(run_at)s AS timestamptz),
                 now() + make_interval(secs => CAST(%(delay)s AS float8))),
        CAST(%(max_retries)s AS integer))
"""

ENQUEUE = _INSERT_ONE + "RETURNING id, run_at\n"

# ENQUEUE again after the connection died with the outcome unknown: if the first try did commit,
# its row (same id) stands and nothing is inserted twice; `run_at` is read back either way.
ENQUEUE_AGAIN = f"""
WITH ins AS ({_INSERT_ONE}ON CONFLICT (id) DO NOTHING
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

# A batch of jobs that all run now, on the client's own connection: COPY, as it is quicker than
# ENQUEUE_MANY for the server to take in. The columns left out take their defaults: `pending`,
# and run_at now() from the server's clock. Rows are tab-separated text (`Batch.copy_rows`).
# Like an INSERT, it fires the statement trigger: one NOTIFY per queue, at commit.
ENQUEUE_MANY_COPY = "COPY worker.jobs (id, task, payload, queue, priority, max_retries) FROM STDIN"

# ENQUEUE_MANY (or its COPY) again after the connection died with the outcome unknown: the batch
# is one statement, so it committed whole or not at all; the ids make the second try a no-op if
# it did.
ENQUEUE_MANY_AGAIN = ENQUEUE_MANY + "ON CONFLICT (id) DO NOTHING\n"
