"""One run of a stage: running it within its deadline, and how it ended.

`invoke` runs a stage's function, holding it to the stage's own deadline (counted from the
stage's first start, snoozes included). `Ended` says how the run ended (`Ending`), and
`ENDINGS` is the one table of what each ending writes to the stage's row, which event reports
it, and how the attempt ends. `ending_of` says what becomes of the job after an attempt, as its
cleanups are told (`JobEnding`). What it does not do: write or publish anything (the runner does,
`worker.stages.runner`), or decide what runs next.
"""

from __future__ import annotations

import asyncio
import traceback
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING, Any

from worker.attempt import call
from worker.encoding import NotStorable, dumps
from worker.models import (
    JSON,
    ClaimedJob,
    EventStatus,
    JobEnding,
    Outcome,
    OutcomeKind,
    StageStatus,
)
from worker.retries import DEFAULT_RULES, RetryRules
from worker.tasks import Context, JobCancelled, PauseForResolution, Snooze, WaitForChildren
from worker.tracing import stage_span

if TYPE_CHECKING:
    from worker.stages.stage import Stage


class StageDeadlineExceeded(Exception):
    """A stage ran (or kept snoozing) past its own deadline; the job fails without a retry."""


# How a stage stops that is no failure of it: its span ends without an error.
_NOT_FAILURES = (JobCancelled, PauseForResolution, Snooze, WaitForChildren)


async def invoke(ctx: Context, stage: Stage, age: float) -> Any:
    """Run one stage within what is left of its deadline (`age`: seconds since it first ran),
    in a span of its own (`worker.tracing`)."""
    with stage_span(ctx.job, stage.name, _NOT_FAILURES):
        return await _within_deadline(ctx, stage, age)


async def _within_deadline(ctx: Context, stage: Stage, age: float) -> Any:
    if stage.deadline is None:
        return await call(ctx, stage.fn, stage.is_async, ctx)
    left = stage.deadline - age
    if left <= 0:
        raise StageDeadlineExceeded(
            f"stage {stage.name} gave up: not done {age:.1f} s after it first started "
            f"(deadline {stage.deadline} s)"
        )
    try:
        async with asyncio.timeout(left) as limit:
            return await call(ctx, stage.fn, stage.is_async, ctx)
    except TimeoutError:
        if not limit.expired():
            raise  # the stage's own TimeoutError, not its deadline
        raise StageDeadlineExceeded(
            f"stage {stage.name} gave up: still running {stage.deadline} s after it "
            f"first started (its deadline)"
        ) from None


class Ending(StrEnum):
    """How one run of a stage ended."""

    COMPLETED = "completed"
    SNOOZED = "snoozed"
    PAUSED = "paused"
    CANCELLED = "cancelled"
    FAILED_FOR_GOOD = "failed_for_good"  # past its deadline, or given up on: no retry
    RETRYABLE = "retryable"  # it raised: the job is retried from this stage
    NOT_STORABLE = "not_storable"  # its output cannot be stored: no retry helps
    # It completed, and its job waits for the children it spawned: written as a completion
    # with the job's outcome (`OutcomeKind.WAITING`), not through `ENDINGS`.
    WAITING = "waiting"


@dataclass(frozen=True)
class EndRule:
    """What an ending writes to the stage's row, how it is reported, and how the attempt ends."""

    written: StageStatus
    outcome: OutcomeKind
    event: EventStatus | None
    # Reported once the outcome is written rather than at once: a client acting on the event
    # (resuming a paused job, reading a cancelled one) must find the job in that state.
    with_outcome: bool = False


ENDINGS: dict[Ending, EndRule] = {
    Ending.SNOOZED: EndRule(StageStatus.SNOOZED, OutcomeKind.SNOOZED, None),
    Ending.PAUSED: EndRule(StageStatus.PAUSED, OutcomeKind.PAUSED, "paused", with_outcome=True),
    Ending.CANCELLED: EndRule(
        StageStatus.CANCELLED, OutcomeKind.CANCELLED, "cancelled", with_outcome=True
    ),
    Ending.FAILED_FOR_GOOD: EndRule(StageStatus.FAILED, OutcomeKind.FAILED, "failed"),
    Ending.RETRYABLE: EndRule(StageStatus.FAILED, OutcomeKind.RETRY, "failed"),
    Ending.NOT_STORABLE: EndRule(StageStatus.FAILED, OutcomeKind.FAILED, "failed"),
}


@dataclass
class Ended:
    """One run of a stage, ended: how, and what that end writes and reports."""

    how: Ending
    stage: str
    output: JSON = None  # completed: the stage's return value
    text: str | None = None  # completed: that value as the JSON text stored
    stored_error: str | None = None  # the stage row's error
    job_error: str | None = None  # the outcome's error
    message: dict[str, JSON] | None = None  # the event's message
    delay: float | None = None  # snoozed or retried: seconds until the stage runs again
    question: JSON = None  # paused: what the operator is asked
    exception: BaseException | None = None  # failed: what the stage raised (not a `Retry`)

    @classmethod
    def raised(
        cls,
        stage: str,
        exc: Exception,
        cancelled: bool,
        rules: RetryRules = DEFAULT_RULES,
        retries: int = 0,
    ) -> Ended:
        """How a stage that raised `exc` ended, in an attempt after `retries` retries; a cancel
        requested meanwhile wins over a snooze or a pause, which would otherwise take the job
        out of a worker's reach. The pipeline's `rules` say whether a failure is retried."""
        if isinstance(exc, JobCancelled) or (
            cancelled and isinstance(exc, Snooze | PauseForResolution | WaitForChildren)
        ):
            return cls(Ending.CANCELLED, stage, job_error=f"cancelled during stage {stage}")
        if isinstance(exc, Snooze):
            return cls(Ending.SNOOZED, stage, delay=exc.seconds)
        if isinstance(exc, WaitForChildren):
            try:
                return cls(Ending.WAITING, stage, output=exc.output, text=dumps(exc.output))
            except NotStorable as not_storable:
                return cls.not_storable(stage, not_storable)
        if isinstance(exc, PauseForResolution):
            return cls(
                Ending.PAUSED, stage, question=exc.question, message={"question": exc.question}
            )
        if isinstance(exc, StageDeadlineExceeded):
            error = f"stage {stage} failed: {short_error(exc)}"
            return cls(
                Ending.FAILED_FOR_GOOD,
                stage,
                stored_error=str(exc),
                job_error=error,
                message={"error": short_error(exc)},
                exception=exc,
            )
        ended = cls.failed(stage, exc)
        outcome = rules.outcome(exc, retries, ended.job_error or "")
        if outcome.kind == OutcomeKind.FAILED:
            ended.how = Ending.FAILED_FOR_GOOD
        ended.delay = outcome.delay
        ended.exception = outcome.exception
        return ended

    @classmethod
    def failed(cls, stage: str, exc: Exception) -> Ended:
        """A stage (or cleanup) that raised: its row keeps the traceback, the event one line."""
        error = stage_error(stage, exc)
        message = {"error": short_error(exc)}
        return cls(Ending.RETRYABLE, stage, stored_error=error, job_error=error, message=message)

    @classmethod
    def not_storable(cls, stage: str, exc: NotStorable) -> Ended:
        """A stage whose output cannot be stored: not JSON, or past one of PostgreSQL's limits."""
        error = f"stage {stage} returned a value that {exc}"
        return cls(
            Ending.NOT_STORABLE,
            stage,
            stored_error=error,
            job_error=error,
            message={"error": error},
        )


def short_error(exc: BaseException) -> str:
    """An error as its events report it: its type and message."""
    return f"{type(exc).__name__}: {exc}"


def stage_error(stage: str, exc: BaseException) -> str:
    """An error as the stage's row and the job keep it: which stage, and the traceback."""
    return f"stage {stage} failed: {short_error(exc)}\n" + traceback_text(exc)


def traceback_text(exc: BaseException) -> str:
    """The traceback of `exc`, up to twenty frames."""
    return "".join(traceback.format_exception(exc, limit=20))


# -- how the job ends -----------------------------------------------------------------------


def fails_for_good(job: ClaimedJob, outcome: Outcome) -> bool:
    """True if this outcome ends the job failed: no retry follows it."""
    return outcome.kind == OutcomeKind.FAILED or (
        outcome.kind == OutcomeKind.RETRY and job.retry_count >= job.max_retries
    )


def ending_of(job: ClaimedJob, outcome: Outcome, cancelled: bool) -> JobEnding:
    """What becomes of the job after an attempt that ends with `outcome`: a retry that meets a
    cancel request is settled cancelled by the next claim (`sql.RECORD_OUTCOMES`)."""
    if outcome.kind == OutcomeKind.COMPLETED:
        return JobEnding.COMPLETED
    if outcome.kind == OutcomeKind.CANCELLED:
        return JobEnding.CANCELLED
    if fails_for_good(job, outcome):
        return JobEnding.FAILED
    return JobEnding.CANCELLED if cancelled else JobEnding.RETRY


def with_cleanup_errors(outcome: Outcome, errors: list[str]) -> Outcome:
    """The outcome of an attempt whose cleanups failed with `errors`."""
    if not errors:
        return outcome
    note = "; ".join(errors)
    if outcome.kind == OutcomeKind.COMPLETED:
        # Every stage is done, so the retry runs the cleanups only.
        return Outcome(OutcomeKind.RETRY, error=f"cleanup failed: {note}")
    # The original error stays first: it is what went wrong; the cleanup comes after.
    outcome.error = f"{outcome.error}\n(cleanup also failed: {note})"
    return outcome
