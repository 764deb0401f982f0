"""workflows: a retried job re-arms the descendants its ending cancelled; settling at any depth

Revision ID: 0018
Revises: 0017
Create Date: 2026-12-06 03:00:00.000000

Each edge now records whether its parent's ending cancelled the child (`cancelled_child`).
When a job that ended goes back to a live status (a retry from the client, the CLI, the
console or plain SQL), `worker.parents_retried()` puts its edges back to waiting and re-arms
the children its ending cancelled: each goes back to `held`, waiting for every parent not
ended, unless another parent's ending still cancels it (then that parent is named instead). A
re-armed child re-arms its own descendants in turn. A child cancelled by hand or by another
parent stays cancelled; a finalizer (`run`) already released or run is left as it is.

Failed parents are counted as 0016 counts them (`failed_parents`, under the child's row lock):
the rule below is 0016's, run a generation per pass. A child that still waits, or is re-armed,
has both its counts re-read from its edges under its lock, `waiting_on` and `failed_parents`:
the retried parent is no longer counted as failed, so a batch's `on_failure` (`run_if_failed`)
decides on the outcome of the retry, not on the failure it replaced.

A `run_if_failed` child cancelled "as not needed" is never re-armed. That cancellation is its
decision, taken once every parent had ended, as a finalizer's release is, and not a parent's
ending cancelling it: no edge of it is marked. Every one of its parents completed, and a retry
takes only a failed or cancelled job, so only a completed parent moved back by hand in SQL
reaches it; the batch's `on_complete`, released in the same transaction, does not run again
either, so the pair stays as it was decided.

A child spawned by a running job (0017) is a parent of its spawner like any other: a spawner
cancelled by a failed child is re-armed by that child's retry, held until its children not
ended have ended, then released to the stage after its wait, which reads the child as it ended
the second time. A retry while the spawner still runs just makes that child's edge wait again.

`worker.parents_ended()` and the new function settle a whole graph in a loop, a generation per
pass, instead of through one nested trigger per generation: a chain deeper than the server's
stack allowed failed its outcome write with "stack depth limit exceeded". While one of them
runs, the transaction-local setting `worker.settling` tells the trigger `jobs_ended` that the
rows it is shown are already being settled.

A deleted job whose workflow has no job left takes the workflow's row with it, freeing its key.
`worker.history_kept()` says which finished jobs retention keeps: every job of a workflow
with a job not ended, and every job that a job not ended waits for.
"""

import importlib.util
from collections.abc import Sequence
from pathlib import Path

from alembic import op

revision: str = "0018"
down_revision: str | None = "0017"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

COLUMN = (
    "ALTER TABLE worker.job_dependencies ADD COLUMN cancelled_child boolean NOT NULL DEFAULT false"
)

# The children cancelled before this migration, told by the error their parent's ending wrote.
BACKFILL = """
UPDATE worker.job_dependencies AS d SET cancelled_child = true
FROM worker.jobs AS c
WHERE c.id = d.child_id AND c.status = 'cancelled'
  AND d.ended_as IN ('failed', 'cancelled', 'deleted')
  AND c.error LIKE 'cancelled: parent ' || d.parent_id::text || '%'
"""

# Only a workflow's live jobs are indexed: retention asks whether a workflow has one.
INDEX = (
    "CREATE INDEX jobs_live_workflow_idx ON worker.jobs (workflow_id) "
    "WHERE workflow_id IS NOT NULL AND status IN ('pending', 'processing', 'paused', 'held')"
)

# The error of a child its parent's ending cancelled: one wording for both functions below.
PARENT_ENDING_ERROR = """
CREATE FUNCTION worker.parent_ending_error(parent uuid, outcome text) RETURNS text
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $$
SELECT format('cancelled: parent %s%s was %s', parent,
              coalesce(' (' || (SELECT p.node FROM worker.jobs AS p WHERE p.id = parent) || ')',
                       ''),
              outcome)
$$
"""

# 0016's rule (0014's, with failed parents counted and `run_if_failed`), a generation per
# pass: the children this pass cancelled end in turn, so the next pass takes them as the
# parents that ended. Each child a parent's ending cancelled has its edge from that parent
# marked, so a retry of that parent can re-arm it; a child cancelled as not needed has none.
PARENTS_ENDED = """
CREATE OR REPLACE FUNCTION worker.parents_ended(parents uuid[], outcomes text[])
RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    changed integer := 0;
    n integer;
    cancelled uuid[];
    causes uuid[];
    settling text := current_setting('worker.settling', true);
BEGIN
    PERFORM set_config('worker.settling', 'on', true);
    LOOP
        WITH ended AS (
            SELECT DISTINCT ON (e.parent) e.parent, e.outcome
            FROM unnest(parents, outcomes) AS e(parent, outcome)
        ), marked AS (
            UPDATE worker.job_dependencies AS d SET ended_as = e.outcome
            FROM ended AS e
            WHERE d.parent_id = e.parent AND d.ended_as IS NULL
            RETURNING d.child_id, d.parent_id, d.ended_as
        ), per_child AS (
            SELECT child_id, count(*)::integer AS n,
                   count(*) FILTER (WHERE ended_as <> 'completed')::integer AS bad,
                   (array_agg(parent_id ORDER BY parent_id)
                        FILTER (WHERE ended_as <> 'completed'))[1] AS bad_parent,
                   (array_agg(ended_as ORDER BY parent_id)
                        FILTER (WHERE ended_as <> 'completed'))[1] AS bad_outcome
            FROM marked GROUP BY child_id
        ), locked AS (
            -- A cancelled child is locked too: a retry re-arming it waits for this outcome,
            -- or this outcome waits for the re-arm and reads the child held (the lock returns
            -- the row as committed, the statement's snapshot may not).
            SELECT j.id, j.status, c.n, c.bad, c.bad_parent, c.bad_outcome
            FROM per_child AS c JOIN worker.jobs AS j ON j.id = c.child_id
            WHERE j.status IN ('held', 'cancelled')
            ORDER BY j.id
            FOR NO KEY UPDATE OF j
        ), released AS (
            UPDATE worker.jobs AS j SET
                waiting_on = greatest(j.waiting_on - c.n, 0),
                failed_parents = j.failed_parents + c.bad,
                status = CASE
                    WHEN c.bad_parent IS NOT NULL AND j.on_parent_failure = 'cancel'
                    THEN 'cancelled'
                    WHEN j.waiting_on - c.n > 0 THEN 'held'
                    WHEN j.on_parent_failure = 'run_if_failed' AND j.failed_parents + c.bad = 0
                    THEN 'cancelled'
                    ELSE 'pending' END,
                finished_at = CASE
                    WHEN c.bad_parent IS NOT NULL AND j.on_parent_failure = 'cancel' THEN now()
                    WHEN j.waiting_on - c.n <= 0 AND j.on_parent_failure = 'run_if_failed'
                         AND j.failed_parents + c.bad = 0 THEN now()
                    ELSE j.finished_at END,
                error = CASE
                    WHEN c.bad_parent IS NOT NULL AND j.on_parent_failure = 'cancel'
                    THEN worker.parent_ending_error(c.bad_parent, c.bad_outcome)
                    WHEN j.waiting_on - c.n <= 0 AND j.on_parent_failure = 'run_if_failed'
                         AND j.failed_parents + c.bad = 0
                    THEN 'cancelled: not needed, every parent completed'
                    ELSE j.error END
            FROM locked AS c
            WHERE j.id = c.id AND c.status = 'held'
            RETURNING j.id, j.status, j.queue, c.bad_parent
        )
        -- count(...) evaluates the wake-ups for every row: sent at commit, as the rows show.
        SELECT count(CASE r.status WHEN 'pending' THEN pg_notify('worker_jobs', r.queue)
                                   WHEN 'cancelled' THEN pg_notify('worker_done', r.id::text)
                     END IS NULL),
               array_agg(r.id) FILTER (WHERE r.status = 'cancelled'),
               array_agg(r.bad_parent) FILTER (WHERE r.status = 'cancelled')
        INTO n, cancelled, causes FROM released AS r;
        changed := changed + n;
        EXIT WHEN cancelled IS NULL;
        UPDATE worker.job_dependencies AS d SET cancelled_child = true
        FROM unnest(cancelled, causes) AS c(child, parent)
        WHERE d.child_id = c.child AND d.parent_id = c.parent;
        parents := cancelled;
        outcomes := array_fill('cancelled'::text, ARRAY[cardinality(cancelled)]);
    END LOOP;
    PERFORM set_config('worker.settling', coalesce(settling, ''), true);
    RETURN changed;
END $$
"""

# The reverse of `worker.parents_ended()`, a generation per pass: the edges of the jobs that
# went back to a live status wait again. A child waiting for other parents (a finalizer) waits
# for these too. A child their ending cancelled goes back to `held`, waiting for every parent
# not ended, unless another parent's ending still cancels it: then it stays cancelled, naming
# that parent, whose own retry will re-arm it. Each such child's `waiting_on` and
# `failed_parents` are counted again from its edges. Children are locked in id order, as
# `worker.parents_ended()` locks them, so the two never deadlock on them.
PARENTS_RETRIED = """
CREATE FUNCTION worker.parents_retried(retried uuid[]) RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    changed integer := 0;
    parents uuid[] := retried;
    children uuid[];
    rearm boolean[];
    settling text := current_setting('worker.settling', true);
BEGIN
    PERFORM set_config('worker.settling', 'on', true);
    -- A job retried by hand runs whatever its own parents did: none of them cancelled it now.
    UPDATE worker.job_dependencies SET cancelled_child = false
    WHERE child_id = ANY(retried) AND cancelled_child;
    LOOP
        WITH old AS (
            SELECT d.child_id, d.parent_id, d.cancelled_child
            FROM worker.job_dependencies AS d
            WHERE d.parent_id = ANY(parents) AND d.ended_as IS NOT NULL
            ORDER BY d.child_id, d.parent_id
            FOR UPDATE
        ), reset AS (
            UPDATE worker.job_dependencies AS d SET ended_as = NULL, cancelled_child = false
            FROM old
            WHERE d.child_id = old.child_id AND d.parent_id = old.parent_id
            RETURNING d.child_id, old.cancelled_child
        )
        SELECT array_agg(child_id), array_agg(cancelled_child) INTO children, rearm FROM reset;
        EXIT WHEN children IS NULL;

        -- Locked first, then read in a statement of its own: its snapshot then holds every
        -- other parent's outcome committed before the lock was granted, and an outcome still
        -- to commit waits for this lock (`worker.parents_ended()` locks cancelled children).
        PERFORM FROM worker.jobs AS j
        WHERE j.id = ANY(children) AND j.status IN ('held', 'cancelled')
        ORDER BY j.id
        FOR NO KEY UPDATE;

        WITH touched AS (
            SELECT t.child, bool_or(t.rearm) AS rearm
            FROM unnest(children, rearm) AS t(child, rearm) GROUP BY t.child
        ), judged AS (
            SELECT j.id, j.status AS was, bad.parent_id AS bad_parent, bad.ended_as AS bad_outcome,
                   n.waiting, n.failed
            FROM touched AS t JOIN worker.jobs AS j ON j.id = t.child
            CROSS JOIN LATERAL (
                SELECT count(*) FILTER (WHERE d.ended_as IS NULL)::integer AS waiting,
                       count(*) FILTER (WHERE d.ended_as <> 'completed')::integer AS failed
                FROM worker.job_dependencies AS d WHERE d.child_id = j.id
            ) AS n
            LEFT JOIN LATERAL (
                SELECT d.parent_id, d.ended_as FROM worker.job_dependencies AS d
                WHERE d.child_id = j.id AND d.ended_as <> 'completed'
                ORDER BY d.parent_id LIMIT 1
            ) AS bad ON true
            WHERE j.status = 'held' OR (j.status = 'cancelled' AND t.rearm)
        ), changed_jobs AS (
            UPDATE worker.jobs AS j SET
                waiting_on = g.waiting,
                failed_parents = g.failed,
                status = CASE WHEN g.was = 'cancelled' AND g.bad_parent IS NOT NULL
                              THEN 'cancelled' ELSE 'held' END,
                finished_at = CASE WHEN g.was = 'cancelled' AND g.bad_parent IS NOT NULL
                                   THEN j.finished_at END,
                error = CASE
                    WHEN g.was = 'held' THEN j.error
                    WHEN g.bad_parent IS NOT NULL
                    THEN worker.parent_ending_error(g.bad_parent, g.bad_outcome) END
            FROM judged AS g
            WHERE j.id = g.id
            RETURNING j.id, j.status, g.was, g.bad_parent
        ), renamed AS (
            UPDATE worker.job_dependencies AS d SET cancelled_child = true
            FROM changed_jobs AS c
            WHERE c.status = 'cancelled' AND d.child_id = c.id AND d.parent_id = c.bad_parent
        )
        SELECT array_agg(c.id) FILTER (WHERE c.was = 'cancelled' AND c.status = 'held')
        INTO parents FROM changed_jobs AS c;
        EXIT WHEN parents IS NULL;
        changed := changed + cardinality(parents);
    END LOOP;
    PERFORM set_config('worker.settling', coalesce(settling, ''), true);
    RETURN changed;
END $$
"""

ENDED = "('completed', 'failed', 'cancelled')"

# Once per UPDATE statement on worker.jobs: the jobs it moved into an ended status release
# their children; those it moved back out of one (a retry) re-arm them. A statement that moves
# no job across that line (a claim, a heartbeat) costs one comparison per row.
JOBS_ENDED_FUNCTION = f"""
CREATE OR REPLACE FUNCTION worker.jobs_ended() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    ended_ids uuid[];
    ended_outcomes text[];
    retried_ids uuid[];
BEGIN
    -- The rows of a settling function's own writes: it settles their children itself.
    IF current_setting('worker.settling', true) = 'on' THEN
        RETURN NULL;
    END IF;
    SELECT array_agg(n.id) FILTER (WHERE n.status IN {ENDED}),
           array_agg(n.status) FILTER (WHERE n.status IN {ENDED}),
           array_agg(n.id) FILTER (WHERE n.status NOT IN {ENDED})
    INTO ended_ids, ended_outcomes, retried_ids
    FROM new_rows AS n JOIN old_rows AS o ON o.id = n.id
    WHERE (n.status IN {ENDED}) <> (o.status IN {ENDED})
      AND (EXISTS (SELECT FROM worker.job_dependencies AS d WHERE d.parent_id = n.id)
           OR (n.status NOT IN {ENDED}
               AND EXISTS (SELECT FROM worker.job_dependencies AS d
                           WHERE d.child_id = n.id AND d.cancelled_child)));
    IF retried_ids IS NOT NULL THEN
        PERFORM worker.parents_retried(retried_ids);
    END IF;
    IF ended_ids IS NOT NULL THEN
        PERFORM worker.parents_ended(ended_ids, ended_outcomes);
    END IF;
    RETURN NULL;
END $$
"""

# 0014's, and a workflow left with no job goes with its last one.
JOBS_GONE_FUNCTION = f"""
CREATE OR REPLACE FUNCTION worker.jobs_gone() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    ended_ids uuid[];
BEGIN
    SELECT array_agg(g.id) INTO ended_ids FROM gone AS g
    WHERE g.status NOT IN {ENDED}
      AND EXISTS (SELECT FROM worker.job_dependencies AS d WHERE d.parent_id = g.id);
    IF ended_ids IS NOT NULL THEN
        PERFORM worker.parents_ended(ended_ids, array_fill('deleted'::text,
                                                           ARRAY[cardinality(ended_ids)]));
    END IF;
    DELETE FROM worker.job_dependencies WHERE child_id = ANY(ARRAY(SELECT id FROM gone));
    DELETE FROM worker.workflows AS w
    WHERE w.id = ANY(ARRAY(SELECT DISTINCT g.workflow_id FROM gone AS g
                           WHERE g.workflow_id IS NOT NULL))
      AND NOT EXISTS (SELECT FROM worker.jobs AS j WHERE j.workflow_id = w.id);
    RETURN NULL;
END $$
"""

# What retention keeps of the finished jobs: a job of a workflow while any job of that workflow
# has not ended (its children read its result, an operator reads the graph whole), and a job
# while a job that waits for it has not ended (a child enqueued with `depends_on`). Its
# subqueries keep it from being inlined; its high cost steers the planner of a prune batch to
# read jobs_finished_idx in order and stop at the batch's size, calling it for as few rows as
# it can instead of for every finished job.
HISTORY_KEPT = f"""
CREATE FUNCTION worker.history_kept(j worker.jobs) RETURNS boolean
LANGUAGE sql STABLE PARALLEL SAFE COST 1000 AS $$
SELECT (j.workflow_id IS NOT NULL
        AND EXISTS (SELECT FROM worker.jobs AS w
                    WHERE w.workflow_id = j.workflow_id
                      AND w.status IN ('pending', 'processing', 'paused', 'held')))
    OR EXISTS (SELECT FROM worker.job_dependencies AS d JOIN worker.jobs AS c
                   ON c.id = d.child_id
               WHERE d.parent_id = j.id AND c.status NOT IN {ENDED})
$$
"""


def _revision(filename: str):  # type: ignore[no-untyped-def]
    path = Path(__file__).with_name(filename)
    spec = importlib.util.spec_from_file_location(f"_worker_migration_{path.stem}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def upgrade() -> None:
    op.execute(COLUMN)
    op.execute(BACKFILL)
    op.execute(INDEX)
    op.execute(PARENT_ENDING_ERROR)
    op.execute(PARENTS_ENDED)
    op.execute(PARENTS_RETRIED)
    op.execute(JOBS_ENDED_FUNCTION)
    op.execute(JOBS_GONE_FUNCTION)
    op.execute(HISTORY_KEPT)
    op.execute("REVOKE ALL ON FUNCTION worker.parent_ending_error(uuid, text) FROM PUBLIC")
    op.execute("REVOKE ALL ON FUNCTION worker.parents_retried(uuid[]) FROM PUBLIC")


def downgrade() -> None:
    before = _revision("0014_workflows.py")
    op.execute("DROP FUNCTION worker.history_kept(worker.jobs)")
    for text in (before.JOBS_GONE_FUNCTION, before.JOBS_ENDED_FUNCTION):
        op.execute(text.replace("CREATE FUNCTION", "CREATE OR REPLACE FUNCTION", 1))
    # 0016's rule, as 0017 left it.
    op.execute(_revision("0016_batch_callbacks.py").PARENTS_ENDED)
    op.execute("DROP FUNCTION worker.parents_retried(uuid[])")
    op.execute("DROP FUNCTION worker.parent_ending_error(uuid, text)")
    op.execute("DROP INDEX worker.jobs_live_workflow_idx")
    op.execute("ALTER TABLE worker.job_dependencies DROP COLUMN cancelled_child")
