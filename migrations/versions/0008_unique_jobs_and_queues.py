"""unique jobs, concurrency keys, queues an operator can pause and limit, periodic schedules

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-02 13:30:00.000000

Unique jobs: `worker.jobs.unique_key`, and a partial unique index over the jobs that are
pending, processing or paused. While one such job holds a key, an insert of another with the
same key conflicts: `INSERT ... ON CONFLICT DO NOTHING` inserts nothing, and the enqueue
returns the existing job. The index enforces it across processes and inside callers'
transactions. A job that ends (completed, failed, cancelled) leaves the index, and the key is
free again. `worker.enqueue()` gains a `unique_key` argument (and is replaced, so that a call
without it stays unambiguous).

Queues: `worker.queues` holds a row per queue an operator paused or limited; a queue without a
row is neither. `worker.queue_budget(queue, wanted)` is the one rule of how many jobs a claim
may take from a queue: none while it is paused, no more than its concurrency limit less its
processing jobs (counted from the rows, so a killed worker's jobs count until they are
rescued, and no slot leaks), and no more than its token bucket holds. The claims of a limited
queue take turns on its row's lock, so that each counts the claims committed before it.
`worker.queue_tokens(row)` is how full a queue's bucket is now.

Concurrency keys: `worker.jobs.concurrency_key`; jobs sharing a key run at most as many at
once as their task allows, across all workers. `worker.concurrency_key_free(key, limit)` is
that rule: the claims of one key take turns on an advisory lock, count the key's processing
jobs once they hold it, and count what the claim itself took so far in a setting local to its
transaction. A job skipped for its key stays pending for a later claim.

Schedules: `worker.schedules` holds one row per periodic task's schedule (`@task(cron=...)`,
`@task(every=...)`) and the latest tick it fired. Each worker running the task fires its ticks
through the row: a compare-and-set on `last_tick` and the job's insert in one statement
(`worker.db.sql.schedules.FIRE_TICK`), so that each tick is enqueued once however many workers
fire it. A schedule changed in code has a new key, and its old row stays, harmless; delete it
with `DELETE FROM worker.schedules WHERE key = '...'`.

`worker.grant_roles()` grants the new tables too: the runner writes queue controls and
schedules, the client reads them.

Adding the columns is instant; building the index reads worker.jobs once, holding off inserts
meanwhile.
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

LIVE = "status IN ('pending', 'processing', 'paused')"

QUEUES_TABLE = """
CREATE TABLE worker.queues (
    name text PRIMARY KEY CHECK (char_length(name) BETWEEN 1 AND 255),
    paused boolean NOT NULL DEFAULT false,
    concurrency integer CHECK (concurrency > 0),
    rate double precision CHECK (rate > 0),
    burst double precision CHECK (burst >= 1),
    tokens double precision NOT NULL DEFAULT 0,
    refilled_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now()
)
"""

SCHEDULES_TABLE = """
CREATE TABLE worker.schedules (
    key text PRIMARY KEY,
    task text NOT NULL,
    spec text NOT NULL,
    last_tick timestamptz NOT NULL,
    fired bigint NOT NULL DEFAULT 0,
    fired_at timestamptz,
    created_at timestamptz NOT NULL DEFAULT now()
)
"""

# The bucket holds `burst` tokens at most (by default a second's worth, and at least one),
# refilled at `rate` per second since it was last spent from.
TOKENS_FUNCTION = """
CREATE FUNCTION worker.queue_tokens(q worker.queues) RETURNS double precision
LANGUAGE sql STABLE AS $$
    SELECT least(coalesce(q.burst, greatest(q.rate, 1)),
                 q.tokens + q.rate * extract(epoch FROM now() - q.refilled_at))
$$
"""

# VOLATILE plpgsql: each statement in it reads a new snapshot, so the count made once the lock
# is held sees the claims that held it before.
BUDGET_FUNCTION = """
CREATE FUNCTION worker.queue_budget(queue_name text, wanted integer) RETURNS integer
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    q worker.queues;
    budget integer := wanted;
BEGIN
    SELECT * INTO q FROM worker.queues WHERE name = queue_name;
    IF NOT FOUND THEN
        RETURN wanted;
    ELSIF q.paused THEN
        RETURN 0;
    ELSIF q.concurrency IS NULL AND q.rate IS NULL THEN
        RETURN wanted;
    END IF;
    SELECT * INTO q FROM worker.queues WHERE name = queue_name FOR UPDATE;
    IF q.concurrency IS NOT NULL THEN
        budget := least(budget, greatest(0, q.concurrency - (
            SELECT count(*) FROM worker.jobs WHERE queue = queue_name AND status = 'processing'
        )));
    END IF;
    IF q.rate IS NOT NULL THEN
        budget := least(budget, floor(worker.queue_tokens(q))::integer);
    END IF;
    RETURN greatest(budget, 0);
END $$
"""

# The count made once the lock is held sees every claim of the key committed before this one;
# a key found full is remembered for the rest of the claim, which then skips its other jobs
# without asking again.
KEY_FUNCTION = """
CREATE FUNCTION worker.concurrency_key_free(key text, key_limit integer) RETURNS boolean
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    name text := 'worker.key_' || md5(key);
    taken text := current_setting(name, true);
BEGIN
    IF taken = 'full' THEN
        RETURN false;
    END IF;
    PERFORM pg_advisory_xact_lock(hashtextextended('worker.concurrency_key:' || key, 0));
    IF coalesce(nullif(taken, ''), '0')::integer + (
        SELECT count(*) FROM worker.jobs AS j
        WHERE j.concurrency_key = key AND j.status = 'processing'
    ) >= key_limit THEN
        PERFORM set_config(name, 'full', true);
        RETURN false;
    END IF;
    PERFORM set_config(name, (coalesce(nullif(taken, ''), '0')::integer + 1)::text, true);
    RETURN true;
END $$
"""

# As 0001's, with `unique_key` (a job already holding the key is returned instead of a new one)
# and `concurrency_key`.
# Each statement of the loop reads a new snapshot, so a conflicting job committed meanwhile is
# found; if it ended in between, the insert is tried again.
ENQUEUE_FUNCTION = """
CREATE FUNCTION worker.enqueue(
    task text,
    payload jsonb DEFAULT '{}'::jsonb,
    queue text DEFAULT 'default',
    priority integer DEFAULT 0,
    run_at timestamptz DEFAULT now(),
    max_retries integer DEFAULT NULL,
    unique_key text DEFAULT NULL,
    concurrency_key text DEFAULT NULL
) RETURNS uuid LANGUAGE plpgsql AS $$
DECLARE
    job uuid;
BEGIN
    FOR attempt IN 1..5 LOOP
        INSERT INTO worker.jobs (task, payload, queue, priority, run_at, max_retries,
                                 unique_key, concurrency_key)
        VALUES (enqueue.task, enqueue.payload, enqueue.queue, enqueue.priority, enqueue.run_at,
                enqueue.max_retries, enqueue.unique_key, enqueue.concurrency_key)
        ON CONFLICT DO NOTHING
        RETURNING id INTO job;
        IF job IS NULL THEN
            SELECT id INTO job FROM worker.jobs AS j
            WHERE j.unique_key = enqueue.unique_key
              AND j.status IN ('pending', 'processing', 'paused');
        END IF;
        IF job IS NOT NULL THEN
            RETURN job;
        END IF;
    END LOOP;
    RAISE EXCEPTION 'the job holding unique key % kept changing: try again', unique_key;
END $$
"""

OLD_ENQUEUE = "worker.enqueue(text, jsonb, text, integer, timestamptz, integer)"
NEW_ENQUEUE = "worker.enqueue(text, jsonb, text, integer, timestamptz, integer, text, text)"


def _grants(enqueue: str, new_tables: bool) -> str:
    """`worker.grant_roles()` as 0003 made it, for `enqueue`'s signature and, `new_tables`,
    this migration's tables."""
    client_queues = (
        "GRANT SELECT ON worker.queues, worker.schedules TO worker_client;" if new_tables else ""
    )
    runner_queues = (
        "GRANT SELECT, INSERT, UPDATE, DELETE ON worker.queues TO worker_runner;"
        "GRANT SELECT, INSERT, UPDATE ON worker.schedules TO worker_runner;"
        if new_tables
        else ""
    )
    return f"""
CREATE OR REPLACE FUNCTION worker.grant_roles() RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    done text[] := '{{}}';
BEGIN
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'worker_client') THEN
        GRANT USAGE ON SCHEMA worker TO worker_client;
        GRANT SELECT, INSERT ON worker.jobs TO worker_client;
        GRANT SELECT ON worker.job_stages, worker.job_events, worker.workers,
                        worker.queue_stats, worker.stuck_jobs, worker.failed_recently,
                        worker.slowest_tasks
              TO worker_client;
        {client_queues}
        GRANT EXECUTE ON FUNCTION {enqueue} TO worker_client;
        done := done || 'worker_client'::text;
    END IF;
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'worker_runner') THEN
        GRANT USAGE ON SCHEMA worker TO worker_runner;
        GRANT SELECT, INSERT, UPDATE, DELETE ON worker.jobs, worker.workers TO worker_runner;
        GRANT SELECT, INSERT, UPDATE ON worker.job_stages TO worker_runner;
        GRANT SELECT, INSERT ON worker.job_events TO worker_runner;
        GRANT USAGE, SELECT ON SEQUENCE worker.job_events_id_seq TO worker_runner;
        GRANT SELECT ON worker.queue_stats, worker.stuck_jobs, worker.failed_recently,
                        worker.slowest_tasks
              TO worker_runner;
        {runner_queues}
        GRANT EXECUTE ON FUNCTION {enqueue} TO worker_runner;
        done := done || 'worker_runner'::text;
    END IF;
    RETURN CASE WHEN cardinality(done) = 0 THEN 'no role to grant to'
                ELSE 'granted to ' || array_to_string(done, ', ') END;
END $$
"""


def upgrade() -> None:
    op.execute("ALTER TABLE worker.jobs ADD COLUMN unique_key text")
    op.execute(
        "ALTER TABLE worker.jobs ADD CONSTRAINT jobs_unique_key_length "
        "CHECK (char_length(unique_key) BETWEEN 1 AND 255)"
    )
    op.execute(
        f"CREATE UNIQUE INDEX jobs_unique_key_idx ON worker.jobs (unique_key) "
        f"WHERE unique_key IS NOT NULL AND {LIVE}"
    )
    op.execute("ALTER TABLE worker.jobs ADD COLUMN concurrency_key text")
    op.execute(
        "ALTER TABLE worker.jobs ADD CONSTRAINT jobs_concurrency_key_length "
        "CHECK (char_length(concurrency_key) BETWEEN 1 AND 255)"
    )
    op.execute(
        "CREATE INDEX jobs_concurrency_key_idx ON worker.jobs (concurrency_key) "
        "WHERE status = 'processing' AND concurrency_key IS NOT NULL"
    )
    op.execute(KEY_FUNCTION)
    op.execute(f"DROP FUNCTION {OLD_ENQUEUE}")
    op.execute(ENQUEUE_FUNCTION)
    op.execute(QUEUES_TABLE)
    op.execute(TOKENS_FUNCTION)
    op.execute(BUDGET_FUNCTION)
    op.execute(SCHEDULES_TABLE)
    op.execute(_grants(NEW_ENQUEUE, new_tables=True))
    op.execute("SELECT worker.grant_roles()")


def downgrade() -> None:
    op.execute("DROP FUNCTION worker.concurrency_key_free(text, integer)")
    op.execute("DROP INDEX worker.jobs_concurrency_key_idx")
    op.execute("ALTER TABLE worker.jobs DROP COLUMN concurrency_key")
    op.execute("DROP TABLE worker.schedules")
    op.execute("DROP FUNCTION worker.queue_budget(text, integer)")
    op.execute("DROP FUNCTION worker.queue_tokens(worker.queues)")
    op.execute("DROP TABLE worker.queues")
    op.execute(f"DROP FUNCTION {NEW_ENQUEUE}")
    # 0001's function, as it was.
    op.execute(
        """
CREATE FUNCTION worker.enqueue(
    task text,
    payload jsonb DEFAULT '{}'::jsonb,
    queue text DEFAULT 'default',
    priority integer DEFAULT 0,
    run_at timestamptz DEFAULT now(),
    max_retries integer DEFAULT NULL
) RETURNS uuid LANGUAGE sql AS $$
    INSERT INTO worker.jobs (task, payload, queue, priority, run_at, max_retries)
    VALUES (enqueue.task, enqueue.payload, enqueue.queue, enqueue.priority, enqueue.run_at,
            enqueue.max_retries)
    RETURNING id
$$
"""
    )
    op.execute(_grants(OLD_ENQUEUE, new_tables=False))
    op.execute("SELECT worker.grant_roles()")
    op.execute("DROP INDEX worker.jobs_unique_key_idx")
    op.execute("ALTER TABLE worker.jobs DROP COLUMN unique_key")
