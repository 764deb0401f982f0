"""OpenTelemetry tracing: a job carries the trace it was enqueued in, and its attempts continue it.

With the `otel` extra installed (`pip install 'durable-worker-pg[otel]'`), `enqueue` stores the
current trace context with the job (`worker.jobs.trace_context`, as the configured propagator
writes it: by default W3C `traceparent` and `tracestate`, and `baggage`). The worker then runs
each attempt in a span that is a child of the span the job was enqueued in, with a child span
per pipeline stage:

    POST /orders                      (the caller's span: a request, a command)
    └── run ship_order                (one per attempt: worker.job.id, .task, .queue, .attempt)
        ├── stage reserve             (one per stage run: worker.stage)
        └── stage charge

Spans go wherever the process's tracer provider sends them (`opentelemetry.trace
.set_tracer_provider`, or the `opentelemetry-instrument` launcher); a job enqueued with no
span current starts a trace of its own. Without OpenTelemetry installed nothing here imports
it, every job's `trace_context` stays NULL, and every hook is a no-op; with it installed but
no tracer provider set, an attempt at a job enqueued outside any trace makes no span either.
What it does not do: trace the worker's own claims and writes, or record a span for the
enqueue itself (the caller's span is that).
"""

from __future__ import annotations

import contextlib
import functools
import json
from collections.abc import Iterator
from typing import Any

from worker.models import ClaimedJob, Outcome, OutcomeKind

try:
    from opentelemetry import propagate, trace
    from opentelemetry.trace import SpanKind, Status, StatusCode
except ImportError:  # the `otel` extra is not installed: nothing is traced
    ENABLED = False
else:
    ENABLED = True

__all__ = ["ENABLED", "attempt_span", "carrier", "ended", "stage_span"]

# The instrumentation scope every span of the worker is recorded under.
SCOPE = "durable-worker"

# Outcomes that end an attempt in error, as its span's status says.
_FAILED = (OutcomeKind.FAILED, OutcomeKind.RETRY)


@functools.cache
def _tracer() -> Any:
    """The worker's tracer: one for the process (before a provider is set, a proxy that
    follows the one set later)."""
    return trace.get_tracer(SCOPE)


def carrier() -> str | None:
    """The current trace context as the JSON text `trace_context` stores, or None when no
    span is current (or OpenTelemetry is not installed)."""
    if not ENABLED or not trace.get_current_span().get_span_context().is_valid:
        return None
    found: dict[str, str] = {}
    propagate.inject(found)
    return json.dumps(found, separators=(",", ":")) if found else None


def _parent(stored: Any) -> Any:
    """The context a job's `trace_context` names (None: the attempt starts a trace)."""
    if isinstance(stored, str):
        stored = json.loads(stored)
    return propagate.extract(stored) if isinstance(stored, dict) and stored else None


# What a span context is without OpenTelemetry: one shared context that does nothing, so the
# per-job path builds no generator for it.
_NO_SPAN: contextlib.nullcontext[None] = contextlib.nullcontext()


def _traced(job: ClaimedJob) -> bool:
    """Whether an attempt at `job` has a span to make: OpenTelemetry is installed, and either
    a tracer provider records spans or the job carries a trace for its own enqueues to
    continue. Without either, the span would be an invalid one that nothing sees."""
    if not ENABLED:
        return False
    return job.trace_context is not None or not isinstance(
        trace.get_tracer_provider(), trace.ProxyTracerProvider | trace.NoOpTracerProvider
    )


def attempt_span(job: ClaimedJob) -> contextlib.AbstractContextManager[Any]:
    """The span of one attempt at `job`, current while it runs: a child of the span the job
    was enqueued in. Gives None when there is nothing to trace (`_traced`)."""
    return _attempt_span(job) if _traced(job) else _NO_SPAN


@contextlib.contextmanager
def _attempt_span(job: ClaimedJob) -> Iterator[Any]:
    with _tracer().start_as_current_span(
        f"run {job.task}",
        context=_parent(job.trace_context),
        kind=SpanKind.CONSUMER,
        attributes={
            "worker.job.id": job.id,
            "worker.job.task": job.task,
            "worker.job.queue": job.queue,
            "worker.job.attempt": job.attempt,
        },
        # The outcome, not an exception, says how an attempt ended (`ended`).
        record_exception=False,
        set_status_on_exception=False,
    ) as span:
        yield span


def ended(span: Any, job: ClaimedJob, outcome: Outcome) -> None:
    """Record on an attempt's span how the attempt ended: its outcome (`failed` for a retry
    with none left, as the outcome write decides), an error status if it failed."""
    if span is None:
        return
    kind = outcome.kind
    if kind == OutcomeKind.RETRY and job.retry_count >= job.max_retries:
        kind = OutcomeKind.FAILED
    span.set_attribute("worker.job.outcome", str(kind))
    if kind in _FAILED:
        first_line = (outcome.error or "").partition("\n")[0]
        span.set_status(Status(StatusCode.ERROR, first_line))


def stage_span(
    job: ClaimedJob, stage: str, not_failures: tuple[type[BaseException], ...] = ()
) -> contextlib.AbstractContextManager[None]:
    """The span of one run of a pipeline stage, a child of its attempt's span. An exception
    of `not_failures` (a snooze, a pause, a cancel) ends it without an error."""
    return _stage_span(job, stage, not_failures) if _traced(job) else _NO_SPAN


@contextlib.contextmanager
def _stage_span(
    job: ClaimedJob, stage: str, not_failures: tuple[type[BaseException], ...]
) -> Iterator[None]:
    with _tracer().start_as_current_span(
        f"stage {stage}",
        attributes={"worker.stage": stage, "worker.job.id": job.id},
        record_exception=False,
        set_status_on_exception=False,
    ) as span:
        try:
            yield
        except not_failures:
            raise
        except Exception as exc:
            span.record_exception(exc)
            span.set_status(Status(StatusCode.ERROR, f"{type(exc).__name__}: {exc}"))
            raise
