"""the console's job sets as SQL functions: a tab, a bulk verb's reach, a search

Revision ID: 0015
Revises: 0013
Create Date: 2026-12-05 13:15:00.000000

The console's list, its tab counts and its bulk verbs ask the same questions of a job: is it in
this tab, may this verb change it, does it match the search. Each is written once here, so the
statements of `worker.db.sql.console` are whole, each runnable in psql as written, instead of
being glued together from Python pieces.

Each is a one-expression SQL function, STABLE, neither STRICT nor SECURITY DEFINER: PostgreSQL
inlines it into the statement that calls it, so the planner sees the same conditions as if
they were written out. A tab or verb passed as a value is folded away when the statement is
planned for its parameters: the failed tab still reads `jobs_failed_idx`, the running tab
`jobs_processing_idx`. Functions are executable by every role; nothing to grant.
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0015"
down_revision: str | None = "0014"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# A tab names a job's state as an operator reads it: a pending job is `scheduled` while it is
# not due, `retrying` once an attempt failed. An unknown tab holds no job.
IN_CONSOLE_TAB = """
CREATE FUNCTION worker.in_console_tab(j worker.jobs, tab text) RETURNS boolean
LANGUAGE sql STABLE PARALLEL SAFE AS $$
SELECT CASE tab
    WHEN 'running' THEN j.status = 'processing'
    WHEN 'queued' THEN j.status = 'pending' AND j.run_at <= now() AND j.retry_count = 0
    WHEN 'scheduled' THEN j.status = 'pending' AND j.run_at > now() AND j.retry_count = 0
    WHEN 'retrying' THEN j.status = 'pending' AND j.retry_count > 0
    WHEN 'paused' THEN j.status = 'paused'
    WHEN 'failed' THEN j.status = 'failed'
    WHEN 'cancelled' THEN j.status = 'cancelled'
    WHEN 'completed' THEN j.status = 'completed'
    WHEN 'all' THEN true
END
$$
"""

# Which jobs a bulk verb may change: a retry takes the finished ones that did not complete, a
# cancel the live ones not already asked to stop (so a walk never meets one twice).
BULK_VERB_APPLIES = """
CREATE FUNCTION worker.bulk_verb_applies(j worker.jobs, verb text) RETURNS boolean
LANGUAGE sql STABLE PARALLEL SAFE AS $$
SELECT CASE verb
    WHEN 'retry' THEN j.status IN ('failed', 'cancelled')
    WHEN 'cancel' THEN j.status IN ('pending', 'paused', 'processing') AND NOT j.cancel_requested
END
$$
"""

# A NULL argument skips its filter. The search is a substring of the id, the task, the
# payload's JSON or the error, case-insensitive; strpos, not LIKE, so `%` and `_` are plain.
# `since`: the job's latest move (finished, else started, else created) at or after it.
CONSOLE_SEARCH = """
CREATE FUNCTION worker.console_search(
    j worker.jobs, in_queue text, of_task text, since timestamptz, search text
) RETURNS boolean
LANGUAGE sql STABLE PARALLEL SAFE AS $$
SELECT (in_queue IS NULL OR j.queue = in_queue)
   AND (of_task IS NULL OR j.task = of_task)
   AND (since IS NULL OR coalesce(j.finished_at, j.started_at, j.created_at) >= since)
   AND (search IS NULL
        OR strpos(j.id::text, lower(search)) > 0
        OR strpos(lower(j.task), lower(search)) > 0
        OR strpos(lower(j.payload::text), lower(search)) > 0
        OR strpos(lower(coalesce(j.error, '')), lower(search)) > 0)
$$
"""


def upgrade() -> None:
    op.execute(IN_CONSOLE_TAB)
    op.execute(BULK_VERB_APPLIES)
    op.execute(CONSOLE_SEARCH)


def downgrade() -> None:
    op.execute("DROP FUNCTION worker.console_search(worker.jobs, text, text, timestamptz, text)")
    op.execute("DROP FUNCTION worker.bulk_verb_applies(worker.jobs, text)")
    op.execute("DROP FUNCTION worker.in_console_tab(worker.jobs, text)")
