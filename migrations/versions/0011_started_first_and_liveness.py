"""work already started is claimed first; a worker's session is its proof of life

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-05 10:00:00.000000

`jobs_runnable_idx` gains `(started_at IS NULL)` between the priority and the due time, so that
within a priority the claim scans the due jobs that were started before (a snoozed stage, a
retry, a rescued job) ahead of those never started, each scan stopping at its first job not
due yet (`worker.db.sql.claim`).

`worker.workers.liveness_key` is the key of the shared advisory lock a worker's claim session
holds for as long as it lives (NULL for a worker behind a transaction pooler, which keeps no
session); `session_lost_at` is when a rescuer first saw that lock held by no session. A worker
whose lock is gone and that has not beaten since then for a moment is dead: its jobs are
rescued without waiting for its lease (`worker.db.sql.liveness`).

Rebuilding the index reads the pending rows only (it is partial); adding nullable columns is
instant.
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0011"
down_revision: str | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.execute("DROP INDEX worker.jobs_runnable_idx")
    op.execute(
        "CREATE INDEX jobs_runnable_idx ON worker.jobs "
        "(queue, priority DESC, (started_at IS NULL), run_at) WHERE status = 'pending'"
    )
    op.execute("ALTER TABLE worker.workers ADD COLUMN liveness_key integer")
    op.execute("ALTER TABLE worker.workers ADD COLUMN session_lost_at timestamptz")


def downgrade() -> None:
    op.execute("ALTER TABLE worker.workers DROP COLUMN session_lost_at")
    op.execute("ALTER TABLE worker.workers DROP COLUMN liveness_key")
    op.execute("DROP INDEX worker.jobs_runnable_idx")
    op.execute(
        "CREATE INDEX jobs_runnable_idx ON worker.jobs (queue, priority DESC, run_at) "
        "WHERE status = 'pending'"
    )
