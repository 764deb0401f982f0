"""the rule for which attempt owes its ALL_DONE cleanup, written once in SQL

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-02 11:30:00.000000

A pipeline's attempt owes its cleanups when it ran a stage but did not finish every cleanup.
Both a cancel (`sql.CANCEL`, deciding whether a waiting job is cancelled at once or goes back
to a worker to clean up first) and a worker resuming a job (reading its stage rows) need that
answer, and it used to be written twice, once in SQL and once in Python. It is now this
function, which both call.
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# The latest attempt with a stage row newer than the oldest finished cleanup, or NULL. A
# cleanup not run yet is `waiting` from its attempt's first cleanup on, and a running or
# waiting cleanup counts as never finished, so none is missed for lack of a finished row.
OWED_FUNCTION = """
CREATE FUNCTION worker.owed_cleanup_attempt(job uuid) RETURNS integer
LANGUAGE sql STABLE AS $$
    SELECT max(s.attempt) FROM worker.job_stages AS s
    WHERE s.job_id = job AND s.kind = 'stage' AND s.attempt > coalesce(
        (SELECT min(CASE WHEN c.status IN ('running', 'waiting') THEN 0 ELSE c.attempt END)
         FROM worker.job_stages AS c WHERE c.job_id = job AND c.kind = 'cleanup'),
        0)
$$
"""


def upgrade() -> None:
    op.execute(OWED_FUNCTION)


def downgrade() -> None:
    op.execute("DROP FUNCTION worker.owed_cleanup_attempt(uuid)")
