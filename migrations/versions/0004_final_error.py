"""jobs.final_error: an attempt that failed for good while its cleanups ran

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-01 06:40:00.000000

A pipeline attempt that fails for good (a stage past its deadline, an output PostgreSQL
refuses, the last retry spent) runs its cleanups before its outcome is written. The failure is
recorded here first, so that if the worker is lost or stops during those cleanups, the next
claim runs only the cleanups still owed and fails the job with this error, instead of running
the failed stage again.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("jobs", sa.Column("final_error", sa.Text(), nullable=True), schema="worker")


def downgrade() -> None:
    op.drop_column("jobs", "final_error", schema="worker")
