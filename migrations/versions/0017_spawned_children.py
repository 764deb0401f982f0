"""spawned children: jobs a running job spawns, and a job held until its children have ended

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-06 03:00:00.000000

A running job (a task, or a pipeline's stage) spawns children with `worker.spawn()`. Each
child joins the spawner's workflow (one is made for a spawner that has none) and gets an edge
of `worker.job_dependencies` with the spawner on its waiting side, so the spawner waits on its
children by the rule that holds a child until its parents have ended (migration 0014):
`spawn_key` and `spawn_order` tell such an edge from a parent declared in a graph, and keep
the order the children were spawned in. A child's id is made from its spawner's id and its key
by the client, so spawning again with a key (a stage retried after its worker was lost) finds
the child it spawned before and writes nothing.

A stage that waits for its children ends its attempt with the outcome `waiting`: the outcome
write moves the job from `processing` to `held`, and the trigger `jobs_awaiting_children`
settles it in the same transaction. It first locks the children (`FOR SHARE`), so a child's
outcome either committed before or waits for this commit, then finds the job `held` and goes
through `worker.parents_ended()`. The outcomes of the children that ended while the job ran go
through that same function, replayed: the job is released once none is left, and under the
policy `cancel` it is cancelled by a child that did not complete, its error naming that child,
exactly as a held child of a workflow is by its parents.
"""

import importlib.util
from collections.abc import Sequence
from pathlib import Path

from alembic import op

revision: str = "0017"
down_revision: str | None = "0016"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

EDGE_COLUMNS = """
ALTER TABLE worker.job_dependencies
    ADD COLUMN spawn_key text,
    ADD COLUMN spawn_order integer,
    ADD CONSTRAINT job_dependencies_spawned_whole
        CHECK ((spawn_key IS NULL) = (spawn_order IS NULL))
"""

# `jobs`: `sql.ENQUEUE_MANY`'s row array, ids made by the client from the spawner's id and each
# key; `keys`: each job's key and place in the call (`i`, `k`, `o`). A child's node name is
# its spawner's (or its task's) and its key: `split/chunk-7`.
# The spawner's row is locked first: two spawns of one job number their children in turn.
# A child whose id exists already is left as it is, and so is its edge: `created` says which.
SPAWN = """
CREATE FUNCTION worker.spawn(spawner uuid, jobs json, keys json, trace_context jsonb DEFAULT NULL)
RETURNS TABLE (spawned_id uuid, created boolean)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    flow uuid;
    flow_name text;
    base integer;
BEGIN
    SELECT s.workflow_id, coalesce(s.node, s.task) INTO flow, flow_name
    FROM worker.jobs AS s WHERE s.id = spawner FOR NO KEY UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'job % does not exist: it cannot spawn', spawner
            USING ERRCODE = 'foreign_key_violation';
    END IF;
    IF flow IS NULL THEN
        INSERT INTO worker.workflows (name) VALUES (left(flow_name, 255))
        RETURNING worker.workflows.id INTO flow;
        UPDATE worker.jobs AS s SET workflow_id = flow WHERE s.id = spawner;
    END IF;
    SELECT coalesce(max(d.spawn_order), 0) INTO base
    FROM worker.job_dependencies AS d WHERE d.child_id = spawner;

    RETURN QUERY
    WITH k AS (
        SELECT x.i, x.k, x.o, left(flow_name, 254 - char_length(x.k)) || '/' || x.k AS n
        FROM json_to_recordset(keys) AS x(i uuid, k text, o integer)
    ), inserted AS (
        INSERT INTO worker.jobs (id, task, payload, queue, priority, run_at, max_retries,
                                 concurrency_key, trace_context, workflow_id, node)
        SELECT x.i, x.t, CAST(x.p AS jsonb), x.q, x.pr,
               coalesce(x.ra, now() + make_interval(secs => x.d)), x.mr, x.ck,
               spawn.trace_context, flow, k.n
        FROM json_to_recordset(jobs) AS x(i uuid, t text, p json, q text, pr smallint,
                                          ra timestamptz, d float8, mr integer, u text, ck text)
        JOIN k ON k.i = x.i
        ON CONFLICT DO NOTHING
        RETURNING worker.jobs.id
    ), edges AS (
        INSERT INTO worker.job_dependencies (child_id, parent_id, spawn_key, spawn_order)
        SELECT spawner, k.i, k.k, base + k.o + 1 FROM k
        WHERE k.i IN (SELECT inserted.id FROM inserted)
        ON CONFLICT DO NOTHING
    )
    SELECT k.i, k.i IN (SELECT inserted.id FROM inserted) FROM k ORDER BY k.o;
END $$
"""

SPAWN_SIGNATURE = "worker.spawn(uuid, json, json, jsonb)"

# For each job an UPDATE moves from `processing` to `held` (an attempt that waits for its
# children), and for no other row, so the claim's and the outcomes' writes pay nothing: it waits
# on all its children, and the outcomes of those that ended
# while the job ran are replayed through `worker.parents_ended()`, so the rule that releases
# or cancels a held job stays in that one function. The children are locked first, in a
# statement of their own: what follows reads every outcome committed before the lock was
# granted, and an outcome not committed yet waits for this transaction, then finds the job
# held. A job that spawned nothing is due at once.
JOBS_WAITING_FUNCTION = """
CREATE FUNCTION worker.jobs_awaiting_children() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    waiting uuid[];
    ended_ids uuid[];
    ended_outcomes text[];
    changed integer;
BEGIN
    waiting := ARRAY[NEW.id];
    PERFORM FROM worker.jobs AS c
    WHERE c.id = ANY(ARRAY(SELECT d.parent_id FROM worker.job_dependencies AS d
                           WHERE d.child_id = ANY(waiting) AND d.spawn_order IS NOT NULL))
    ORDER BY c.id
    FOR SHARE;
    WITH cleared AS (
        UPDATE worker.job_dependencies AS d SET ended_as = NULL
        FROM worker.job_dependencies AS before
        WHERE before.child_id = d.child_id AND before.parent_id = d.parent_id
          AND d.child_id = ANY(waiting) AND d.spawn_order IS NOT NULL
          AND d.ended_as IS NOT NULL
        RETURNING d.parent_id, before.ended_as
    )
    SELECT array_agg(c.parent_id ORDER BY c.parent_id), array_agg(c.ended_as ORDER BY c.parent_id)
    INTO ended_ids, ended_outcomes FROM cleared AS c;
    WITH counted AS (
        SELECT w.id, count(d.parent_id)::integer AS n
        FROM unnest(waiting) AS w(id)
        LEFT JOIN worker.job_dependencies AS d
            ON d.child_id = w.id AND d.spawn_order IS NOT NULL
        GROUP BY w.id
    ), settled AS (
        UPDATE worker.jobs AS j SET
            waiting_on = c.n,
            status = CASE WHEN c.n = 0 THEN 'pending' ELSE 'held' END
        FROM counted AS c
        WHERE j.id = c.id AND j.status = 'held'
        RETURNING j.status, j.queue
    )
    SELECT count(CASE WHEN s.status = 'pending' THEN pg_notify('worker_jobs', s.queue) END
                 IS NULL)
    INTO changed FROM settled AS s;
    IF ended_ids IS NOT NULL THEN
        PERFORM worker.parents_ended(ended_ids, ended_outcomes);
    END IF;
    RETURN NULL;
END $$
"""

# A row trigger fires at the end of its statement, before the statement trigger `jobs_ended`:
# when one outcome write both ends a child and moves its spawner to `held`, the spawner counts
# that child first, then `jobs_ended` takes it off the count.
TRIGGER = """
CREATE TRIGGER jobs_awaiting_children AFTER UPDATE OF status ON worker.jobs
    FOR EACH ROW WHEN (OLD.status = 'processing' AND NEW.status = 'held')
    EXECUTE FUNCTION worker.jobs_awaiting_children()
"""

# 0014's `worker.parent_results()`, with each spawned child's key: declared parents first, in
# the order they were created, then the children in the order they were spawned.
PARENT_RESULTS = """
CREATE OR REPLACE FUNCTION worker.parent_results(child uuid) RETURNS jsonb
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    SELECT coalesce(jsonb_agg(jsonb_build_object(
               'id', d.parent_id, 'node', p.node, 'task', p.task,
               'status', coalesce(p.status, d.ended_as), 'result', p.result,
               'key', d.spawn_key)
           ORDER BY d.spawn_order NULLS FIRST, p.created_at, d.parent_id), '[]'::jsonb)
    FROM worker.job_dependencies AS d LEFT JOIN worker.jobs AS p ON p.id = d.parent_id
    WHERE d.child_id = child
$$
"""

_CLIENT_MARK = "GRANT EXECUTE ON FUNCTION worker.add_dependencies(uuid, uuid[]) TO worker_client;"
_RUNNER_MARK = "GRANT EXECUTE ON FUNCTION worker.add_dependencies(uuid, uuid[]) TO worker_runner;"


def _revision(filename: str):  # type: ignore[no-untyped-def]
    path = Path(__file__).with_name(filename)
    spec = importlib.util.spec_from_file_location(f"_worker_migration_{path.stem}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _base_grants() -> str:
    """0014's `worker.grant_roles()`."""
    return str(_revision("0014_workflows.py")._grants())


def _grants() -> str:
    text = _base_grants()
    assert _CLIENT_MARK in text and _RUNNER_MARK in text
    for role, mark in (("worker_client", _CLIENT_MARK), ("worker_runner", _RUNNER_MARK)):
        more = f"GRANT EXECUTE ON FUNCTION {SPAWN_SIGNATURE} TO {role};"
        text = text.replace(mark, f"{mark}\n        {more}")
    return text


def upgrade() -> None:
    op.execute(EDGE_COLUMNS)
    op.execute(SPAWN)
    op.execute(f"REVOKE ALL ON FUNCTION {SPAWN_SIGNATURE} FROM PUBLIC")
    op.execute(JOBS_WAITING_FUNCTION)
    op.execute(TRIGGER)
    op.execute(PARENT_RESULTS)
    op.execute(_grants())
    op.execute("SELECT worker.grant_roles()")


def downgrade() -> None:
    op.execute(
        _revision("0014_workflows.py").PARENT_RESULTS.replace("CREATE", "CREATE OR REPLACE", 1)
    )
    op.execute("DROP TRIGGER jobs_awaiting_children ON worker.jobs")
    op.execute("DROP FUNCTION worker.jobs_awaiting_children()")
    op.execute(f"DROP FUNCTION {SPAWN_SIGNATURE}")
    # A job held for its children would wait for edges no longer there: it runs again.
    op.execute(
        "UPDATE worker.jobs AS j SET status = 'pending', waiting_on = 0 WHERE j.status = 'held' "
        "AND EXISTS (SELECT FROM worker.job_dependencies AS d "
        "WHERE d.child_id = j.id AND d.spawn_order IS NOT NULL)"
    )
    op.execute("DELETE FROM worker.job_dependencies WHERE spawn_order IS NOT NULL")
    op.execute(
        "ALTER TABLE worker.job_dependencies DROP CONSTRAINT job_dependencies_spawned_whole, "
        "DROP COLUMN spawn_order, DROP COLUMN spawn_key"
    )
    op.execute(_base_grants())
    op.execute("SELECT worker.grant_roles()")
