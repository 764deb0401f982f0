"""job rollups for the console's charts, and the stage lists the workers know

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-02 16:10:00.000000

`worker.job_rollups` holds one row per minute, queue and task: the jobs that completed and
failed in that minute, and the queue's depth (due pending jobs, processing jobs) as last seen
in it. The workers write it (the `rollup` duty, `worker.daemon.plugins.rollup`) from the
recent rows only, so a chart over a day reads at most 1,440 minutes per queue and task instead
of the jobs' history. Rows older than two days are deleted by the same duty.

`worker.task_stages` holds the stages of each pipeline a worker registered, in the order they
run, so that the console can list the stages a job has yet to run without importing the task's
code.

`worker.grant_roles()` grants them too: the runner writes both, the client reads them.
"""

import importlib.util
from collections.abc import Sequence
from pathlib import Path

from alembic import op

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

ROLLUPS_TABLE = """
CREATE TABLE worker.job_rollups (
    minute timestamptz NOT NULL,
    queue text NOT NULL,
    task text NOT NULL,
    completed integer NOT NULL DEFAULT 0,
    failed integer NOT NULL DEFAULT 0,
    pending integer NOT NULL DEFAULT 0,
    processing integer NOT NULL DEFAULT 0,
    CONSTRAINT job_rollups_pkey PRIMARY KEY (minute, queue, task)
)
"""

TASK_STAGES_TABLE = """
CREATE TABLE worker.task_stages (
    task text PRIMARY KEY,
    stages text[] NOT NULL,
    cleanups text[] NOT NULL,
    updated_at timestamptz NOT NULL DEFAULT now()
)
"""

# 0008's grants are the base; the console's tables are granted beside its queue tables.
_CLIENT_MARK = "GRANT SELECT ON worker.queues, worker.schedules TO worker_client;"
_RUNNER_MARK = "GRANT SELECT, INSERT, UPDATE, DELETE ON worker.queues TO worker_runner;"
_CLIENT_MORE = "GRANT SELECT ON worker.job_rollups, worker.task_stages TO worker_client;"
_RUNNER_MORE = (
    "GRANT SELECT, INSERT, UPDATE, DELETE ON worker.job_rollups, worker.task_stages "
    "TO worker_runner;"
)


def _revision(filename: str):  # type: ignore[no-untyped-def]
    path = Path(__file__).with_name(filename)
    spec = importlib.util.spec_from_file_location(f"_worker_migration_{path.stem}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _base_grants() -> str:
    """0008's `worker.grant_roles()` for 0009's `worker.enqueue()` signature."""
    base = _revision("0008_unique_jobs_and_queues.py")
    return str(base._grants(_revision("0009_trace_context.py").NEW_ENQUEUE, new_tables=True))


def _grants() -> str:
    text = _base_grants()
    assert _CLIENT_MARK in text and _RUNNER_MARK in text
    return text.replace(_CLIENT_MARK, f"{_CLIENT_MARK}\n        {_CLIENT_MORE}").replace(
        _RUNNER_MARK, f"{_RUNNER_MARK}\n        {_RUNNER_MORE}"
    )


def upgrade() -> None:
    op.execute(ROLLUPS_TABLE)
    op.execute(TASK_STAGES_TABLE)
    op.execute(_grants())
    op.execute("SELECT worker.grant_roles()")


def downgrade() -> None:
    op.execute("DROP TABLE worker.task_stages")
    op.execute("DROP TABLE worker.job_rollups")
    op.execute(_base_grants())
