"""batch callbacks: a child that runs only if a parent failed, decided under its row lock

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-06 02:30:00.000000

A third policy for a child's parents, `run_if_failed`: the child waits for every parent, as
`run` does, then runs if at least one of them failed for good, was cancelled or was deleted,
and is cancelled as not needed if all of them completed (`enqueue_many(..., on_failure=...)`).

Whether a parent failed is counted on the child's own row (`failed_parents`), beside
`waiting_on`, by the same `worker.parents_ended()` under the same row lock: the transaction
that ends the last parent reads the count its predecessors committed, where a look at the
edges from its own snapshot could miss a failure committed a moment before.

The downgrade turns `run_if_failed` children into `run` ones, as 0014 knows no other policy
that waits for every parent.
"""

import importlib.util
from collections.abc import Sequence
from pathlib import Path

from alembic import op

revision: str = "0016"
down_revision: str | None = "0015"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

POLICIES_BEFORE = "'cancel', 'run'"
POLICIES_AFTER = "'cancel', 'run', 'run_if_failed'"

# 0014's rule, with the count of parents that did not complete. A child is cancelled at once
# by a bad parent under `cancel`; once no parent is left, it runs, unless its policy is
# `run_if_failed` and every parent completed. The conditions are written out in each column
# they decide: the UPDATE reads the child's row as locked, so each reads the same values.
PARENTS_ENDED = """
CREATE OR REPLACE FUNCTION worker.parents_ended(parents uuid[], outcomes text[]) RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    changed integer;
BEGIN
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
        SELECT j.id FROM worker.jobs AS j
        WHERE j.id = ANY(ARRAY(SELECT child_id FROM per_child)) AND j.status = 'held'
        ORDER BY j.id
        FOR NO KEY UPDATE
    ), released AS (
        UPDATE worker.jobs AS j SET
            waiting_on = greatest(j.waiting_on - c.n, 0),
            failed_parents = j.failed_parents + c.bad,
            status = CASE
                WHEN c.bad_parent IS NOT NULL AND j.on_parent_failure = 'cancel' THEN 'cancelled'
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
                THEN format('cancelled: parent %s%s was %s', c.bad_parent,
                            coalesce(' (' || (SELECT p.node FROM worker.jobs AS p
                                               WHERE p.id = c.bad_parent) || ')', ''),
                            c.bad_outcome)
                WHEN j.waiting_on - c.n <= 0 AND j.on_parent_failure = 'run_if_failed'
                     AND j.failed_parents + c.bad = 0
                THEN 'cancelled: not needed, every parent completed'
                ELSE j.error END
        FROM per_child AS c JOIN locked ON locked.id = c.child_id
        WHERE j.id = locked.id AND j.status = 'held'
        RETURNING j.id, j.status, j.queue
    )
    -- count(...) evaluates the wake-ups for every row: sent at commit, as the rows show.
    SELECT count(CASE r.status WHEN 'pending' THEN pg_notify('worker_jobs', r.queue)
                               WHEN 'cancelled' THEN pg_notify('worker_done', r.id::text)
                 END IS NULL)
    INTO changed FROM released AS r;
    RETURN changed;
END $$
"""


def _revision(filename: str):  # type: ignore[no-untyped-def]
    path = Path(__file__).with_name(filename)
    spec = importlib.util.spec_from_file_location(f"_worker_migration_{path.stem}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _policies(values: str) -> str:
    return (
        "ALTER TABLE worker.jobs DROP CONSTRAINT jobs_on_parent_failure_valid, "
        f"ADD CONSTRAINT jobs_on_parent_failure_valid CHECK (on_parent_failure IN ({values}))"
    )


def upgrade() -> None:
    op.execute(
        "ALTER TABLE worker.jobs ADD COLUMN failed_parents integer NOT NULL DEFAULT 0, "
        "ADD CONSTRAINT jobs_failed_parents_positive CHECK (failed_parents >= 0)"
    )
    op.execute(_policies(POLICIES_AFTER))
    op.execute(PARENTS_ENDED)


def downgrade() -> None:
    before = _revision("0014_workflows.py")
    op.execute(before.PARENTS_ENDED.replace("CREATE FUNCTION", "CREATE OR REPLACE FUNCTION", 1))
    op.execute(
        "UPDATE worker.jobs SET on_parent_failure = 'run' WHERE on_parent_failure = 'run_if_failed'"
    )
    op.execute(_policies(POLICIES_BEFORE))
    op.execute(
        "ALTER TABLE worker.jobs DROP CONSTRAINT jobs_failed_parents_positive, "
        "DROP COLUMN failed_parents"
    )
