"""Workflows: a graph of jobs written at once, read back, counted and cancelled.

The rule that releases a held job (a child becomes due in the transaction that records its
last parent's outcome) is not here: it lives in the database, `worker.parents_ended()`, which
the triggers `jobs_ended` and `jobs_gone` call for every write that ends a job (migration 0014).
Nor is its reverse: a job moved back out of an ended status (a retry) re-arms the children its
ending cancelled, by `worker.parents_retried()` from the same trigger (migration 0018).
"""

# Safe: one call of `worker.enqueue_workflow()` writes the workflow, every job and every edge
# in one statement, hence one transaction (the caller's, when given); parents outside the graph
# are locked while the edges are written, so none ends unseen. Idempotent by the workflow's id:
# run again after a lost connection, it writes nothing more. Casts are written CAST(x AS t) so
# a caller's connection on any driver runs it.
ENQUEUE_WORKFLOW = """
SELECT workflow_id, created FROM worker.enqueue_workflow(
    CAST(%(id)s AS uuid), %(name)s, %(key)s, CAST(%(jobs)s AS json), CAST(%(nodes)s AS json),
    CAST(%(edges)s AS json), CAST(%(trace_context)s AS jsonb))
"""

# Safe: one call of `worker.spawn()` (migration 0017) writes a running job's children and
# their edges, with the spawner's row locked; each child's id is made from the spawner's id and
# its key, so run again (a stage retried, a lost connection) it finds the children it wrote
# before and writes nothing more (`created` false).
SPAWN = """
SELECT spawned_id, created FROM worker.spawn(
    CAST(%(spawner)s AS uuid), CAST(%(jobs)s AS json), CAST(%(children)s AS json),
    CAST(%(trace_context)s AS jsonb))
"""

GET_WORKFLOW = """
SELECT id, name, key, created_at, held, pending, processing, paused, completed, failed,
       cancelled
FROM worker.workflow_stats WHERE id = %(id)s
"""

# Each job of a workflow in the order its graph was added (ids are time-ordered), with the
# parents it waits for (ended or not) as ids, parents first.
WORKFLOW_JOBS = """
SELECT j.id, j.node, j.task, j.queue, j.status, j.payload, j.priority, j.max_retries,
       j.concurrency_key, j.error, j.waiting_on,
       coalesce((SELECT array_agg(d.parent_id ORDER BY d.parent_id)
                 FROM worker.job_dependencies AS d WHERE d.child_id = j.id), '{}') AS parents,
       coalesce((SELECT array_agg(d.parent_id ORDER BY d.parent_id)
                 FROM worker.job_dependencies AS d
                 WHERE d.child_id = j.id AND d.ended_as IS NULL), '{}') AS waiting_for
FROM worker.jobs AS j WHERE j.workflow_id = %(id)s
ORDER BY j.id
"""

# Newest first, with their counts (`worker.workflow_stats`).
LIST_WORKFLOWS = """
SELECT id, name, key, created_at, jobs, held, pending, processing, paused, completed, failed,
       cancelled
FROM worker.workflow_stats
ORDER BY created_at DESC, id DESC
LIMIT %(limit)s
"""

# The parents a held job still waits for (`worker show`).
WAITING_FOR = """
SELECT d.parent_id, p.node, p.task, p.status
FROM worker.job_dependencies AS d LEFT JOIN worker.jobs AS p ON p.id = d.parent_id
WHERE d.child_id = %(id)s AND d.ended_as IS NULL
ORDER BY d.parent_id
"""

# Safe: the workflow's live jobs are locked in id order (parents before their children, as
# ids are time-ordered and a graph is added parents first), the order the release of children
# locks them in, so this never deadlocks with an outcome write. As `sql.CANCEL` for each job:
# one not running and owing no cleanup is cancelled at once, a running one gets the request.
# A job whose policy is `run` (a finalizer) or `run_if_failed` (a batch's `on_failure`) is left
# to its parents' outcomes; the trigger `jobs_ended` (migration 0014) settles the held children
# of the jobs cancelled here.
CANCEL_WORKFLOW = """
WITH target AS (
    SELECT j.id, j.status, worker.owed_cleanup_attempt(j.id) IS NOT NULL AS owes_cleanup
    FROM worker.jobs AS j
    WHERE j.workflow_id = %(id)s AND j.on_parent_failure NOT IN ('run', 'run_if_failed')
      AND j.status IN ('pending', 'paused', 'processing', 'held')
    ORDER BY j.id
    FOR UPDATE
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
    WHERE j.id = t.id AND j.status IN ('pending', 'paused', 'processing', 'held')
    RETURNING j.id, j.status, j.queue
)
SELECT count(CASE c.status WHEN 'cancelled' THEN pg_notify('worker_done', c.id::text)
                           WHEN 'processing' THEN pg_notify('worker_cancel', c.id::text)
                           WHEN 'pending' THEN pg_notify('worker_jobs', c.queue) END IS NULL)
       AS changed
FROM changed AS c
"""
