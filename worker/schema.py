"""The tables of the `worker` PostgreSQL schema, as SQLAlchemy Core.

The Alembic migrations in `migrations/` create exactly these (a test compares them). Every
column of `worker.jobs` but `task` has a default, so a plain
`INSERT INTO worker.jobs (task, payload) VALUES ('name', '{}')` is a complete enqueue.
"""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Boolean,
    CheckConstraint,
    Column,
    DateTime,
    Double,
    Index,
    Integer,
    MetaData,
    PrimaryKeyConstraint,
    SmallInteger,
    Table,
    Text,
    text,
)
from sqlalchemy.dialects.postgresql import ARRAY, JSONB, UUID

SCHEMA = "worker"
STATUSES = ("pending", "processing", "completed", "failed", "paused", "cancelled", "held")
MAX_TASK_NAME = 255
PRIORITY_RANGE = (-100, 100)

metadata = MetaData(schema=SCHEMA)

_status_list = ", ".join(f"'{s}'" for s in STATUSES)
# The statuses of a job that holds its unique key.
LIVE = "status IN ('pending', 'processing', 'paused', 'held')"

jobs = Table(
    "jobs",
    metadata,
    # Time-ordered (UUIDv7, migration 0001): new rows share primary-key pages, see the migration.
    Column("id", UUID(as_uuid=True), primary_key=True, server_default=text("worker.uuid_v7()")),
    Column("queue", Text, nullable=False, server_default=text("'default'")),
    Column("task", Text, nullable=False),
    Column("payload", JSONB, nullable=False, server_default=text("'{}'::jsonb")),
    Column("status", Text, nullable=False, server_default=text("'pending'")),
    Column("priority", SmallInteger, nullable=False, server_default=text("0")),
    Column("run_at", DateTime(timezone=True), nullable=False, server_default=text("now()")),
    Column("retry_count", Integer, nullable=False, server_default=text("0")),
    # NULL: the worker's WORKER_MAX_RETRIES applies, so SQL inserts follow the operator's setting.
    Column("max_retries", Integer, nullable=True),
    Column("result", JSONB, nullable=True),
    Column("error", Text, nullable=True),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=text("now()")),
    Column("started_at", DateTime(timezone=True), nullable=True),
    Column("finished_at", DateTime(timezone=True), nullable=True),
    # The claiming worker; its heartbeat in worker.workers is the lease on the job.
    Column("worker_id", UUID(as_uuid=True), nullable=True),
    Column("cancel_requested", Boolean, nullable=False, server_default=text("false")),
    # Pause for a human: the question asked, then the operator's answer.
    Column("question", JSONB, nullable=True),
    Column("answer", JSONB, nullable=True),
    # A pipeline attempt that failed for good, recorded before its cleanups run (migration 0004).
    Column("final_error", Text, nullable=True),
    # While a job with a key is live, no other job takes that key (migration 0008).
    Column("unique_key", Text, nullable=True),
    # Jobs sharing a key run at most their task's `concurrency` at once (migration 0008).
    Column("concurrency_key", Text, nullable=True),
    # The trace the job was enqueued in, for its attempts to continue (migration 0009).
    Column("trace_context", JSONB, nullable=True),
    # A job of a workflow: its graph, its node's name, how many of its parents have not ended
    # (it is `held` while any has not), and what a parent failing does to it (migration 0014).
    Column("workflow_id", UUID(as_uuid=True), nullable=True),
    Column("node", Text, nullable=True),
    Column("waiting_on", Integer, nullable=False, server_default=text("0")),
    Column("on_parent_failure", Text, nullable=False, server_default=text("'cancel'")),
    # How many of its parents ended without completing, for `run_if_failed` (migration 0016).
    Column("failed_parents", Integer, nullable=False, server_default=text("0")),
    CheckConstraint(f"status IN ({_status_list})", name="jobs_status_valid"),
    CheckConstraint(
        f"char_length(task) BETWEEN 1 AND {MAX_TASK_NAME}", name="jobs_task_name_length"
    ),
    CheckConstraint("char_length(queue) BETWEEN 1 AND 255", name="jobs_queue_name_length"),
    CheckConstraint("jsonb_typeof(payload) = 'object'", name="jobs_payload_is_object"),
    CheckConstraint(
        f"priority BETWEEN {PRIORITY_RANGE[0]} AND {PRIORITY_RANGE[1]}", name="jobs_priority_range"
    ),
    CheckConstraint("retry_count >= 0", name="jobs_retry_count_positive"),
    CheckConstraint("max_retries IS NULL OR max_retries >= 0", name="jobs_max_retries_positive"),
    # Only runnable rows: the claim reads this index and nothing else, however many rows finished.
    # Within a priority, jobs started before (snoozed, retried, rescued) come first (0011).
    Index(
        "jobs_runnable_idx",
        "queue",
        text("priority DESC"),
        text("(started_at IS NULL)"),
        "run_at",
        postgresql_where=text("status = 'pending'"),
    ),
    Index("jobs_processing_idx", "worker_id", postgresql_where=text("status = 'processing'")),
    # Few rows each (migration 0002): the admin views and `worker jobs` read paused and failed
    # jobs without touching the completed ones.
    Index("jobs_paused_idx", "queue", postgresql_where=text("status = 'paused'")),
    Index("jobs_failed_idx", "finished_at", postgresql_where=text("status = 'failed'")),
    Index(
        "jobs_finished_idx",
        "finished_at",
        postgresql_where=text("status IN ('completed', 'failed', 'cancelled')"),
    ),
    Index("jobs_created_idx", "created_at"),
    CheckConstraint("char_length(unique_key) BETWEEN 1 AND 255", name="jobs_unique_key_length"),
    CheckConstraint(
        "char_length(concurrency_key) BETWEEN 1 AND 255", name="jobs_concurrency_key_length"
    ),
    Index(
        "jobs_concurrency_key_idx",
        "concurrency_key",
        postgresql_where=text("status = 'processing' AND concurrency_key IS NOT NULL"),
    ),
    CheckConstraint("waiting_on >= 0", name="jobs_waiting_on_positive"),
    CheckConstraint(
        "on_parent_failure IN ('cancel', 'run', 'run_if_failed')",
        name="jobs_on_parent_failure_valid",
    ),
    CheckConstraint("failed_parents >= 0", name="jobs_failed_parents_positive"),
    CheckConstraint("char_length(node) BETWEEN 1 AND 255", name="jobs_node_length"),
    Index("jobs_workflow_idx", "workflow_id", postgresql_where=text("workflow_id IS NOT NULL")),
    Index("jobs_held_idx", "queue", postgresql_where=text("status = 'held'")),
    Index(
        "jobs_live_workflow_idx",
        "workflow_id",
        postgresql_where=text(
            "workflow_id IS NOT NULL AND status IN ('pending', 'processing', 'paused', 'held')"
        ),
    ),
    Index(
        "jobs_unique_key_idx",
        "unique_key",
        unique=True,
        postgresql_where=text(f"unique_key IS NOT NULL AND {LIVE}"),
    ),
)

# A row per queue an operator paused or limited (migration 0008); other queues have none.
queues = Table(
    "queues",
    metadata,
    Column("name", Text, primary_key=True),
    Column("paused", Boolean, nullable=False, server_default=text("false")),
    Column("concurrency", Integer, nullable=True),
    Column("rate", Double, nullable=True),  # jobs started per second, at most
    Column("burst", Double, nullable=True),  # tokens the bucket holds at most
    Column("tokens", Double, nullable=False, server_default=text("0")),
    Column("refilled_at", DateTime(timezone=True), nullable=False, server_default=text("now()")),
    Column("updated_at", DateTime(timezone=True), nullable=False, server_default=text("now()")),
    CheckConstraint("char_length(name) BETWEEN 1 AND 255", name="queues_name_check"),
    CheckConstraint("concurrency > 0", name="queues_concurrency_check"),
    CheckConstraint("rate > 0", name="queues_rate_check"),
    CheckConstraint("burst >= 1", name="queues_burst_check"),
)

workers = Table(
    "workers",
    metadata,
    Column("id", UUID(as_uuid=True), primary_key=True),
    Column("hostname", Text, nullable=False),
    Column("pid", Integer, nullable=False),
    Column("queues", ARRAY(Text), nullable=False),
    Column("concurrency", Integer, nullable=False),
    Column("started_at", DateTime(timezone=True), nullable=False, server_default=text("now()")),
    Column("heartbeat_at", DateTime(timezone=True), nullable=False, server_default=text("now()")),
    # The tasks it registered, the only ones it claims; NULL: a release before migration 0012,
    # which claims every task of its queues.
    Column("tasks", ARRAY(Text), nullable=True),
    # How long its heartbeat may be silent before it counts as dead (migration 0012).
    Column("lease_seconds", Double, nullable=False, server_default=text("15")),
    CheckConstraint("lease_seconds > 0", name="workers_lease_positive"),
    # The shared advisory lock its claim session holds while it lives; NULL behind a pooler.
    Column("liveness_key", Integer, nullable=True),
    # When a rescuer first saw that lock held by no session (`worker.db.sql.liveness`).
    Column("session_lost_at", DateTime(timezone=True), nullable=True),
)

# A stage row and an event go with their job: the trigger `jobs_deleted` (migration 0006)
# deletes them in the statement that deletes the job, without a foreign key's lookup and lock
# on the job's row for every row written.
job_stages = Table(
    "job_stages",
    metadata,
    Column("job_id", UUID(as_uuid=True), nullable=False),
    Column("stage", Text, nullable=False),
    Column("kind", Text, nullable=False, server_default=text("'stage'")),
    Column("status", Text, nullable=False),
    Column("output", JSONB, nullable=True),
    Column("error", Text, nullable=True),
    Column("attempt", Integer, nullable=False),
    Column("started_at", DateTime(timezone=True), nullable=False, server_default=text("now()")),
    Column("finished_at", DateTime(timezone=True), nullable=True),
    PrimaryKeyConstraint("job_id", "stage", name="job_stages_pkey"),
    CheckConstraint("kind IN ('stage', 'cleanup')", name="job_stages_kind_valid"),
    # `waiting`: a cleanup its attempt has yet to run, after the one running (migration 0005).
    CheckConstraint(
        "status IN ('running', 'completed', 'failed', 'paused', 'snoozed', 'cancelled', 'waiting')",
        name="job_stages_status_valid",
    ),
)

job_events = Table(
    "job_events",
    metadata,
    Column("id", BigInteger, nullable=False, autoincrement=True),
    Column("job_id", UUID(as_uuid=True), nullable=False),
    Column("step", Text, nullable=False),
    Column("status", Text, nullable=False),
    Column("message", JSONB, nullable=True),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=text("now()")),
    # Every read is of one job's events in id order; ids come from the sequence, unique alone.
    PrimaryKeyConstraint("job_id", "id", name="job_events_pkey"),
)

# One row per periodic task's schedule (migration 0008): the latest tick taken, advanced by a
# compare-and-set that inserts the tick's job in the same statement (`sql.FIRE_TICK`).
schedules = Table(
    "schedules",
    metadata,
    Column("key", Text, primary_key=True),  # the task's name and its spec
    Column("task", Text, nullable=False),
    Column("spec", Text, nullable=False),
    Column("last_tick", DateTime(timezone=True), nullable=False),
    Column("fired", BigInteger, nullable=False, server_default=text("0")),  # jobs enqueued
    Column("fired_at", DateTime(timezone=True), nullable=True),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=text("now()")),
)

# Per minute, queue and task (migration 0010): outcomes and the queue's depth, written by the
# workers' `rollup` duty so that the console's charts never read the jobs' history.
job_rollups = Table(
    "job_rollups",
    metadata,
    Column("minute", DateTime(timezone=True), nullable=False),
    Column("queue", Text, nullable=False),
    Column("task", Text, nullable=False),
    Column("completed", Integer, nullable=False, server_default=text("0")),
    Column("failed", Integer, nullable=False, server_default=text("0")),
    Column("pending", Integer, nullable=False, server_default=text("0")),  # due, as last seen
    Column("processing", Integer, nullable=False, server_default=text("0")),
    PrimaryKeyConstraint("minute", "queue", "task", name="job_rollups_pkey"),
)

# Each registered pipeline's stages in the order they run (migration 0010), as the workers know.
task_stages = Table(
    "task_stages",
    metadata,
    Column("task", Text, primary_key=True),
    Column("stages", ARRAY(Text), nullable=False),
    Column("cleanups", ARRAY(Text), nullable=False),
    Column("updated_at", DateTime(timezone=True), nullable=False, server_default=text("now()")),
)

# Per task a worker registered, the retry limit its claim applies to the task's jobs that set
# none of their own (migration 0013), as the workers know: what `worker show` reports.
task_limits = Table(
    "task_limits",
    metadata,
    Column("task", Text, primary_key=True),
    Column("max_retries", Integer, nullable=False),
    Column("updated_at", DateTime(timezone=True), nullable=False, server_default=text("now()")),
)

# A graph of jobs enqueued together (migration 0014); `key` makes it unique, as `unique_key`
# makes a job.
workflows = Table(
    "workflows",
    metadata,
    Column("id", UUID(as_uuid=True), primary_key=True, server_default=text("worker.uuid_v7()")),
    Column("name", Text, nullable=False),
    Column("key", Text, nullable=True),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=text("now()")),
    CheckConstraint("char_length(name) BETWEEN 1 AND 255", name="workflows_name_length"),
    CheckConstraint("char_length(key) BETWEEN 1 AND 255", name="workflows_key_length"),
    Index("workflows_key_idx", "key", unique=True, postgresql_where=text("key IS NOT NULL")),
)

# One row per edge: the child waits for the parent. `ended_as` is the parent's outcome once
# `worker.parents_ended()` counted it (migration 0014). No foreign keys: a deleted parent ends
# as `deleted` for its children, and a deleted child takes its edges (trigger `jobs_gone`).
job_dependencies = Table(
    "job_dependencies",
    metadata,
    Column("child_id", UUID(as_uuid=True), nullable=False),
    Column("parent_id", UUID(as_uuid=True), nullable=False),
    Column("ended_as", Text, nullable=True),
    # A child spawned by a running job: its key, and its place among the spawner's children
    # (both NULL on a parent declared in a graph; migration 0017).
    Column("spawn_key", Text, nullable=True),
    Column("spawn_order", Integer, nullable=True),
    # The parent's ending cancelled the child: a retry of the parent re-arms it (migration 0018).
    Column("cancelled_child", Boolean, nullable=False, server_default=text("false")),
    PrimaryKeyConstraint("child_id", "parent_id", name="job_dependencies_pkey"),
    CheckConstraint(
        "ended_as IN ('completed', 'failed', 'cancelled', 'deleted')",
        name="job_dependencies_ended_as_valid",
    ),
    CheckConstraint(
        "(spawn_key IS NULL) = (spawn_order IS NULL)", name="job_dependencies_spawned_whole"
    ),
    Index("job_dependencies_parent_idx", "parent_id"),
)
