"""Liveness: registrations and heartbeats (the workers' leases), and the rescue of their jobs."""

# The row says which tasks the worker serves (the claim takes no other) and its lease, for
# `worker.unserved_tasks` to tell the jobs no live worker will take; registering again (after a
# rescuer removed the row) writes them again.
REGISTER_WORKER = """
INSERT INTO worker.workers (id, hostname, pid, queues, concurrency, tasks, lease_seconds,
                            liveness_key)
VALUES (%(id)s, %(hostname)s, %(pid)s, %(queues)s, %(concurrency)s, %(tasks)s,
        %(lease_seconds)s, %(liveness_key)s)
ON CONFLICT (id) DO UPDATE SET heartbeat_at = now(), tasks = EXCLUDED.tasks,
                               lease_seconds = EXCLUDED.lease_seconds
"""

# One row per worker, not per job: the heartbeat is the lease on every job the worker holds.
# A beat lost in a server crash costs nothing (the next one comes within a second), so it
# commits without waiting for the flush, for this transaction only (as the claim does).
HEARTBEAT = """
UPDATE worker.workers SET heartbeat_at = now()
WHERE id = %(id)s AND set_config('synchronous_commit', 'off', true) IS NOT NULL
"""

# The claim session of a worker holds this shared advisory lock for as long as it lives: when
# the worker's process dies, the server ends its sessions and the lock goes with them, which
# the rescuer sees (`RESCUE`) long before the lease runs out. Shared, so that a session being
# replaced and its successor may hold it at once. The first key is the lock's namespace.
HOLD_LIVENESS = "SELECT pg_advisory_lock_shared(2003528822, %(key)s)"

# Read-only: the heartbeat's fallback for a lost NOTIFY on `worker_cancel`.
CANCEL_REQUESTED = """
SELECT id::text FROM worker.jobs
WHERE status = 'processing' AND worker_id = %(worker_id)s AND cancel_requested
"""

DEREGISTER_WORKER = "DELETE FROM worker.workers WHERE id = %(id)s"

# A worker is dead, and its jobs go back to `pending`, when either
# - it has not beaten for a whole lease (a hung host, a partition, an old worker without a
#   liveness lock): a live worker beats far more often than that; or
# - its liveness lock is held by no session (`HOLD_LIVENESS`), that was first seen
#   (`session_lost_at`) within two graces of its last beat, and it has not beaten since, for
#   `grace` seconds: the server ended every session of its process as it stopped beating. A
#   live worker whose session was cut (a backend killed, a session replaced) beats again
#   within the grace and is only marked. A worker cut off by the network keeps its sessions on
#   the server, or loses them only when the link returns, long after its last beat: the lease
#   alone judges it. A rescuer that has just started (`starting`) sees the sessions of a
#   fleet that died before it late, and takes that for what it is.
# No session is judged in the lease after the server started (a restart ended every session
# and stalled every heartbeat), nor, by a rescuer just started, any lease; and the caller
# judges only while its own heartbeat is healthy.
# Safe: `marked` and `dead` touch disjoint rows (a mark is made only where none stands or a
# beat came after it; a rescue only where none came after it); SKIP LOCKED lets two rescuers
# split the orphans instead of waiting on each other. A rescued job counts the lost attempt;
# the claim decides what to do when none remain.
RESCUE = """
WITH sure AS (
    SELECT pg_postmaster_start_time() < now() - make_interval(secs => %(lease)s) AS ok
), held AS MATERIALIZED (
    SELECT objid FROM pg_locks
    WHERE locktype = 'advisory' AND classid = 2003528822 AND objsubid = 2 AND granted
      AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
), lockless AS (
    SELECT w.id, w.heartbeat_at, w.session_lost_at FROM worker.workers AS w
    WHERE w.liveness_key IS NOT NULL AND (SELECT ok FROM sure)
      AND w.liveness_key::oid NOT IN (SELECT objid FROM held)
), marked AS (
    UPDATE worker.workers AS w SET session_lost_at = now()
    FROM lockless AS l
    WHERE w.id = l.id AND (l.session_lost_at IS NULL OR l.heartbeat_at >= l.session_lost_at)
), dead AS (
    DELETE FROM worker.workers AS w
    WHERE (w.heartbeat_at < now() - make_interval(secs => %(lease)s)
           AND (NOT %(starting)s OR (SELECT ok FROM sure)))
       OR (w.id IN (SELECT id FROM lockless
                       WHERE session_lost_at < now() - make_interval(secs => %(grace)s)
                         AND heartbeat_at < session_lost_at
                         AND (%(starting)s OR session_lost_at - heartbeat_at
                                              < make_interval(secs => 2 * %(grace)s))))
    RETURNING id, heartbeat_at >= now() - make_interval(secs => %(lease)s) AS session_ended
), orphans AS (
    SELECT j.id, coalesce(d.session_ended, false) AS session_ended FROM worker.jobs AS j
    LEFT JOIN dead AS d ON d.id = j.worker_id
    WHERE j.status = 'processing'
      AND (d.id IS NOT NULL
           OR (NOT EXISTS (SELECT 1 FROM worker.workers AS w WHERE w.id = j.worker_id)
               AND (NOT %(starting)s OR (SELECT ok FROM sure))))
    FOR UPDATE OF j SKIP LOCKED
)
UPDATE worker.jobs AS j
SET status = 'pending', retry_count = j.retry_count + 1, run_at = now(),
    error = CASE WHEN orphans.session_ended
                 THEN 'the worker running this job was lost (its database sessions ended)'
                 ELSE 'the worker running this job was lost (no heartbeat for '
                      || %(lease)s::text || ' s)' END
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
