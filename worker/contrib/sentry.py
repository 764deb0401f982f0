"""Sentry: every failed attempt reported, tagged with its job's id, task, attempt and queue.

Install the extra (`pip install 'durable-worker[sentry]'`), then, in the module `worker run`
imports:

    import sentry_sdk
    from worker import add_middleware
    from worker.contrib.sentry import SentryMiddleware

    sentry_sdk.init(dsn="https://...")
    add_middleware(SentryMiddleware())

It is a middleware (`worker.middleware`): each attempt runs in a Sentry isolation scope of its
own, tagged `job.id`, `job.task`, `job.attempt` and `job.queue`, with the same fields and the
retry count as the `job` context. So an exception the job's code raises to fail its attempt is
reported in it, and so is anything the code itself reports meanwhile (a `capture_message`, an
error log line with Sentry's logging integration), in a sync task's thread too.

What it does not do: report a retry the code asks for (`raise Retry(...)`), a cancel, a snooze
or a pause, none of which is an error; nor call `sentry_sdk.init`, which stays the
application's.
"""

from __future__ import annotations

import contextvars
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

try:
    import sentry_sdk
except ImportError:  # pragma: no cover - depends on the installed extras
    raise ImportError(
        "worker.contrib.sentry needs sentry-sdk: pip install 'durable-worker[sentry]'"
    ) from None

from worker.middleware import Middleware

if TYPE_CHECKING:
    from worker.models import Outcome
    from worker.tasks import Context

# The attempt's isolation scope, left in `after`. A context variable: the attempt's hooks
# share one context, and attempts running at once each have their own.
_scope: contextvars.ContextVar[AbstractContextManager[Any] | None] = contextvars.ContextVar(
    "worker_sentry_scope", default=None
)


class SentryMiddleware(Middleware):
    """Reports each failed attempt to Sentry with its job's id, task, attempt and queue."""

    def before(self, ctx: Context) -> None:
        manager = sentry_sdk.isolation_scope()
        scope = manager.__enter__()
        _scope.set(manager)
        job = ctx.job
        tags = {"job.id": job.id, "job.task": job.task, "job.attempt": str(ctx.attempt)}
        for key, value in {**tags, "job.queue": job.queue}.items():
            scope.set_tag(key, value)
        scope.set_context(
            "job",
            {
                "id": job.id,
                "task": job.task,
                "queue": job.queue,
                "attempt": ctx.attempt,
                "retry_count": job.retry_count,
                "max_retries": job.max_retries,
            },
        )

    def on_error(self, ctx: Context, exc: BaseException) -> None:
        sentry_sdk.capture_exception(exc)

    def after(self, ctx: Context, outcome: Outcome) -> None:
        manager = _scope.get()
        if manager is not None:
            _scope.set(None)
            manager.__exit__(None, None, None)
