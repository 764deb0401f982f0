"""worker.schedules: one row per periodic task's schedule, the latest tick it fired

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-02 13:30:00.000000

Each worker running a periodic task (`@task(cron=...)`, `@task(every=...)`) fires its ticks
through this row: a compare-and-set on `last_tick` and the job's insert in one statement
(`worker.db.sql.schedules.FIRE_TICK`), so that each tick is enqueued once however many workers
fire it. A schedule changed in code has a new key, and its old row stays, harmless; delete it
with `DELETE FROM worker.schedules WHERE key = '...'`.

`worker.grant_roles()` (migrations 0003 and 0008) now also grants this table: the runner
reads and advances rows, the client reads them. The former function stays under the name
`worker.grant_job_roles()`, which the new one calls.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

GRANT_FUNCTION = """
CREATE FUNCTION worker.grant_roles() RETURNS text LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'worker_client') THEN
        GRANT SELECT ON worker.schedules TO worker_client;
    END IF;
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'worker_runner') THEN
        GRANT SELECT, INSERT, UPDATE ON worker.schedules TO worker_runner;
    END IF;
    RETURN worker.grant_job_roles();
END $$
"""


def upgrade() -> None:
    op.create_table(
        "schedules",
        sa.Column("key", sa.Text(), nullable=False),
        sa.Column("task", sa.Text(), nullable=False),
        sa.Column("spec", sa.Text(), nullable=False),
        sa.Column("last_tick", sa.DateTime(timezone=True), nullable=False),
        sa.Column("fired", sa.BigInteger(), server_default=sa.text("0"), nullable=False),
        sa.Column("fired_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.PrimaryKeyConstraint("key", name="schedules_pkey"),
        schema="worker",
    )
    op.execute("ALTER FUNCTION worker.grant_roles() RENAME TO grant_job_roles")
    op.execute(GRANT_FUNCTION)
    op.execute("SELECT worker.grant_roles()")


def downgrade() -> None:
    op.execute("DROP FUNCTION worker.grant_roles()")
    op.execute("ALTER FUNCTION worker.grant_job_roles() RENAME TO grant_roles")
    op.drop_table("schedules", schema="worker")
