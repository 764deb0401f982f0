"""workflows: jobs that wait for other jobs, released in the transaction that ends the last

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-05 13:00:00.000000

A job may depend on other jobs (`worker.job_dependencies`, one row per edge). Until every
parent has ended it is `held`: a status of its own, so no claim, queue limit, concurrency-key
budget or unique-key scan of runnable jobs ever reads it (`jobs_runnable_idx` covers `pending`
rows only). It holds its unique key as a live job does.

The rule that makes fan-in safe lives in one function, `worker.parents_ended()`: it marks each
edge of the parents that ended with their outcome (each edge once), then, under the child's
row lock taken in id order, subtracts the edges just marked from the child's `waiting_on` and
releases the child (`pending`) once it reaches zero, in the same transaction that records the
last parent's outcome. Two parents committing at once cannot both miss each other: the second
decrement waits for the first's lock and reads its result. A child whose `on_parent_failure` is
`cancel` (the default) is cancelled as soon as a parent fails for good, is cancelled or is
deleted before it ended, its error naming that parent; one whose policy is `run` runs anyway.

Every write that ends a job reaches that function through the statement triggers `jobs_ended`
(an UPDATE that moves a job into completed, failed or cancelled: the outcome write, a cancel,
the rescuer failing a job for good, plain SQL) and `jobs_gone` (a DELETE of a job that had not
ended: retention, `worker prune`, plain SQL), so no writer can forget it. A cancelled child
ends too, so its own held children follow in the same transaction.

`worker.enqueue_workflow()` writes a whole graph in one statement: the workflow's row, its jobs
and its edges; a parent outside the graph is locked (`FOR SHARE`) so its outcome cannot commit
unseen, and one that has already ended is resolved at once. The functions run as the schema
owner, so a role that may enqueue or end jobs needs no rights on the new table's rows.

`worker.workflow_stats` counts each workflow's jobs by status; `worker.held_jobs` lists each
held job with the parents it still waits for.
"""

import importlib.util
from collections.abc import Sequence
from pathlib import Path

from alembic import op

revision: str = "0014"
down_revision: str | None = "0013"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

STATUSES_BEFORE = "'pending', 'processing', 'completed', 'failed', 'paused', 'cancelled'"
STATUSES_AFTER = STATUSES_BEFORE + ", 'held'"
LIVE_BEFORE = "status IN ('pending', 'processing', 'paused')"
LIVE_AFTER = "status IN ('pending', 'processing', 'paused', 'held')"

WORKFLOWS_TABLE = """
CREATE TABLE worker.workflows (
    id uuid PRIMARY KEY DEFAULT worker.uuid_v7(),
    name text NOT NULL CONSTRAINT workflows_name_length CHECK (char_length(name) BETWEEN 1 AND 255),
    key text CONSTRAINT workflows_key_length CHECK (char_length(key) BETWEEN 1 AND 255),
    created_at timestamptz NOT NULL DEFAULT now()
)
"""

# `ended_as`: the parent's outcome once it ended (completed, failed, cancelled or deleted),
# written once by `worker.parents_ended()`; NULL while the child still waits for it.
DEPENDENCIES_TABLE = """
CREATE TABLE worker.job_dependencies (
    child_id uuid NOT NULL,
    parent_id uuid NOT NULL,
    ended_as text,
    CONSTRAINT job_dependencies_pkey PRIMARY KEY (child_id, parent_id),
    CONSTRAINT job_dependencies_ended_as_valid
        CHECK (ended_as IN ('completed', 'failed', 'cancelled', 'deleted'))
)
"""

JOB_COLUMNS = """
ALTER TABLE worker.jobs
    ADD COLUMN workflow_id uuid,
    ADD COLUMN node text,
    ADD COLUMN waiting_on integer NOT NULL DEFAULT 0,
    ADD COLUMN on_parent_failure text NOT NULL DEFAULT 'cancel',
    ADD CONSTRAINT jobs_waiting_on_positive CHECK (waiting_on >= 0),
    ADD CONSTRAINT jobs_on_parent_failure_valid CHECK (on_parent_failure IN ('cancel', 'run')),
    ADD CONSTRAINT jobs_node_length CHECK (char_length(node) BETWEEN 1 AND 255)
"""

# The rule, in one place. Edges are marked first (each once: `ended_as IS NULL`), so a parent
# that ends again after a retry never counts twice. Children are locked in id order, so two
# transactions releasing overlapping children never deadlock on them. Only `held` children
# change: one cancelled or deleted meanwhile stays as it is.
PARENTS_ENDED = """
CREATE FUNCTION worker.parents_ended(parents uuid[], outcomes text[]) RETURNS integer
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
            status = CASE
                WHEN c.bad_parent IS NOT NULL AND j.on_parent_failure = 'cancel' THEN 'cancelled'
                WHEN j.waiting_on - c.n <= 0 THEN 'pending'
                ELSE 'held' END,
            finished_at = CASE
                WHEN c.bad_parent IS NOT NULL AND j.on_parent_failure = 'cancel' THEN now()
                ELSE j.finished_at END,
            error = CASE
                WHEN c.bad_parent IS NOT NULL AND j.on_parent_failure = 'cancel'
                THEN format('cancelled: parent %s%s was %s', c.bad_parent,
                            coalesce(' (' || (SELECT p.node FROM worker.jobs AS p
                                               WHERE p.id = c.bad_parent) || ')', ''),
                            c.bad_outcome)
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

# Once per UPDATE statement on worker.jobs: the jobs it moved into an ended status release
# their children. A statement ending no job that has children costs a join of the statement's
# own rows with the edges' parent index.
JOBS_ENDED_FUNCTION = """
CREATE FUNCTION worker.jobs_ended() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    ended_ids uuid[];
    ended_outcomes text[];
BEGIN
    SELECT array_agg(n.id), array_agg(n.status) INTO ended_ids, ended_outcomes
    FROM new_rows AS n JOIN old_rows AS o ON o.id = n.id
    WHERE n.status IN ('completed', 'failed', 'cancelled')
      AND o.status NOT IN ('completed', 'failed', 'cancelled')
      AND EXISTS (SELECT FROM worker.job_dependencies AS d WHERE d.parent_id = n.id);
    IF ended_ids IS NOT NULL THEN
        PERFORM worker.parents_ended(ended_ids, ended_outcomes);
    END IF;
    RETURN NULL;
END $$
"""

# A job deleted before it ended (by hand, or a job pruned unended by plain SQL) ends as
# `deleted` for its children; a deleted child takes its edges with it.
JOBS_GONE_FUNCTION = """
CREATE FUNCTION worker.jobs_gone() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    ended_ids uuid[];
BEGIN
    SELECT array_agg(g.id) INTO ended_ids FROM gone AS g
    WHERE g.status NOT IN ('completed', 'failed', 'cancelled')
      AND EXISTS (SELECT FROM worker.job_dependencies AS d WHERE d.parent_id = g.id);
    IF ended_ids IS NOT NULL THEN
        PERFORM worker.parents_ended(ended_ids, array_fill('deleted'::text,
                                                           ARRAY[cardinality(ended_ids)]));
    END IF;
    DELETE FROM worker.job_dependencies WHERE child_id = ANY(ARRAY(SELECT id FROM gone));
    RETURN NULL;
END $$
"""

JOBS_EMPTIED_FUNCTION = """
CREATE FUNCTION worker.jobs_emptied() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    DELETE FROM worker.job_dependencies;
    RETURN NULL;
END $$
"""

TRIGGERS = """
CREATE TRIGGER jobs_ended AFTER UPDATE ON worker.jobs
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION worker.jobs_ended();
CREATE TRIGGER jobs_gone AFTER DELETE ON worker.jobs
    REFERENCING OLD TABLE AS gone
    FOR EACH STATEMENT EXECUTE FUNCTION worker.jobs_gone();
CREATE TRIGGER jobs_emptied AFTER TRUNCATE ON worker.jobs
    FOR EACH STATEMENT EXECUTE FUNCTION worker.jobs_emptied();
"""

# One call writes a whole graph. `jobs` is `sql.ENQUEUE_MANY`'s row array; `nodes` gives each
# job its node name, policy and number of parents (`i`, `n`, `f`, `w`); `edges` its parents
# (`c` child, `p` parent). The workflow's id makes a second call after a lost connection a
# no-op; a live key returns the workflow holding it (`created` false), writing nothing.
# Parents outside the graph are locked before the edges are written: an outcome write for one
# waits for this commit, then its trigger sees the edges; one that ended before is read ended
# here and resolved at once, by the same `worker.parents_ended()`.
ENQUEUE_WORKFLOW = """
CREATE FUNCTION worker.enqueue_workflow(
    workflow uuid, name text, key text, jobs json, nodes json, edges json,
    trace_context jsonb DEFAULT NULL
) RETURNS TABLE (workflow_id uuid, created boolean)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    found uuid;
    outside uuid[];
    ended_ids uuid[];
    ended_outcomes text[];
BEGIN
    INSERT INTO worker.workflows (id, name, key)
    VALUES (enqueue_workflow.workflow, enqueue_workflow.name, enqueue_workflow.key)
    ON CONFLICT DO NOTHING
    RETURNING id INTO found;
    IF found IS NULL THEN
        SELECT w.id INTO found FROM worker.workflows AS w
        WHERE w.id = enqueue_workflow.workflow OR w.key = enqueue_workflow.key
        ORDER BY w.id = enqueue_workflow.workflow DESC LIMIT 1;
        RETURN QUERY SELECT found, false;
        RETURN;
    END IF;

    SELECT array_agg(DISTINCT e.p) INTO outside
    FROM json_to_recordset(edges) AS e(c uuid, p uuid)
    WHERE e.p NOT IN (SELECT x.i FROM json_to_recordset(nodes) AS x(i uuid));
    PERFORM FROM worker.jobs AS j WHERE j.id = ANY(outside) ORDER BY j.id FOR SHARE;

    INSERT INTO worker.jobs (id, task, payload, queue, priority, run_at, max_retries,
                             concurrency_key, trace_context, status, workflow_id, node,
                             waiting_on, on_parent_failure)
    SELECT x.i, x.t, CAST(x.p AS jsonb), x.q, x.pr,
           coalesce(x.ra, now() + make_interval(secs => x.d)), x.mr, x.ck,
           enqueue_workflow.trace_context,
           CASE WHEN n.w > 0 THEN 'held' ELSE 'pending' END,
           enqueue_workflow.workflow, n.n, n.w, n.f
    FROM json_to_recordset(jobs) AS x(i uuid, t text, p json, q text, pr smallint,
                                      ra timestamptz, d float8, mr integer, u text, ck text)
    JOIN json_to_recordset(nodes) AS n(i uuid, n text, f text, w integer) ON n.i = x.i;

    INSERT INTO worker.job_dependencies (child_id, parent_id)
    SELECT e.c, e.p FROM json_to_recordset(edges) AS e(c uuid, p uuid);

    IF outside IS NOT NULL THEN
        SELECT array_agg(o.id), array_agg(coalesce(j.status, 'deleted'))
        INTO ended_ids, ended_outcomes
        FROM unnest(outside) AS o(id) LEFT JOIN worker.jobs AS j ON j.id = o.id
        WHERE j.id IS NULL OR j.status IN ('completed', 'failed', 'cancelled');
        IF ended_ids IS NOT NULL THEN
            PERFORM worker.parents_ended(ended_ids, ended_outcomes);
        END IF;
    END IF;
    RETURN QUERY SELECT enqueue_workflow.workflow, true;
END $$
"""

# What a claimed job of a workflow reads of its parents: each parent's node, id, outcome and
# result, in the order the parents were created (then by id), the order `ctx.parents` gives.
PARENT_RESULTS = """
CREATE FUNCTION worker.parent_results(child uuid) RETURNS jsonb
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    SELECT coalesce(jsonb_agg(jsonb_build_object(
               'id', d.parent_id, 'node', p.node, 'task', p.task,
               'status', coalesce(p.status, d.ended_as), 'result', p.result)
           ORDER BY p.created_at, d.parent_id), '[]'::jsonb)
    FROM worker.job_dependencies AS d LEFT JOIN worker.jobs AS p ON p.id = d.parent_id
    WHERE d.child_id = child
$$
"""

# A job's parents outside any graph, given to `worker.enqueue(..., depends_on => ...)`: locked
# (`FOR SHARE`) before its edges are written, so no parent's outcome commits unseen; those
# already ended are resolved at once by `worker.parents_ended()`. Run as the schema owner:
# the client role may insert jobs, not lock them or write edges.
ADD_DEPENDENCIES = """
CREATE FUNCTION worker.add_dependencies(child uuid, parents uuid[]) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    ended_ids uuid[];
    ended_outcomes text[];
BEGIN
    PERFORM FROM worker.jobs AS j WHERE j.id = ANY(parents) ORDER BY j.id FOR SHARE;
    INSERT INTO worker.job_dependencies (child_id, parent_id)
    SELECT child, p FROM unnest(parents) AS p
    ON CONFLICT DO NOTHING;
    SELECT array_agg(o.id), array_agg(coalesce(j.status, 'deleted'))
    INTO ended_ids, ended_outcomes
    FROM unnest(parents) AS o(id) LEFT JOIN worker.jobs AS j ON j.id = o.id
    WHERE j.id IS NULL OR j.status IN ('completed', 'failed', 'cancelled');
    IF ended_ids IS NOT NULL THEN
        PERFORM worker.parents_ended(ended_ids, ended_outcomes);
    END IF;
END $$
"""

OLD_ENQUEUE = "worker.enqueue(text, jsonb, text, integer, timestamptz, integer, text, text, jsonb)"
NEW_ENQUEUE = (
    "worker.enqueue(text, jsonb, text, integer, timestamptz, integer, text, text, jsonb, uuid[])"
)

# 0009's `worker.enqueue()`, with `depends_on`: the job is `held` until those jobs have ended
# (a job with a unique key already held returns that job, as before, and adds no edge).
ENQUEUE_FUNCTION = """
CREATE FUNCTION worker.enqueue(
    task text,
    payload jsonb DEFAULT '{}'::jsonb,
    queue text DEFAULT 'default',
    priority integer DEFAULT 0,
    run_at timestamptz DEFAULT now(),
    max_retries integer DEFAULT NULL,
    unique_key text DEFAULT NULL,
    concurrency_key text DEFAULT NULL,
    trace_context jsonb DEFAULT NULL,
    depends_on uuid[] DEFAULT NULL
) RETURNS uuid LANGUAGE plpgsql AS $$
DECLARE
    job uuid;
    parents uuid[] := ARRAY(SELECT DISTINCT p FROM unnest(coalesce(enqueue.depends_on, '{}'))
                            AS p WHERE p IS NOT NULL);
BEGIN
    FOR attempt IN 1..5 LOOP
        INSERT INTO worker.jobs (task, payload, queue, priority, run_at, max_retries,
                                 unique_key, concurrency_key, trace_context, status, waiting_on)
        VALUES (enqueue.task, enqueue.payload, enqueue.queue, enqueue.priority, enqueue.run_at,
                enqueue.max_retries, enqueue.unique_key, enqueue.concurrency_key,
                enqueue.trace_context,
                CASE WHEN cardinality(parents) > 0 THEN 'held' ELSE 'pending' END,
                cardinality(parents))
        ON CONFLICT DO NOTHING
        RETURNING id INTO job;
        IF job IS NOT NULL THEN
            IF cardinality(parents) > 0 THEN
                PERFORM worker.add_dependencies(job, parents);
            END IF;
            RETURN job;
        END IF;
        SELECT id INTO job FROM worker.jobs AS j
        WHERE j.unique_key = enqueue.unique_key
          AND j.status IN ('pending', 'processing', 'paused', 'held');
        IF job IS NOT NULL THEN
            RETURN job;
        END IF;
    END LOOP;
    RAISE EXCEPTION 'the job holding unique key % kept changing: try again', unique_key;
END $$
"""

WORKFLOW_STATS = """
CREATE VIEW worker.workflow_stats AS
SELECT w.id, w.name, w.key, w.created_at,
       count(j.id) AS jobs,
       count(j.id) FILTER (WHERE j.status = 'held') AS held,
       count(j.id) FILTER (WHERE j.status = 'pending') AS pending,
       count(j.id) FILTER (WHERE j.status = 'processing') AS processing,
       count(j.id) FILTER (WHERE j.status = 'paused') AS paused,
       count(j.id) FILTER (WHERE j.status = 'completed') AS completed,
       count(j.id) FILTER (WHERE j.status = 'failed') AS failed,
       count(j.id) FILTER (WHERE j.status = 'cancelled') AS cancelled,
       max(j.finished_at) AS last_finished_at
FROM worker.workflows AS w LEFT JOIN worker.jobs AS j ON j.workflow_id = w.id
GROUP BY w.id
"""

HELD_JOBS = """
CREATE VIEW worker.held_jobs AS
SELECT j.id, j.workflow_id, j.node, j.queue, j.task, j.waiting_on, j.created_at,
       array_agg(d.parent_id ORDER BY d.parent_id) AS waiting_for
FROM worker.jobs AS j JOIN worker.job_dependencies AS d
    ON d.child_id = j.id AND d.ended_as IS NULL
WHERE j.status = 'held'
GROUP BY j.id
"""

INDEXES = """
CREATE INDEX job_dependencies_parent_idx ON worker.job_dependencies (parent_id);
CREATE UNIQUE INDEX workflows_key_idx ON worker.workflows (key) WHERE key IS NOT NULL;
CREATE INDEX jobs_workflow_idx ON worker.jobs (workflow_id) WHERE workflow_id IS NOT NULL;
CREATE INDEX jobs_held_idx ON worker.jobs (queue) WHERE status = 'held';
"""

ENQUEUE_WORKFLOW_SIGNATURE = "worker.enqueue_workflow(uuid, text, text, json, json, json, jsonb)"

_CLIENT_MARK = "GRANT SELECT ON worker.unserved_tasks TO worker_client;"
_RUNNER_MARK = "GRANT SELECT ON worker.unserved_tasks TO worker_runner;"
_CLIENT_MORE = (
    "GRANT SELECT ON worker.workflows, worker.job_dependencies, worker.workflow_stats, "
    "worker.held_jobs TO worker_client;\n"
    f"        GRANT EXECUTE ON FUNCTION {ENQUEUE_WORKFLOW_SIGNATURE} TO worker_client;\n"
    "        GRANT EXECUTE ON FUNCTION worker.add_dependencies(uuid, uuid[]) TO worker_client;"
)
_RUNNER_MORE = (
    "GRANT SELECT ON worker.workflows, worker.job_dependencies, worker.workflow_stats, "
    "worker.held_jobs TO worker_runner;\n"
    f"        GRANT EXECUTE ON FUNCTION {ENQUEUE_WORKFLOW_SIGNATURE} TO worker_runner;\n"
    "        GRANT EXECUTE ON FUNCTION worker.add_dependencies(uuid, uuid[]) TO worker_runner;"
)


def _revision(filename: str):  # type: ignore[no-untyped-def]
    path = Path(__file__).with_name(filename)
    spec = importlib.util.spec_from_file_location(f"_worker_migration_{path.stem}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _base_grants() -> str:
    """0013's `worker.grant_roles()`."""
    return str(_revision("0013_failure_groups_and_task_limits.py")._grants())


def _grants() -> str:
    text = _base_grants()
    assert _CLIENT_MARK in text and _RUNNER_MARK in text and OLD_ENQUEUE in text
    text = text.replace(OLD_ENQUEUE, NEW_ENQUEUE)
    return text.replace(_CLIENT_MARK, f"{_CLIENT_MARK}\n        {_CLIENT_MORE}").replace(
        _RUNNER_MARK, f"{_RUNNER_MARK}\n        {_RUNNER_MORE}"
    )


def upgrade() -> None:
    op.execute(
        "ALTER TABLE worker.jobs DROP CONSTRAINT jobs_status_valid, "
        f"ADD CONSTRAINT jobs_status_valid CHECK (status IN ({STATUSES_AFTER}))"
    )
    op.execute(JOB_COLUMNS)
    op.execute("DROP INDEX worker.jobs_unique_key_idx")
    op.execute(
        "CREATE UNIQUE INDEX jobs_unique_key_idx ON worker.jobs (unique_key) "
        f"WHERE unique_key IS NOT NULL AND {LIVE_AFTER}"
    )
    op.execute(WORKFLOWS_TABLE)
    op.execute(DEPENDENCIES_TABLE)
    op.execute(INDEXES)
    op.execute(PARENTS_ENDED)
    op.execute(JOBS_ENDED_FUNCTION)
    op.execute(JOBS_GONE_FUNCTION)
    op.execute(JOBS_EMPTIED_FUNCTION)
    op.execute(TRIGGERS)
    op.execute(ENQUEUE_WORKFLOW)
    op.execute(ADD_DEPENDENCIES)
    op.execute(f"DROP FUNCTION {OLD_ENQUEUE}")
    op.execute(ENQUEUE_FUNCTION)
    op.execute(PARENT_RESULTS)
    op.execute(WORKFLOW_STATS)
    op.execute(HELD_JOBS)
    op.execute(f"REVOKE ALL ON FUNCTION {ENQUEUE_WORKFLOW_SIGNATURE} FROM PUBLIC")
    op.execute("REVOKE ALL ON FUNCTION worker.add_dependencies(uuid, uuid[]) FROM PUBLIC")
    op.execute(_grants())
    op.execute("SELECT worker.grant_roles()")


def downgrade() -> None:
    op.execute("DROP VIEW worker.held_jobs")
    op.execute("DROP VIEW worker.workflow_stats")
    op.execute("DROP FUNCTION worker.parent_results(uuid)")
    op.execute(f"DROP FUNCTION {ENQUEUE_WORKFLOW_SIGNATURE}")
    op.execute(f"DROP FUNCTION {NEW_ENQUEUE}")
    before = _revision("0009_trace_context.py")
    op.execute(before._with_trace_context(before._0008.ENQUEUE_FUNCTION))
    op.execute("DROP FUNCTION worker.add_dependencies(uuid, uuid[])")
    op.execute("DROP TRIGGER jobs_emptied ON worker.jobs")
    op.execute("DROP TRIGGER jobs_gone ON worker.jobs")
    op.execute("DROP TRIGGER jobs_ended ON worker.jobs")
    op.execute("DROP FUNCTION worker.jobs_emptied()")
    op.execute("DROP FUNCTION worker.jobs_gone()")
    op.execute("DROP FUNCTION worker.jobs_ended()")
    op.execute("DROP FUNCTION worker.parents_ended(uuid[], text[])")
    op.execute("DROP TABLE worker.job_dependencies")
    op.execute("DROP TABLE worker.workflows")
    op.execute("DELETE FROM worker.jobs WHERE status = 'held'")
    op.execute("DROP INDEX worker.jobs_unique_key_idx")
    op.execute(
        "CREATE UNIQUE INDEX jobs_unique_key_idx ON worker.jobs (unique_key) "
        f"WHERE unique_key IS NOT NULL AND {LIVE_BEFORE}"
    )
    op.execute(
        "ALTER TABLE worker.jobs DROP COLUMN on_parent_failure, DROP COLUMN waiting_on, "
        "DROP COLUMN node, DROP COLUMN workflow_id"
    )
    op.execute(
        "ALTER TABLE worker.jobs DROP CONSTRAINT jobs_status_valid, "
        f"ADD CONSTRAINT jobs_status_valid CHECK (status IN ({STATUSES_BEFORE}))"
    )
    op.execute(_base_grants())
    op.execute("SELECT worker.grant_roles()")
