"""jobs, workers, stages and events; the insert NOTIFY trigger and worker.enqueue()

Revision ID: 0001
Revises:
Create Date: 2026-11-30 07:36:56.350767
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


# Time-ordered ids (UUID version 7: 48 bits of Unix milliseconds, then random bits): rows
# inserted together land on the same primary-key pages, so inserting and updating jobs in a big
# table touches few index pages (a random id dirtied a fresh page, a full-page WAL image, each).
UUID_V7_FUNCTION = """
CREATE FUNCTION worker.uuid_v7() RETURNS uuid LANGUAGE sql VOLATILE PARALLEL SAFE AS $$
    SELECT encode(
        set_bit(set_bit(
            overlay(uuid_send(gen_random_uuid())
                    PLACING substring(int8send(
                        floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint) FROM 3)
                    FROM 1 FOR 6),
            52, 1), 53, 1),
        'hex')::uuid
$$
"""


# One NOTIFY per inserting statement and queue (not per row), whatever client inserted: the
# helper, COPY, or a plain INSERT from psql. Idle workers LISTEN on 'worker_jobs'.
NOTIFY_FUNCTION = """
CREATE FUNCTION worker.notify_jobs() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('worker_jobs', q)
    FROM (SELECT DISTINCT queue AS q FROM new_jobs WHERE status = 'pending') AS s;
    RETURN NULL;
END $$
"""

NOTIFY_TRIGGER = """
CREATE TRIGGER jobs_notify AFTER INSERT ON worker.jobs
REFERENCING NEW TABLE AS new_jobs
FOR EACH STATEMENT EXECUTE FUNCTION worker.notify_jobs()
"""

# Enqueue from any SQL client: SELECT worker.enqueue('send_email', '{"to": "a@b.c"}').
ENQUEUE_FUNCTION = """
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


def upgrade() -> None:
    op.execute(UUID_V7_FUNCTION)
    op.create_table(
        "jobs",
        sa.Column("id", sa.UUID(), server_default=sa.text("worker.uuid_v7()"), nullable=False),
        sa.Column("queue", sa.Text(), server_default=sa.text("'default'"), nullable=False),
        sa.Column("task", sa.Text(), nullable=False),
        sa.Column(
            "payload",
            postgresql.JSONB(astext_type=sa.Text()),
            server_default=sa.text("'{}'::jsonb"),
            nullable=False,
        ),
        sa.Column("status", sa.Text(), server_default=sa.text("'pending'"), nullable=False),
        sa.Column("priority", sa.SmallInteger(), server_default=sa.text("0"), nullable=False),
        sa.Column(
            "run_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False
        ),
        sa.Column("retry_count", sa.Integer(), server_default=sa.text("0"), nullable=False),
        sa.Column("max_retries", sa.Integer(), nullable=True),
        sa.Column("result", postgresql.JSONB(astext_type=sa.Text()), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("worker_id", sa.UUID(), nullable=True),
        sa.Column(
            "cancel_requested", sa.Boolean(), server_default=sa.text("false"), nullable=False
        ),
        sa.Column("question", postgresql.JSONB(astext_type=sa.Text()), nullable=True),
        sa.Column("answer", postgresql.JSONB(astext_type=sa.Text()), nullable=True),
        sa.CheckConstraint("jsonb_typeof(payload) = 'object'", name="jobs_payload_is_object"),
        sa.CheckConstraint(
            "status IN ('pending', 'processing', 'completed', 'failed', 'paused', 'cancelled')",
            name="jobs_status_valid",
        ),
        sa.CheckConstraint("char_length(queue) BETWEEN 1 AND 255", name="jobs_queue_name_length"),
        sa.CheckConstraint("char_length(task) BETWEEN 1 AND 255", name="jobs_task_name_length"),
        sa.CheckConstraint(
            "max_retries IS NULL OR max_retries >= 0", name="jobs_max_retries_positive"
        ),
        sa.CheckConstraint("priority BETWEEN -100 AND 100", name="jobs_priority_range"),
        sa.CheckConstraint("retry_count >= 0", name="jobs_retry_count_positive"),
        sa.PrimaryKeyConstraint("id"),
        schema="worker",
    )
    op.create_index("jobs_created_idx", "jobs", ["created_at"], unique=False, schema="worker")
    op.create_index(
        "jobs_finished_idx",
        "jobs",
        ["finished_at"],
        unique=False,
        schema="worker",
        postgresql_where=sa.text("status IN ('completed', 'failed', 'cancelled')"),
    )
    op.create_index(
        "jobs_processing_idx",
        "jobs",
        ["worker_id"],
        unique=False,
        schema="worker",
        postgresql_where=sa.text("status = 'processing'"),
    )
    op.create_index(
        "jobs_runnable_idx",
        "jobs",
        ["queue", sa.literal_column("priority DESC"), "run_at"],
        unique=False,
        schema="worker",
        postgresql_where=sa.text("status = 'pending'"),
    )
    op.create_table(
        "workers",
        sa.Column("id", sa.UUID(), nullable=False),
        sa.Column("hostname", sa.Text(), nullable=False),
        sa.Column("pid", sa.Integer(), nullable=False),
        sa.Column("queues", postgresql.ARRAY(sa.Text()), nullable=False),
        sa.Column("concurrency", sa.Integer(), nullable=False),
        sa.Column(
            "started_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.Column(
            "heartbeat_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.PrimaryKeyConstraint("id"),
        schema="worker",
    )
    op.create_table(
        "job_events",
        sa.Column("id", sa.BigInteger(), autoincrement=True, nullable=False),
        sa.Column("job_id", sa.UUID(), nullable=False),
        sa.Column("step", sa.Text(), nullable=False),
        sa.Column("status", sa.Text(), nullable=False),
        sa.Column("message", postgresql.JSONB(astext_type=sa.Text()), nullable=True),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.ForeignKeyConstraint(["job_id"], ["worker.jobs.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
        schema="worker",
    )
    op.create_index(
        "job_events_job_idx", "job_events", ["job_id", "id"], unique=False, schema="worker"
    )
    op.create_table(
        "job_stages",
        sa.Column("job_id", sa.UUID(), nullable=False),
        sa.Column("stage", sa.Text(), nullable=False),
        sa.Column("kind", sa.Text(), server_default=sa.text("'stage'"), nullable=False),
        sa.Column("status", sa.Text(), nullable=False),
        sa.Column("output", postgresql.JSONB(astext_type=sa.Text()), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column(
            "started_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.CheckConstraint("kind IN ('stage', 'cleanup')", name="job_stages_kind_valid"),
        sa.CheckConstraint(
            "status IN ('running', 'completed', 'failed', 'paused', 'snoozed', 'cancelled')",
            name="job_stages_status_valid",
        ),
        sa.ForeignKeyConstraint(["job_id"], ["worker.jobs.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("job_id", "stage", name="job_stages_pkey"),
        schema="worker",
    )
    op.execute(NOTIFY_FUNCTION)
    op.execute(NOTIFY_TRIGGER)
    op.execute(ENQUEUE_FUNCTION)


def downgrade() -> None:
    op.execute("DROP FUNCTION worker.enqueue(text, jsonb, text, integer, timestamptz, integer)")
    op.execute("DROP TRIGGER jobs_notify ON worker.jobs")
    op.execute("DROP FUNCTION worker.notify_jobs()")
    op.drop_table("job_stages", schema="worker")
    op.drop_index("job_events_job_idx", table_name="job_events", schema="worker")
    op.drop_table("job_events", schema="worker")
    op.drop_table("workers", schema="worker")
    op.drop_index(
        "jobs_runnable_idx",
        table_name="jobs",
        schema="worker",
        postgresql_where=sa.text("status = 'pending'"),
    )
    op.drop_index(
        "jobs_processing_idx",
        table_name="jobs",
        schema="worker",
        postgresql_where=sa.text("status = 'processing'"),
    )
    op.drop_index(
        "jobs_finished_idx",
        table_name="jobs",
        schema="worker",
        postgresql_where=sa.text("status IN ('completed', 'failed', 'cancelled')"),
    )
    op.drop_index("jobs_created_idx", table_name="jobs", schema="worker")
    op.drop_table("jobs", schema="worker")
    op.execute("DROP FUNCTION worker.uuid_v7()")
