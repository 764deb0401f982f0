"""Every statement the package runs, named, a module per concern.

Parameters use psycopg's `%(name)s` style; the client runs these through SQLAlchemy's
`exec_driver_sql`, the daemon through psycopg directly. Each statement that can race another
says in one line why it is safe. Callers name a statement as `sql.CLAIM`, wherever it lives:

- `enqueue`: one job, a batch, and their idempotent twins;
- `claim`: the worker's hot path, the claim and the outcome write;
- `liveness`: registrations, heartbeats, the rescue of a dead worker's jobs;
- `actions`: cancel, resume, retry and read one job; retention;
- `stages`: a pipeline's stage bookkeeping;
- `events`: progress events;
- `queues`: pausing, resuming and limiting a queue, and each queue's state;
- `schedules`: a periodic task's tick, fired once by any number of workers;
- `workflows`: a graph of jobs written at once, read, counted and cancelled;
- `admin`: the read-only questions of the HTTP edge, the CLI and the metrics, the CLI's
  bulk writes, and the demo's and the bench's questions about their own jobs.

Each statement is one string, whole, as psql would take it. What statements share is either
repeated (a line or two) or a function or view of the schema (its migration says why).

The outcome guard: every write an attempt makes (its outcome, a stage's bookkeeping, a failure
for good) applies only while the attempt holds the job, `j.status = 'processing' AND
j.worker_id = %(worker_id)s AND j.retry_count = <the retry count it was claimed with>`. A job
rescued from this worker (then finished by another, or claimed again by this one) is never
overwritten by the attempt the rescue ended. `tests/test_statements.py` checks that each such
write carries it.
"""

from worker.db.sql.actions import (
    CANCEL,
    GET_JOB,
    GET_STAGES,
    JOB_STATUS,
    LOAD_STAGES,
    PRUNE_BATCH,
    RESUME,
    RETRY,
)
from worker.db.sql.admin import (
    COUNT_FINISHED,
    COUNT_LIVE_WORKERS,
    COUNT_PRUNABLE,
    COUNT_RETRYABLE,
    COUNT_UNCOMPLETED,
    DELETE_QUEUE,
    FAILURE_GROUPS,
    FIND_JOBS,
    HAS_VERSION_TABLE,
    HEALTH,
    JOB_STATS,
    JOBS_BY_ID_PREFIX,
    JOBS_BY_ID_SUFFIX,
    LAST_EVENTS,
    LEFT_TO_RUN,
    LIST_WORKERS,
    OUTCOMES,
    QUEUE_STATS,
    RETRY_BATCH,
    RETRY_LIMIT,
    SCHEMA_REVISION,
    SET_LEASE,
    STUCK_BY_QUEUE,
    SUMMARY_BY_STATUS,
    UNSERVED_TASKS,
)
from worker.db.sql.claim import (
    CLAIM,
    CLAIM_ONE_QUEUE,
    RECORD_OUTCOMES,
)
from worker.db.sql.enqueue import (
    ENQUEUE,
    ENQUEUE_AGAIN,
    ENQUEUE_MANY,
    ENQUEUE_MANY_AGAIN,
    ENQUEUE_MANY_COPY,
    ENQUEUE_MANY_COPY_TRACED,
    ENQUEUE_MANY_UNIQUE,
    ENQUEUE_UNIQUE,
)
from worker.db.sql.events import (
    PUBLISH_EVENTS,
    READ_EVENTS,
)
from worker.db.sql.liveness import (
    CANCEL_REQUESTED,
    DEREGISTER_WORKER,
    HEARTBEAT,
    HELD_JOBS,
    HOLD_LIVENESS,
    REGISTER_WORKER,
    RELEASE,
    RESCUE,
)
from worker.db.sql.queues import LIMIT_QUEUE, PAUSE_QUEUE, QUEUE_STATES, RESUME_QUEUE
from worker.db.sql.schedules import (
    FIRE_TICK,
    SCHEDULE_ROWS,
)
from worker.db.sql.stages import (
    RECORD_FINAL_ERROR,
    STAGE_WRITES,
)
from worker.db.sql.workflows import (
    CANCEL_WORKFLOW,
    ENQUEUE_WORKFLOW,
    GET_WORKFLOW,
    LIST_WORKFLOWS,
    SPAWN,
    WAITING_FOR,
    WORKFLOW_JOBS,
)

__all__ = [
    "CANCEL",
    "CANCEL_REQUESTED",
    "CANCEL_WORKFLOW",
    "CLAIM",
    "CLAIM_ONE_QUEUE",
    "COUNT_FINISHED",
    "COUNT_LIVE_WORKERS",
    "COUNT_PRUNABLE",
    "COUNT_RETRYABLE",
    "COUNT_UNCOMPLETED",
    "DELETE_QUEUE",
    "DEREGISTER_WORKER",
    "ENQUEUE",
    "ENQUEUE_AGAIN",
    "ENQUEUE_MANY",
    "ENQUEUE_MANY_AGAIN",
    "ENQUEUE_MANY_COPY",
    "ENQUEUE_MANY_COPY_TRACED",
    "ENQUEUE_MANY_UNIQUE",
    "ENQUEUE_UNIQUE",
    "ENQUEUE_WORKFLOW",
    "FAILURE_GROUPS",
    "FIND_JOBS",
    "FIRE_TICK",
    "GET_JOB",
    "GET_STAGES",
    "GET_WORKFLOW",
    "HAS_VERSION_TABLE",
    "HEALTH",
    "HEARTBEAT",
    "HELD_JOBS",
    "HOLD_LIVENESS",
    "JOBS_BY_ID_PREFIX",
    "JOBS_BY_ID_SUFFIX",
    "JOB_STATS",
    "JOB_STATUS",
    "LAST_EVENTS",
    "LEFT_TO_RUN",
    "LIMIT_QUEUE",
    "LIST_WORKERS",
    "LIST_WORKFLOWS",
    "LOAD_STAGES",
    "OUTCOMES",
    "PAUSE_QUEUE",
    "PRUNE_BATCH",
    "PUBLISH_EVENTS",
    "QUEUE_STATES",
    "QUEUE_STATS",
    "READ_EVENTS",
    "RECORD_FINAL_ERROR",
    "RECORD_OUTCOMES",
    "REGISTER_WORKER",
    "RELEASE",
    "RESCUE",
    "RESUME",
    "RESUME_QUEUE",
    "RETRY",
    "RETRY_BATCH",
    "RETRY_LIMIT",
    "SCHEDULE_ROWS",
    "SCHEMA_REVISION",
    "SET_LEASE",
    "SPAWN",
    "STAGE_WRITES",
    "STUCK_BY_QUEUE",
    "SUMMARY_BY_STATUS",
    "UNSERVED_TASKS",
    "WAITING_FOR",
    "WORKFLOW_JOBS",
]
