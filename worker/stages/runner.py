"""Running one attempt of a pipeline: which stages run, and what their ends write and report.

An attempt resumes after the last completed stage, runs the remaining stages in order, then the
cleanups, and hands the daemon an `Outcome` (with the stage end that goes with it, and the
events to publish once it is written). What it does not do: write the job's outcome (the
daemon's completer does), or touch the database (it writes through a `StageStore`).
"""

from __future__ import annotations

import asyncio
import logging
import traceback
from typing import TYPE_CHECKING, Any, cast

from worker.attempt import (
    JSON,
    Outcome,
    OutcomeKind,
    StageEnd,
    call,
    settled_before_start,
)
from worker.encoding import NotStorable, dumps
from worker.models import EventStatus, StageStatus
from worker.stages.store import StageRow, StageStore
from worker.tasks import Context, JobCancelled, PauseForResolution, Snooze

if TYPE_CHECKING:
    from worker.stages.pipeline import Pipeline, Stage

log = logging.getLogger("worker.jobs")

# Stage rows still open: a stage that was running, snoozing or waiting for an answer.
_OPEN = ("running", "snoozed", "paused")
# Cleanup rows of an attempt that did not finish its cleanups: one ran, or had yet to run.
_UNFINISHED = ("running", "waiting")


class StageDeadlineExceeded(Exception):
    """A stage ran (or kept snoozing) past its own deadline; the job fails without a retry."""


def _short_error(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


def _traceback(exc: BaseException) -> str:
    return "".join(traceback.format_exception(exc, limit=20))


async def _unstorable(ctx: Context, store: StageStore, stage: str, exc: NotStorable) -> str:
    """Record `stage` failed for an output that cannot be stored (not JSON, or past one of
    PostgreSQL's limits) and report it; returns the error, for the job's."""
    error = f"stage {stage} returned a value that {exc}"
    await store.finished(ctx.job, stage, "failed", error=error)
    ctx.emit(stage, "failed", {"error": error})
    return error


def _stage_error(stage: str, exc: BaseException) -> str:
    return f"stage {stage} failed: {_short_error(exc)}\n" + _traceback(exc)


def unclean_attempt(pipeline: Pipeline, rows: dict[str, StageRow]) -> int | None:
    """The latest attempt whose stages ran but whose cleanups did not (all) run.

    `sql.CANCEL` computes the same thing in SQL; keep the two in step.
    """
    if not pipeline.cleanups:
        return None
    cleaned = min(
        (r.attempt if (r := rows.get(c.name)) and r.status not in _UNFINISHED else 0)
        for c in pipeline.cleanups
    )
    dirty = [r.attempt for r in rows.values() if r.kind == "stage" and r.attempt > cleaned]
    return max(dirty) if dirty else None


async def execute(pipeline: Pipeline, ctx: Context) -> Outcome:
    store: StageStore = ctx.runtime.store  # type: ignore[attr-defined]
    job = ctx.job
    # On a job's first run the claim started its first stage, and there is nothing to read.
    rows = {} if job.first_stage_started else {r.stage: r for r in await store.load(job.id)}
    ctx.outputs.update(
        {
            name: r.output
            for name, r in rows.items()
            if r.kind == "stage" and r.status == "completed"
        }
    )
    unclean = unclean_attempt(pipeline, rows)

    # Stages an earlier attempt left open were cut off with their worker: say so.
    interrupted = ""
    for row in rows.values():
        if row.kind == "stage" and row.status in _OPEN and row.attempt < job.attempt:
            interrupted = f"the worker running attempt {row.attempt} was lost in {row.stage}"
            await store.finished(job, row.stage, "failed", error=f"interrupted: {interrupted}")
            ctx.emit(row.stage, "failed", {"error": f"interrupted: {interrupted}"})
            row.status = "failed"

    # A cancel that came after the claim is met at the first stage boundary, which also
    # ends the stage the claim started.
    settled = settled_before_start(job)
    if settled is not None:
        if settled.kind == "failed" and not job.last_error and interrupted:
            settled.error = f"out of attempts: {interrupted}"
        # Cancelled while it waited, or out of attempts after a lost worker: only the
        # cleanup the last attempt owes is left to do.
        closing: EventStatus = "cancelled" if settled.kind == "cancelled" else "failed"
        for row in rows.values():
            if row.kind == "stage" and row.status in _OPEN:
                await store.finished(job, row.stage, closing, error=settled.error)
                ctx.emit(row.stage, closing)
        if unclean is not None:
            errors = await _run_cleanups(pipeline, ctx, store, unclean)
            settled = _with_cleanup_errors(settled, errors)
        return _finish(ctx, settled)
    owed_errors: list[str] = []
    if unclean is not None and unclean < job.attempt:
        # The attempt that ran these stages is over (its worker was lost) and never
        # cleaned up after itself: do it now, before this attempt starts.
        owed_errors = await _run_cleanups(pipeline, ctx, store, unclean)

    # Begun by the claim, or by an earlier claim of this attempt (before a snooze, a pause
    # or a hand-back).
    began = job.first_stage_started or any(
        r.kind == "stage" and r.attempt == job.attempt for r in rows.values()
    )
    left = [s.name for s in pipeline.main_stages if s.name not in ctx.outputs]
    if ctx.cancelled and left and not began:
        # An attempt cancelled before it began a stage has nothing to clean up: the one
        # before it cleaned up at its end, or as owed just now.
        cancelled = Outcome(OutcomeKind.CANCELLED, error=f"cancelled before stage {left[0]}")
        return _finish(ctx, _with_cleanup_errors(cancelled, owed_errors))
    if owed_errors:
        log.warning(
            "job %s: cleanup owed by attempt %d failed (%s); attempt %d goes on",
            job.id,
            unclean,
            "; ".join(owed_errors),
            job.attempt,
        )
    outcome = await _run_stages(pipeline, ctx, store, rows, began)
    if outcome.kind in ("snoozed", "paused"):
        return outcome  # the attempt goes on later; nothing to clean up yet
    errors = await _run_cleanups(pipeline, ctx, store, job.attempt, after=outcome)
    return _finish(ctx, _with_cleanup_errors(outcome, errors))


def _with_cleanup_errors(outcome: Outcome, errors: list[str]) -> Outcome:
    if not errors:
        return outcome
    note = "; ".join(errors)
    if outcome.kind == "completed":
        # Every stage is done, so the retry runs the cleanups only.
        return Outcome(OutcomeKind.RETRY, error=f"cleanup failed: {note}")
    # The original error stays first: it is what went wrong; the cleanup comes after.
    outcome.error = f"{outcome.error}\n(cleanup also failed: {note})"
    return outcome


async def _run_stages(
    pipeline: Pipeline, ctx: Context, store: StageStore, rows: dict[str, StageRow], began: bool
) -> Outcome:
    job = ctx.job
    last_output: JSON = None
    # A stage done whose completion is not recorded yet. It is recorded with the next
    # write, in one commit: the next stage's start, the first cleanup's start, or the job's
    # outcome; always before anything else runs.
    done: tuple[str, str] | None = None
    claim_started_it = job.first_stage_started

    def hand_over(outcome: Outcome) -> Outcome:
        if done is not None:
            outcome.stage_end = StageEnd(done[0], StageStatus.COMPLETED, done[1])
        elif claim_started_it:  # cancelled before the stage the claim started ever ran
            outcome.stage_end = StageEnd(pipeline.main_stages[0].name, StageStatus.CANCELLED)
        if outcome.stage_end is not None:  # reported once it is written
            end = outcome.stage_end
            outcome.events.append(ctx.event(end.stage, cast(EventStatus, str(end.status))))
        return outcome

    async def cancelled_during(name: str) -> Outcome:
        await store.finished(job, name, "cancelled")
        error = f"cancelled during stage {name}"
        return Outcome(OutcomeKind.CANCELLED, error=error, events=[ctx.event(name, "cancelled")])

    for stage in pipeline.main_stages:
        row = rows.get(stage.name)
        if row is not None and row.status == "completed":
            last_output = row.output
            if not began:  # reported once per attempt, not on each return from a snooze
                ctx.emit(stage.name, "skipped", {"reason": "completed in an earlier attempt"})
            continue
        if ctx.cancelled:  # the stage boundary: a cancel request stops the job here
            cancelled = Outcome(OutcomeKind.CANCELLED, error=f"cancelled before stage {stage.name}")
            if done is None and not claim_started_it and row and row.status in _OPEN:
                # Its row is open from before (snoozed, paused, or handed back running).
                await store.finished(job, stage.name, "cancelled")
                cancelled.events.append(ctx.event(stage.name, "cancelled"))
            return hand_over(cancelled)
        if done is not None:
            try:
                age = await store.advance(job, done[0], done[1], stage.name, "stage", job.attempt)
            except NotStorable as exc:  # past one of PostgreSQL's limits: no retry helps
                return Outcome(
                    OutcomeKind.FAILED, error=await _unstorable(ctx, store, done[0], exc)
                )
            ctx.emit(done[0], "completed")
            done = None
        elif claim_started_it:
            age, claim_started_it = 0.0, False
        else:
            age = await store.started(job, stage.name, "stage", job.attempt)
        if row is None or row.status != "snoozed":
            ctx.emit(stage.name, "started", {"attempt": job.attempt})
        ctx.step = stage.name
        try:
            output = await _invoke(ctx, stage, age)
        except Snooze as snooze:
            if ctx.cancelled:
                return await cancelled_during(stage.name)
            await store.finished(job, stage.name, "snoozed")
            return Outcome(OutcomeKind.SNOOZED, delay=snooze.seconds)
        except PauseForResolution as pause:
            if ctx.cancelled:
                return await cancelled_during(stage.name)
            await store.finished(job, stage.name, "paused")
            # Reported once the job is `paused`: a client may resume it on seeing this.
            paused = ctx.event(stage.name, "paused", {"question": pause.question})
            return Outcome(OutcomeKind.PAUSED, result=pause.question, events=[paused])
        except JobCancelled:
            return await cancelled_during(stage.name)
        except StageDeadlineExceeded as exc:
            await store.finished(job, stage.name, "failed", error=str(exc))
            ctx.emit(stage.name, "failed", {"error": _short_error(exc)})
            return Outcome(
                OutcomeKind.FAILED, error=f"stage {stage.name} failed: {_short_error(exc)}"
            )
        except Exception as exc:
            await store.finished(job, stage.name, "failed", error=_stage_error(stage.name, exc))
            ctx.emit(stage.name, "failed", {"error": _short_error(exc)})
            return Outcome(OutcomeKind.RETRY, error=_stage_error(stage.name, exc))
        finally:
            ctx.step = ""
        try:
            text = dumps(output)
        except NotStorable as exc:  # not JSON, or past PostgreSQL's limits: no retry helps
            return Outcome(OutcomeKind.FAILED, error=await _unstorable(ctx, store, stage.name, exc))
        done = (stage.name, text)
        ctx.outputs[stage.name] = last_output = output
    if pipeline._result is None:  # the last stage's output, encoded already if it ran now
        ran_last = done is not None and done[0] == pipeline.main_stages[-1].name
        encoded = done[1] if done is not None and ran_last else dumps(last_output)
        return hand_over(Outcome(OutcomeKind.COMPLETED, result=last_output, result_json=encoded))
    # Whatever `result=` does, the last stage is recorded completed and reported.
    try:
        result = pipeline._result(dict(ctx.outputs))
        encoded = dumps(result)
    except NotStorable as exc:
        error = f"pipeline {pipeline.name}: its result= returned a value that {exc}"
        return hand_over(Outcome(OutcomeKind.FAILED, error=error))
    except Exception as exc:
        error = f"pipeline {pipeline.name}: its result= raised {_short_error(exc)}\n"
        return hand_over(Outcome(OutcomeKind.RETRY, error=error + _traceback(exc)))
    return hand_over(Outcome(OutcomeKind.COMPLETED, result=result, result_json=encoded))


async def _invoke(ctx: Context, stage: Stage, age: float) -> Any:
    """Run one stage within what is left of its deadline."""
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


async def _run_cleanups(
    pipeline: Pipeline, ctx: Context, store: StageStore, attempt: int, after: Outcome | None = None
) -> list[str]:
    """Run the cleanups; a stage end the outcome `after` carries is recorded with the
    first one's start (before it runs), not left for the job's outcome."""
    errors = []
    end, reported = None, []
    if after is not None and pipeline.cleanups:
        end, after.stage_end = after.stage_end, None
        reported, after.events = after.events, []
        if _fails_for_good(ctx, after):
            await store.failed_for_good(ctx.job, after.error or "failed")
    # Cleanups are not bound by the job's timeout: they must run even after it passed.
    job_deadline, ctx.deadline = ctx.deadline, None
    try:
        for i, stage in enumerate(pipeline.cleanups):
            # From the first one's start, those not run yet are known (`waiting`).
            waiting = [c.name for c in pipeline.cleanups[i + 1 :]] if i == 0 else []
            if end is not None and end.status == "completed":
                try:
                    await store.advance(
                        ctx.job, end.stage, end.output, stage.name, "cleanup", attempt, waiting
                    )
                except NotStorable as exc:  # past PostgreSQL's limits: the job fails
                    assert after is not None  # `end` came with it
                    after.kind = OutcomeKind.FAILED
                    after.error = await _unstorable(ctx, store, end.stage, exc)
                    after.result = after.result_json = None
                    await store.failed_for_good(ctx.job, after.error)
                    reported = []  # they reported the stage completed
                    await store.started(ctx.job, stage.name, "cleanup", attempt, waiting)
            else:
                if end is not None:
                    await store.finished(ctx.job, end.stage, end.status)
                await store.started(ctx.job, stage.name, "cleanup", attempt, waiting)
            end = None
            for event in reported:  # the stage end they report is written now
                ctx.runtime.bus.publish(event)
            reported = []
            ctx.emit(stage.name, "started", {"attempt": attempt})
            ctx.step = stage.name
            try:
                output = await _invoke(ctx, stage, 0.0)
                text = dumps(output)
            except Exception as exc:
                errors.append(f"{stage.name}: {_short_error(exc)}")
                await store.finished(
                    ctx.job, stage.name, "failed", error=_stage_error(stage.name, exc)
                )
                ctx.emit(stage.name, "failed", {"error": _short_error(exc)})
                continue
            finally:
                ctx.step = ""
            try:
                await store.finished(ctx.job, stage.name, "completed", output=text)
            except NotStorable as exc:
                errors.append(await _unstorable(ctx, store, stage.name, exc))
                continue
            ctx.emit(stage.name, "completed")
    finally:
        ctx.deadline = job_deadline
    return errors


def _fails_for_good(ctx: Context, outcome: Outcome) -> bool:
    return outcome.kind == "failed" or (
        outcome.kind == "retry" and ctx.job.retry_count >= ctx.job.max_retries
    )


def _finish(ctx: Context, outcome: Outcome) -> Outcome:
    ends: dict[str, EventStatus] = {"completed": "completed", "cancelled": "cancelled"}
    final_status = ends.get(outcome.kind)
    if _fails_for_good(ctx, outcome):
        final_status = "failed"
    if final_status is not None:
        message = {"error": outcome.error.splitlines()[0]} if outcome.error else None
        outcome.events.append(ctx.event("job", final_status, message))
    return outcome
