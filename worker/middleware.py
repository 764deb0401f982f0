"""Middleware: code that runs around every attempt a worker makes (error reporting, a logging
context, metrics), registered once with `add_middleware`.

A middleware is any object with one or more of these methods, each plain or `async def`:

- `before(ctx)`: before the job's code runs;
- `on_error(ctx, exc)`: the job's code raised `exc` and the attempt failed (it is retried or
  fails for good); in a pipeline, the exception of the stage that failed the attempt;
- `after(ctx, outcome)`: the attempt ended, however it ended (`outcome.kind`, an
  `OutcomeKind`; `outcome.result`, `outcome.error`); after `on_error` when both run.

>>> class Outcomes(Middleware):                                    # doctest: +SKIP
...     def after(self, ctx, outcome):
...         counter.labels(task=ctx.job.task, outcome=outcome.kind).inc()
>>> add_middleware(Outcomes())                                      # doctest: +SKIP

They run in the order registered, `after` and `on_error` in reverse (the first registered
wraps the others), on the worker's event loop, in the attempt's own context: a context
variable set in `before` is seen by the job's code, `async` on the loop as well as sync in its
thread (which starts with a copy of that context), and by every log line it writes. A sync
hook must therefore be quick; one that does I/O is written `async def`.

A pipeline's attempt is wrapped once, not each stage: `before` runs before its first stage
(or the cleanups a lost attempt owes), `after` once its `ALL_DONE` cleanups have run.

A hook that raises does not change what happens to the job: the error is logged (event
`middleware.failed`) and the attempt goes on as if the hook had returned; a middleware reports
and observes, it does not decide. A job handed back at shutdown ends its attempt without
`after`. With no middleware registered an attempt runs exactly as before, at no cost.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any

from worker.logs import fields
from worker.models import Outcome, OutcomeKind

if TYPE_CHECKING:
    from worker.tasks import Context

log = logging.getLogger("worker.daemon")

# The kinds of outcome that mean the attempt failed: `on_error` is told of their exception.
_FAILED = (OutcomeKind.RETRY, OutcomeKind.FAILED)


class Middleware:
    """A base class whose hooks do nothing: override those you need (plain or `async def`).
    Inheriting is optional; any object with one of these methods is a middleware."""

    def before(self, ctx: Context) -> Awaitable[None] | None:
        """Before the job's code runs."""

    def after(self, ctx: Context, outcome: Outcome) -> Awaitable[None] | None:
        """Once the attempt ended, however it ended."""

    def on_error(self, ctx: Context, exc: BaseException) -> Awaitable[None] | None:
        """The job's code raised `exc`, and the attempt failed."""


# Middleware every worker in this process runs, in order. `worker run` imports the task
# modules before it starts its worker, so a module registers its middleware at import.
MIDDLEWARE: list[object] = []


def add_middleware(middleware: object) -> object:
    """Run `middleware` around every attempt of the workers of this process; returns it.

    Raises `TypeError` if it has none of `before`, `after`, `on_error`.
    """
    if not any(callable(getattr(middleware, n, None)) for n in ("before", "after", "on_error")):
        raise TypeError(
            f"middleware {middleware!r} has none of the methods before, after, on_error"
        )
    MIDDLEWARE.append(middleware)
    return middleware


def remove_middleware(middleware: object) -> None:
    """Stop running `middleware` (one registered with `add_middleware`)."""
    MIDDLEWARE.remove(middleware)


async def _call(middleware: object, hook: str, ctx: Context, *args: Any) -> None:
    """Call one hook, if the middleware has it; an error it raises is logged, never passed on."""
    fn = getattr(middleware, hook, None)
    if fn is None:
        return
    try:
        result = fn(ctx, *args)
        if inspect.isawaitable(result):
            await result
    except Exception as exc:
        who = type(middleware).__name__
        log.error(
            "middleware %s.%s raised on job %s (%s): %s; the attempt goes on",
            who,
            hook,
            ctx.job_id,
            ctx.job.task,
            exc,
            exc_info=True,
            extra=fields(
                "middleware.failed",
                middleware=who,
                hook=hook,
                job_id=ctx.job_id,
                task=ctx.job.task,
            ),
        )


async def around(
    middleware: Sequence[object], ctx: Context, attempt: Callable[[], Awaitable[Outcome]]
) -> Outcome:
    """Run `attempt` inside `middleware`: each `before` in order, then each `on_error` (for
    a failed attempt whose code raised) and `after` in reverse."""
    chain = tuple(middleware)  # one registered meanwhile waits for the next attempt
    for mw in chain:
        await _call(mw, "before", ctx)
    outcome = await attempt()
    exc = outcome.exception if outcome.kind in _FAILED else None
    for mw in reversed(chain):
        if exc is not None:
            await _call(mw, "on_error", ctx, exc)
        await _call(mw, "after", ctx, outcome)
    return outcome
