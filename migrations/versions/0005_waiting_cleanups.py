"""job_stages.status 'waiting': the cleanups an attempt has not run yet

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-01 12:00:00.000000

A pipeline's cleanups run one after another. When an attempt starts the first one, the others
are recorded `waiting`, so the rows alone tell whether every cleanup of that attempt ran: a
worker lost between two cleanups leaves one `waiting`, and a cancel of the job (`sql.CANCEL`)
sends it back to a worker to run them instead of cancelling it at once. Before, a cleanup that
never started had no row, and the cancel took the attempt for cleaned up.
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_BEFORE = "('running', 'completed', 'failed', 'paused', 'snoozed', 'cancelled')"
_AFTER = "('running', 'completed', 'failed', 'paused', 'snoozed', 'cancelled', 'waiting')"


def upgrade() -> None:
    op.drop_constraint("job_stages_status_valid", "job_stages", schema="worker")
    op.create_check_constraint(
        "job_stages_status_valid", "job_stages", f"status IN {_AFTER}", schema="worker"
    )


def downgrade() -> None:
    # Unfinished either way: the code before this revision reads `running` as "not cleaned up".
    op.execute("UPDATE worker.job_stages SET status = 'running' WHERE status = 'waiting'")
    op.drop_constraint("job_stages_status_valid", "job_stages", schema="worker")
    op.create_check_constraint(
        "job_stages_status_valid", "job_stages", f"status IN {_BEFORE}", schema="worker"
    )
