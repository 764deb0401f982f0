"""workers record the tasks they serve and their lease; the unserved_tasks view

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-05 09:20:00.000000

A worker claims only the tasks it registered, so during a rolling deploy a worker of the
previous release never takes (and fails) a job of a task only the new release has. Each row of
`worker.workers` now says which tasks that worker serves (`tasks`) and how long its heartbeat
may be silent before it counts as dead (`lease_seconds`).

`worker.unserved_tasks` lists, per queue and task, the pending jobs that no live worker (a row
whose heartbeat is within its own lease) serving their queue has registered: they wait until
one starts. A typo in a plain-SQL enqueue shows there. A row whose `tasks` is NULL is a worker
of a release before this one, which claims every task of its queues: it serves them all.

Additive: the previous release inserts its rows without the new columns (NULL tasks, the
default lease) and reads neither. `worker.grant_roles()` grants the view to both roles.
"""

import importlib.util
from collections.abc import Sequence
from pathlib import Path

from alembic import op

revision: str = "0012"
down_revision: str | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Each (queue, task) of the pending jobs, counted first (jobs_runnable_idx), then kept only if
# no live worker of the queue serves the task: the workers are read once per pair, not per job.
# `queue_workers`: the live workers of the queue, whatever they serve (0: none runs it at all).
UNSERVED_TASKS = """
CREATE VIEW worker.unserved_tasks AS
WITH live AS (
    SELECT queues, tasks FROM worker.workers
    WHERE heartbeat_at >= now() - make_interval(secs => lease_seconds)
), pending AS (
    SELECT queue, task, count(*) AS jobs, min(created_at) AS oldest_created_at
    FROM worker.jobs WHERE status = 'pending'
    GROUP BY queue, task
)
SELECT p.queue, p.task, p.jobs, p.oldest_created_at,
       (SELECT count(*) FROM live AS w WHERE p.queue = ANY(w.queues)) AS queue_workers
FROM pending AS p
WHERE NOT EXISTS (
    SELECT FROM live AS w
    WHERE p.queue = ANY(w.queues) AND (w.tasks IS NULL OR p.task = ANY(w.tasks))
)
"""

# 0010's grants are the base; the view is granted beside the other admin views.
_CLIENT_MARK = "GRANT SELECT ON worker.job_rollups, worker.task_stages TO worker_client;"
_RUNNER_MARK = (
    "GRANT SELECT, INSERT, UPDATE, DELETE ON worker.job_rollups, worker.task_stages "
    "TO worker_runner;"
)
_CLIENT_MORE = "GRANT SELECT ON worker.unserved_tasks TO worker_client;"
_RUNNER_MORE = "GRANT SELECT ON worker.unserved_tasks TO worker_runner;"


def _revision(filename: str):  # type: ignore[no-untyped-def]
    path = Path(__file__).with_name(filename)
    spec = importlib.util.spec_from_file_location(f"_worker_migration_{path.stem}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _base_grants() -> str:
    """0010's `worker.grant_roles()`."""
    return str(_revision("0010_job_rollups.py")._grants())


def _grants() -> str:
    text = _base_grants()
    assert _CLIENT_MARK in text and _RUNNER_MARK in text
    return text.replace(_CLIENT_MARK, f"{_CLIENT_MARK}\n        {_CLIENT_MORE}").replace(
        _RUNNER_MARK, f"{_RUNNER_MARK}\n        {_RUNNER_MORE}"
    )


def upgrade() -> None:
    op.execute("ALTER TABLE worker.workers ADD COLUMN tasks text[]")
    op.execute(
        "ALTER TABLE worker.workers ADD COLUMN lease_seconds double precision NOT NULL "
        "DEFAULT 15 CONSTRAINT workers_lease_positive CHECK (lease_seconds > 0)"
    )
    op.execute(UNSERVED_TASKS)
    op.execute(_grants())
    op.execute("SELECT worker.grant_roles()")


def downgrade() -> None:
    op.execute("DROP VIEW worker.unserved_tasks")
    op.execute("ALTER TABLE worker.workers DROP COLUMN lease_seconds")
    op.execute("ALTER TABLE worker.workers DROP COLUMN tasks")
    op.execute(_base_grants())
