"""Liveness: registrations and heartbeats (the workers' leases), and the rescue of their jobs."""

# The row says which tasks the worker serves (the claim takes no other) and its lease, for
# `worker.unserved_tasks` to tell the jobs no live worker will take; registering again (after a
# rescuer removed the row) writes them again.
REGISTER_WORKER = """
INSERT INTO worker.workers (id, hostname, pid, queues, concurrency, tasks, lease_seconds)
VALUES (%(id)s, %(hostname)s, %(pid)s, %(queues)s, %(concurrency)s, %(tasks)s,
        %(lease_seconds)s)
ON CONFLICT (id) DO UPDATE SET heartbeat_at = now(), tasks = EXCLUDED.tasks,
                               lease_seconds = EXCLUDED.lease_seconds
"""

# One row per worker, not per job: the heartbeat is the lease on every job the worker holds.
HEARTBEAT = "UPDATE worker.workers SET heartbeat_at = now() WHERE id = %(id)s"

# Read-only: the heartbeat's fallback for a lost NOTIFY on `worker_cancel`.
CANCEL_REQUESTED = """
SELECT id::text FROM worker.jobs
WHERE status = 'processing' AND worker_id = %(worker_id)s AND cancel_requested
"""

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
