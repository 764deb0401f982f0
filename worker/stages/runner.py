"""Running one attempt of a pipeline, as a state machine: its phases, and what a stage end means.

An attempt goes through these phases (`Phase`), each a method of `PipelineRun` that returns
the next one:

- RESUMING: read what earlier claims stored; close the stages a lost worker left open. Then
  SETTLING if the job must not run at all, CLEANING_OWED if a lost attempt never ran its
  cleanups, else STARTING.
- SETTLING: close the open stages as the job ends (cancelled or failed), run the cleanup owed,
  then FINISHING.
- CLEANING_OWED: run the cleanups a lost attempt owes, then STARTING.
- STARTING: FINISHING at once if cancelled before this attempt began a stage, else
  RUNNING_STAGE.
- RUNNING_STAGE: skip the stages completed before; stop at a cancel (CLEANING_UP); record the
  next stage's start and run it (STAGE_ENDED); with none left, CONCLUDING.
- STAGE_ENDED: a completed stage goes back to RUNNING_STAGE; a snooze or a pause is FINISHED
  (the attempt goes on later), and so is a wait for the children the stage spawned, recorded
  as its completion; any other end is CLEANING_UP.
- CONCLUDING: the job's result, then CLEANING_UP.
- CLEANING_UP: run the `ALL_DONE` stages, then FINISHING (the job's own event), then FINISHED.

Every cleanup is told, in `ctx.ending` (`JobEnding`), what becomes of the job after the attempt
it cleans up after: an owed one run before a new attempt is told RETRY, and one run as the job
settles is told how it settles.

How a stage ended (`Ending`) decides, in one table (`ENDINGS`), what is written to its row,
which event reports it and when, and the `Outcome` the daemon gets. A completed stage is the
exception: its end is written with the next write (the next stage's start, the first cleanup's
start, or the job's outcome), so that a stage's output and what follows it commit together.

What it does not do: write the job's outcome (the daemon's completer does, with the stage end
the outcome carries), or touch the database (every write goes through a `StageStore`).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from enum import StrEnum
from typing import TYPE_CHECKING, Protocol, cast

from worker.attempt import Runtime, settled_before_start
from worker.encoding import NotStorable, dumps
from worker.models import (
    JSON,
    EventStatus,
    JobEnding,
    Outcome,
    OutcomeKind,
    StageEnd,
    StageKind,
    StageRow,
    StageStatus,
)
from worker.stages.endings import (
    ENDINGS,
    Ended,
    Ending,
    ending_of,
    fails_for_good,
    invoke,
    short_error,
    traceback_text,
    with_cleanup_errors,
)
from worker.stages.store import OPEN, StageStore
from worker.tasks import Context

if TYPE_CHECKING:
    from worker.stages.stage import Stage, StageList

log = logging.getLogger("worker.jobs")


class StageRuntime(Runtime, Protocol):
    """The runtime a pipeline runs in: the daemon's, which also lends its stage store."""

    @property
    def store(self) -> StageStore: ...


class Phase(StrEnum):
    """Where an attempt of a pipeline is."""

    RESUMING = "resuming"  # reading what earlier claims stored, closing what a lost one left
    SETTLING = "settling"  # the job must not run: close its open rows, run the owed cleanup
    CLEANING_OWED = "cleaning_owed"  # a lost worker's attempt never cleaned up: do it first
    STARTING = "starting"  # this attempt begins, or ends cancelled before it began
    RUNNING_STAGE = "running_stage"
    STAGE_ENDED = "stage_ended"
    CONCLUDING = "concluding"  # every stage is done: the job's result
    CLEANING_UP = "cleaning_up"  # the ALL_DONE stages, after the attempt ended
    FINISHING = "finishing"  # the job's own event, when the outcome ends the job
    FINISHED = "finished"


# The event that reports a stage row closed with this status.
_REPORTED: dict[StageStatus, EventStatus] = {
    StageStatus.COMPLETED: "completed",
    StageStatus.FAILED: "failed",
    StageStatus.CANCELLED: "cancelled",
    StageStatus.PAUSED: "paused",
}
# The job's own event for an outcome that ends it (failing for good is decided apart).
_JOB_ENDS: dict[OutcomeKind, EventStatus] = {
    OutcomeKind.COMPLETED: "completed",
    OutcomeKind.CANCELLED: "cancelled",
}


async def execute(pipeline: StageList, ctx: Context) -> Outcome:
    """Run one attempt of `pipeline` for the job `ctx` holds; the outcome for the daemon."""
    return await PipelineRun(pipeline, ctx).run()


class PipelineRun:
    """One attempt of a pipeline, phase by phase; `run` returns its outcome."""

    def __init__(self, pipeline: StageList, ctx: Context) -> None:
        self.pipeline = pipeline
        self.ctx = ctx
        self.job = ctx.job
        # The daemon (or a `MemoryRuntime`) lends the store with the runtime.
        self.store = cast(StageRuntime, ctx.runtime).store
        self.rows: dict[str, StageRow] = {}
        self.unclean: int | None = None  # the attempt whose cleanups are owed, if one is
        self.interrupted = ""  # how an earlier attempt was cut off, if one was
        self.owed_errors: list[str] = []
        self.began = False  # this attempt's stages had begun: by its claim, or an earlier one
        # The claim recorded the first stage running, and it has not run yet.
        self.claim_started = self.job.first_stage_started
        # A stage done whose completion is not recorded yet. It is recorded with the next
        # write, in one commit: the next stage's start, the first cleanup's start, or the
        # job's outcome; always before anything else runs.
        self.done: Ended | None = None
        self.last_output: JSON = None
        self.position = 0  # the next stage to run, in `pipeline.main_stages`
        self.ended: Ended | None = None
        self.outcome = Outcome(OutcomeKind.RETRY)  # set by the phase that ends the attempt
        self._phases: dict[Phase, Callable[[], Awaitable[Phase]]] = {
            Phase.RESUMING: self._resume,
            Phase.SETTLING: self._settle,
            Phase.CLEANING_OWED: self._clean_owed,
            Phase.STARTING: self._start,
            Phase.RUNNING_STAGE: self._run_stage,
            Phase.STAGE_ENDED: self._stage_ended,
            Phase.CONCLUDING: self._conclude,
            Phase.CLEANING_UP: self._clean_up,
            Phase.FINISHING: self._finish,
        }

    async def run(self) -> Outcome:
        phase = Phase.RESUMING
        while phase is not Phase.FINISHED:
            phase = await self._phases[phase]()
        return self.outcome

    # -- the phases --------------------------------------------------------------------------

    async def _resume(self) -> Phase:
        job = self.job
        # On a job's first run the claim started its first stage, and there is nothing to read.
        if not job.first_stage_started:
            history = await self.store.load(job.id)
            self.rows = {r.stage: r for r in history.rows}
            # Only a pipeline with cleanups can owe one; the rows cannot say whether it has.
            if self.pipeline.cleanups:
                self.unclean = history.owed_cleanup
        self.ctx.outputs.update(
            {
                name: r.output
                for name, r in self.rows.items()
                if r.kind == StageKind.STAGE and r.status == StageStatus.COMPLETED
            }
        )
        # Stages an earlier attempt left open were cut off with their worker: say so.
        for row in self._open_stage_rows():
            if row.attempt < job.attempt:
                self.interrupted = (
                    f"the worker running attempt {row.attempt} was lost in {row.stage}"
                )
                error = f"interrupted: {self.interrupted}"
                await self._close_row(row, StageStatus.FAILED, error, {"error": error})
        # A cancel that came after the claim is met at the first stage boundary, which also
        # ends the stage the claim started.
        settled = settled_before_start(job)
        if settled is not None:
            self.outcome = settled
            return Phase.SETTLING
        if self.unclean is not None and self.unclean < job.attempt:
            return Phase.CLEANING_OWED
        return Phase.STARTING

    async def _settle(self) -> Phase:
        # Cancelled while it waited, or out of attempts after a lost worker: only the cleanup
        # the last attempt owes is left to do.
        settled = self.outcome
        if settled.kind == OutcomeKind.FAILED and not self.job.last_error and self.interrupted:
            settled.error = f"out of attempts: {self.interrupted}"
        closing = (
            StageStatus.CANCELLED if settled.kind == OutcomeKind.CANCELLED else StageStatus.FAILED
        )
        for row in self._open_stage_rows():
            await self._close_row(row, closing, settled.error, None)
        if self.unclean is not None:
            ending = ending_of(self.job, settled, self.ctx.cancelled)
            errors = await self._run_cleanups(self.unclean, ending)
            self.outcome = with_cleanup_errors(settled, errors)
        return Phase.FINISHING

    async def _clean_owed(self) -> Phase:
        # The attempt that ran these stages is over (its worker was lost) and never cleaned up
        # after itself: do it now, before this attempt starts.
        assert self.unclean is not None  # the phase is entered only then
        # This attempt is the retry, unless a cancel came first (then `_start` ends it).
        ending = JobEnding.CANCELLED if self.ctx.cancelled else JobEnding.RETRY
        self.owed_errors = await self._run_cleanups(self.unclean, ending)
        return Phase.STARTING

    async def _start(self) -> Phase:
        job = self.job
        # Begun by the claim, or by an earlier claim of this attempt (before a snooze, a pause
        # or a hand-back).
        self.began = job.first_stage_started or any(
            r.kind == StageKind.STAGE and r.attempt == job.attempt for r in self.rows.values()
        )
        left = [s.name for s in self.pipeline.main_stages if s.name not in self.ctx.outputs]
        if self.ctx.cancelled and left and not self.began:
            # An attempt cancelled before it began a stage has nothing to clean up: the one
            # before it cleaned up at its end, or as owed just now.
            cancelled = Outcome(OutcomeKind.CANCELLED, error=f"cancelled before stage {left[0]}")
            self.outcome = with_cleanup_errors(cancelled, self.owed_errors)
            return Phase.FINISHING
        if self.owed_errors:
            log.warning(
                "job %s: cleanup owed by attempt %d failed (%s); attempt %d goes on",
                job.id,
                self.unclean,
                "; ".join(self.owed_errors),
                job.attempt,
            )
        return Phase.RUNNING_STAGE

    async def _run_stage(self) -> Phase:
        stages, ctx = self.pipeline.main_stages, self.ctx
        if self.position == len(stages):
            return Phase.CONCLUDING
        stage = stages[self.position]
        row = self.rows.get(stage.name)
        if row is not None and row.status == StageStatus.COMPLETED:
            self.last_output = row.output
            if not self.began:  # reported once per attempt, not on each return from a snooze
                ctx.emit(stage.name, "skipped", {"reason": "completed in an earlier attempt"})
            self.position += 1
            return Phase.RUNNING_STAGE
        if ctx.cancelled:  # the stage boundary: a cancel request stops the job here
            self.outcome = await self._cancel_at_boundary(stage.name, row)
            return Phase.CLEANING_UP
        age = await self._record_start(stage.name)
        if age is None:
            return Phase.STAGE_ENDED  # the stage done before could not be recorded
        if row is None or row.status != StageStatus.SNOOZED:
            ctx.emit(stage.name, "started", {"attempt": self.job.attempt})
        ctx.step = stage.name
        try:
            output = await invoke(ctx, stage, age)
        except Exception as exc:
            self.ended = Ended.raised(
                stage.name, exc, ctx.cancelled, self.pipeline.retries, self.job.retry_count
            )
        else:
            try:
                text = dumps(output)
            except NotStorable as exc:  # not JSON, or past PostgreSQL's limits: no retry helps
                self.ended = Ended.not_storable(stage.name, exc)
            else:
                self.ended = Ended(Ending.COMPLETED, stage.name, output=output, text=text)
        finally:
            ctx.step = ""
        return Phase.STAGE_ENDED

    async def _stage_ended(self) -> Phase:
        ended = self.ended
        assert ended is not None  # the phase is entered only then
        if ended.how in (Ending.COMPLETED, Ending.WAITING):
            self.done = ended  # recorded with the next write
            self.ctx.outputs[ended.stage] = self.last_output = ended.output
            self.position += 1
            if ended.how is Ending.COMPLETED:
                return Phase.RUNNING_STAGE
            # Held with its completion until its children end; then the next stage runs.
            self.outcome = self._hand_over(Outcome(OutcomeKind.WAITING))
            return Phase.FINISHED
        self.outcome = await self._close(ended)
        if self.outcome.kind in (OutcomeKind.SNOOZED, OutcomeKind.PAUSED):
            return Phase.FINISHED  # the attempt goes on later; nothing to clean up yet
        return Phase.CLEANING_UP

    async def _conclude(self) -> Phase:
        pipeline, done = self.pipeline, self.done
        if pipeline.result is None:  # the last stage's output, encoded already if it ran now
            ran_last = done is not None and done.stage == pipeline.main_stages[-1].name
            encoded = done.text if done is not None and ran_last else dumps(self.last_output)
            outcome = Outcome(OutcomeKind.COMPLETED, result=self.last_output, result_json=encoded)
            self.outcome = self._hand_over(outcome)
            return Phase.CLEANING_UP
        # Whatever `result=` does, the last stage is recorded completed and reported.
        try:
            result = pipeline.result(dict(self.ctx.outputs))
            encoded = dumps(result)
        except NotStorable as exc:
            error = f"pipeline {pipeline.name}: its result= returned a value that {exc}"
            outcome = Outcome(OutcomeKind.FAILED, error=error)
        except Exception as exc:
            error = f"pipeline {pipeline.name}: its result= raised {short_error(exc)}\n"
            outcome = Outcome(OutcomeKind.RETRY, error=error + traceback_text(exc))
        else:
            outcome = Outcome(OutcomeKind.COMPLETED, result=result, result_json=encoded)
        self.outcome = self._hand_over(outcome)
        return Phase.CLEANING_UP

    async def _clean_up(self) -> Phase:
        ending = ending_of(self.job, self.outcome, self.ctx.cancelled)
        errors = await self._run_cleanups(self.job.attempt, ending, after=self.outcome)
        self.outcome = with_cleanup_errors(self.outcome, errors)
        return Phase.FINISHING

    async def _finish(self) -> Phase:
        outcome = self.outcome
        status: EventStatus | None
        status = "failed" if fails_for_good(self.job, outcome) else _JOB_ENDS.get(outcome.kind)
        if status is not None:
            message = {"error": outcome.error.splitlines()[0]} if outcome.error else None
            outcome.events.append(self.ctx.event("job", status, message))
        return Phase.FINISHED

    # -- what the phases share ---------------------------------------------------------------

    def _open_stage_rows(self) -> list[StageRow]:
        """Stage rows still open: running, snoozing or waiting for an answer."""
        return [r for r in self.rows.values() if r.kind == StageKind.STAGE and r.status in OPEN]

    async def _close_row(
        self, row: StageRow, status: StageStatus, error: str | None, message: dict[str, JSON] | None
    ) -> None:
        """Close a row an earlier claim left open, and report it at once."""
        await self.store.finished(self.job, row.stage, status, error=error)
        self.ctx.emit(row.stage, _REPORTED[status], message)
        row.status = status

    async def _close(self, ended: Ended) -> Outcome:
        """Write how a stage ended, report it as `ENDINGS` says, and return the outcome."""
        rule = ENDINGS[ended.how]
        await self.store.finished(self.job, ended.stage, rule.written, error=ended.stored_error)
        outcome = Outcome(
            rule.outcome,
            result=ended.question,
            error=ended.job_error,
            delay=ended.delay,
            exception=ended.exception,
        )
        if rule.event is not None:
            event = self.ctx.event(ended.stage, rule.event, ended.message)
            if rule.with_outcome:
                outcome.events.append(event)
            else:
                self.ctx.runtime.bus.publish(event)
        return outcome

    async def _record_start(self, stage: str) -> float | None:
        """Record `stage` running (with the completion of the one done before it); return
        seconds since it first started, or None if that completion could not be stored."""
        job, done = self.job, self.done
        if done is not None:
            self.done = None
            try:
                age = await self.store.advance(
                    job, done.stage, done.text, stage, StageKind.STAGE, job.attempt
                )
            except NotStorable as exc:  # past one of PostgreSQL's limits: no retry helps
                self.ended = Ended.not_storable(done.stage, exc)
                return None
            self.ctx.emit(done.stage, "completed")
            return age
        if self.claim_started:
            self.claim_started = False
            return 0.0
        return await self.store.started(job, stage, StageKind.STAGE, job.attempt)

    async def _cancel_at_boundary(self, stage: str, row: StageRow | None) -> Outcome:
        ended = Ended(Ending.CANCELLED, stage, job_error=f"cancelled before stage {stage}")
        if self.done is None and not self.claim_started and row and row.status in OPEN:
            # Its row is open from before (snoozed, paused, or handed back running).
            return await self._close(ended)
        return self._hand_over(Outcome(OutcomeKind.CANCELLED, error=ended.job_error))

    def _hand_over(self, outcome: Outcome) -> Outcome:
        """Give the outcome the stage end it is written with: the stage just done, or the
        stage the claim started, cancelled before it ever ran."""
        if self.done is not None:
            outcome.stage_end = StageEnd(self.done.stage, StageStatus.COMPLETED, self.done.text)
        elif self.claim_started:
            first = self.pipeline.main_stages[0].name
            outcome.stage_end = StageEnd(first, StageStatus.CANCELLED)
        if outcome.stage_end is not None:  # reported once it is written
            end = outcome.stage_end
            outcome.events.append(self.ctx.event(end.stage, _REPORTED[end.status]))
        return outcome

    # -- cleanups ----------------------------------------------------------------------------

    async def _run_cleanups(
        self, attempt: int, ending: JobEnding, after: Outcome | None = None
    ) -> list[str]:
        """Run the cleanups owed by `attempt`, telling them `ending`; return their errors. A
        stage end the outcome `after` carries is recorded with the first one's start (before it
        runs), not left for the job's outcome."""
        ctx, cleanups = self.ctx, self.pipeline.cleanups
        end, reported = None, []
        if after is not None and cleanups:
            end, after.stage_end = after.stage_end, None
            reported, after.events = after.events, []
            if fails_for_good(self.job, after):
                await self.store.failed_for_good(self.job, after.error or "failed")
        errors = []
        # Cleanups are not bound by the job's timeout: they must run even after it passed.
        job_deadline, ctx.deadline = ctx.deadline, None
        ctx.ending = ending
        try:
            for i, stage in enumerate(cleanups):
                # From the first one's start, those not run yet are known (`waiting`).
                waiting = [c.name for c in cleanups[i + 1 :]] if i == 0 else []
                if not await self._start_cleanup(stage.name, attempt, waiting, end, after):
                    reported = []  # they reported the stage completed, which it is not
                end = None
                for event in reported:  # the stage end they report is written now
                    ctx.runtime.bus.publish(event)
                reported = []
                error = await self._run_cleanup(stage, attempt)
                if error is not None:
                    errors.append(error)
        finally:
            ctx.deadline = job_deadline
            ctx.ending = None
        return errors

    async def _start_cleanup(
        self,
        stage: str,
        attempt: int,
        waiting: Sequence[str],
        end: StageEnd | None,
        after: Outcome | None,
    ) -> bool:
        """Record the cleanup running, with the stage end `end` that came with `after`; False
        if that end was a completion whose output could not be stored (the job then fails)."""
        job, store = self.job, self.store
        if end is not None and end.status == StageStatus.COMPLETED:
            try:
                await store.advance(
                    job, end.stage, end.output, stage, StageKind.CLEANUP, attempt, waiting
                )
                return True
            except NotStorable as exc:  # past PostgreSQL's limits: the job fails
                assert after is not None  # `end` came with it
                failed = await self._close(Ended.not_storable(end.stage, exc))
                after.kind, after.error = OutcomeKind.FAILED, failed.error
                after.result = after.result_json = None
                await store.failed_for_good(job, after.error or "failed")
                await store.started(job, stage, StageKind.CLEANUP, attempt, waiting)
                return False
        if end is not None:
            await store.finished(job, end.stage, end.status)
        await store.started(job, stage, StageKind.CLEANUP, attempt, waiting)
        return True

    async def _run_cleanup(self, stage: Stage, attempt: int) -> str | None:
        """Run one cleanup and record how it ended; its error, if it failed."""
        ctx = self.ctx
        ctx.emit(stage.name, "started", {"attempt": attempt})
        ctx.step = stage.name
        try:
            output = await invoke(ctx, stage, 0.0)
            text = dumps(output)
        except Exception as exc:
            await self._close(Ended.failed(stage.name, exc))
            return f"{stage.name}: {short_error(exc)}"
        finally:
            ctx.step = ""
        try:
            await self.store.finished(self.job, stage.name, StageStatus.COMPLETED, output=text)
        except NotStorable as exc:
            return (await self._close(Ended.not_storable(stage.name, exc))).error
        ctx.emit(stage.name, "completed")
        return None
