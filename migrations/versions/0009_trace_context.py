"""jobs.trace_context: the trace a job was enqueued in, for its attempts to continue

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-02 16:30:00.000000

`worker.jobs.trace_context` holds the trace context current when the job was enqueued (a JSON
object, as OpenTelemetry's propagator writes it: `traceparent`, `tracestate`), NULL when there
was none. The worker's span for each attempt is a child of that context (`worker.tracing`).
`worker.enqueue()` gains a `trace_context` argument (and is replaced, so that a call without it
stays unambiguous); `worker.grant_roles()` grants the new signature what it granted the old.

Adding a nullable column is instant: no row is rewritten.
"""

import importlib.util
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

from alembic import op

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _revision_0008() -> ModuleType:
    """Migration 0008, whose `worker.enqueue()` and grants this one extends."""
    path = Path(__file__).with_name("0008_unique_jobs_and_queues.py")
    spec = importlib.util.spec_from_file_location("worker_migration_0008", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_0008 = _revision_0008()
OLD_ENQUEUE: str = _0008.NEW_ENQUEUE
NEW_ENQUEUE = "worker.enqueue(text, jsonb, text, integer, timestamptz, integer, text, text, jsonb)"


def _with_trace_context(function: str) -> str:
    """0008's `worker.enqueue()`, taking and storing `trace_context` too."""
    edits = [
        (
            "    concurrency_key text DEFAULT NULL\n)",
            "    concurrency_key text DEFAULT NULL,\n    trace_context jsonb DEFAULT NULL\n)",
        ),
        ("unique_key, concurrency_key)\n", "unique_key, concurrency_key, trace_context)\n"),
        ("enqueue.concurrency_key)\n", "enqueue.concurrency_key, enqueue.trace_context)\n"),
    ]
    for old, new in edits:
        assert function.count(old) == 1, old
        function = function.replace(old, new)
    return function


def upgrade() -> None:
    op.execute("ALTER TABLE worker.jobs ADD COLUMN trace_context jsonb")
    op.execute(f"DROP FUNCTION {OLD_ENQUEUE}")
    op.execute(_with_trace_context(_0008.ENQUEUE_FUNCTION))
    op.execute(_0008._grants(NEW_ENQUEUE, new_tables=True))
    op.execute("SELECT worker.grant_roles()")


def downgrade() -> None:
    op.execute(f"DROP FUNCTION {NEW_ENQUEUE}")
    op.execute(_0008.ENQUEUE_FUNCTION)
    op.execute(_0008._grants(OLD_ENQUEUE, new_tables=True))
    op.execute("SELECT worker.grant_roles()")
    op.execute("ALTER TABLE worker.jobs DROP COLUMN trace_context")
