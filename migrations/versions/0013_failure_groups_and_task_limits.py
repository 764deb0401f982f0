"""failures grouped by task and error, and the retry limit each task's jobs get

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-05 09:30:00.000000

`worker.job_failures` gives each failed job the key its failure is grouped by: the error's type
(the `Type` of the first line's `Type: message`, after a pipeline's `stage X failed: `; NULL
for an error that names none, such as a lost worker's) and its first line with the figures
that vary from one failure to the next masked: UUIDs, quoted values, hex and numbers. The key
is derived here, in this one view, rather than stored when the outcome is written: the outcome
write (the workers' hot path) stays as it is, the failures of the jobs already kept are grouped
too, and a change of the rule is a change of the view, not a rewrite of history. It reads the
failed rows only (`jobs_failed_idx`), and a caller bounds them by `finished_at`.

`worker.failure_groups` groups the last 24 hours of them (as `failed_recently` does) by task,
error type and message, most frequent first: how many, first and last seen, and the latest
job as an example. `worker failures --since 1h` groups another window the same way.

`worker.task_limits` holds, per task a worker registered, the retry limit its claim applies to
the task's jobs that set none of their own: the task's (or pipeline's) `max_retries`, else the
worker's `WORKER_MAX_RETRIES`. Workers write it at start, as they write `worker.task_stages`,
so that `worker show` gives a job's limit without importing the task's code.

`worker.grant_roles()` grants them too: the client reads all three, the runner writes the
limits.
"""

import importlib.util
from collections.abc import Sequence
from pathlib import Path

from alembic import op

revision: str = "0013"
down_revision: str | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Masked in this order: a UUID, before its groups read as hex or numbers; a quoted value,
# whatever it holds; hex (0x..., or eight or more hex digits, letters and figures both); then
# any number left. Figures inside a word (`step2`) are its name, not a figure: kept.
JOB_FAILURES = r"""
CREATE VIEW worker.job_failures AS
SELECT j.id, j.queue, j.task, j.finished_at,
       (regexp_match(f.line, '^(stage \S+ failed: )?([A-Z][A-Za-z0-9_]*): '))[2] AS error_type,
       regexp_replace(regexp_replace(regexp_replace(regexp_replace(f.line,
           '[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}',
           '<uuid>', 'g'),
           '''[^'']*''|"[^"]*"', '<quoted>', 'g'),
           '\m(0x[0-9a-fA-F]+|(?=[0-9a-fA-F]*[a-fA-F])(?=[0-9a-fA-F]*[0-9])[0-9a-fA-F]{8,})\M',
           '<hex>', 'g'),
           '\m[0-9]+(\.[0-9]+)?\M', '<n>', 'g') AS message
FROM worker.jobs AS j
CROSS JOIN LATERAL (SELECT split_part(coalesce(j.error, ''), E'\n', 1) AS line) AS f
WHERE j.status = 'failed'
"""

FAILURE_GROUPS = """
CREATE VIEW worker.failure_groups AS
SELECT task, error_type, message, count(*) AS failures,
       min(finished_at) AS first_seen, max(finished_at) AS last_seen,
       (array_agg(id ORDER BY finished_at DESC))[1] AS example_job_id
FROM worker.job_failures
WHERE finished_at > now() - interval '24 hours'
GROUP BY task, error_type, message
ORDER BY failures DESC, last_seen DESC
"""

TASK_LIMITS_TABLE = """
CREATE TABLE worker.task_limits (
    task text PRIMARY KEY,
    max_retries integer NOT NULL,
    updated_at timestamptz NOT NULL DEFAULT now()
)
"""

# 0012's grants are the base; this migration's relations are granted beside its tables.
_CLIENT_MARK = "GRANT SELECT ON worker.job_rollups, worker.task_stages TO worker_client;"
_RUNNER_MARK = (
    "GRANT SELECT, INSERT, UPDATE, DELETE ON worker.job_rollups, worker.task_stages "
    "TO worker_runner;"
)
_CLIENT_MORE = (
    "GRANT SELECT ON worker.task_limits, worker.job_failures, worker.failure_groups "
    "TO worker_client;"
)
_RUNNER_MORE = (
    "GRANT SELECT, INSERT, UPDATE, DELETE ON worker.task_limits TO worker_runner;\n"
    "        GRANT SELECT ON worker.job_failures, worker.failure_groups TO worker_runner;"
)


def _revision(filename: str):  # type: ignore[no-untyped-def]
    path = Path(__file__).with_name(filename)
    spec = importlib.util.spec_from_file_location(f"_worker_migration_{path.stem}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _base_grants() -> str:
    """0012's `worker.grant_roles()`."""
    return str(_revision("0012_workers_serve_their_tasks.py")._grants())


def _grants() -> str:
    text = _base_grants()
    assert _CLIENT_MARK in text and _RUNNER_MARK in text
    return text.replace(_CLIENT_MARK, f"{_CLIENT_MARK}\n        {_CLIENT_MORE}").replace(
        _RUNNER_MARK, f"{_RUNNER_MARK}\n        {_RUNNER_MORE}"
    )


def upgrade() -> None:
    op.execute(JOB_FAILURES)
    op.execute(FAILURE_GROUPS)
    op.execute(TASK_LIMITS_TABLE)
    op.execute(_grants())
    op.execute("SELECT worker.grant_roles()")


def downgrade() -> None:
    op.execute("DROP TABLE worker.task_limits")
    op.execute("DROP VIEW worker.failure_groups")
    op.execute("DROP VIEW worker.job_failures")
    op.execute(_base_grants())
