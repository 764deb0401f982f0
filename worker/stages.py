"""Multi-stage jobs: a pipeline of named stages whose outputs are persisted per job.

A retry resumes after the last completed stage: completed stages are never run again, their
outputs are read back from `worker.job_stages` (written in the statement that marks the stage
completed). A stage is completed once that statement commits: with the next stage's start, the
first cleanup's start or, for the last stage, the job's outcome; a worker lost before then
leaves the stage to run again, as a plain task runs again when its worker is lost before its
outcome is written. Stages with the `ALL_DONE` rule are cleanups: they run after every attempt,
whether the other stages succeeded, raised or were cancelled, and see what those stored. When
a worker dies mid-attempt, the cleanup it owed runs when the job is next picked up, before the
next attempt (or before the job is marked failed or cancelled). Cleanups may therefore run
more than once for one attempt: write them to be idempotent (remove a file that may already
be gone, release a lock you may not hold).

    pipeline = Pipeline("export")

    @pipeline.stage
    def extract(ctx):
        return {"rows": 10}

    @pipeline.stage(deadline=60)
    def load(ctx):
        if not ready():
            ctx.snooze(1.0)         # give the slot back; run this stage again in 1 s
        return {"loaded": ctx.outputs["extract"]["rows"]}

    @pipeline.cleanup
    def remove_temp_files(ctx):
        ...

How an attempt can end, and what follows:

- every stage returned: the job is `completed`, its result the last stage's output;
- a stage raised: the job is retried from that stage (a `retry`), up to its retry limit;
- a stage ran past its `deadline`: the job is `failed` at once (`StageDeadlineExceeded`);
- a cancel was requested: the next stage does not start, the job ends `cancelled`;
- `ctx.snooze(s)`: the job waits `s` seconds as `pending`, holding no slot, not a retry;
- `ctx.pause(q)` / `PauseForResolution(q)`: the job is `paused` until `resume(id, answer)`.

Cleanups run after the first four, not after a snooze or a pause (the attempt goes on later).

What a pipeline does not do: stages run in order, one at a time (no fan-out); a stage that
raises is retried with its whole job, not on its own; a sync stage past its deadline cannot be
stopped, only told (`ctx.cancelled` turns true) while its thread keeps the job's slot.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import math
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Protocol, TypeVar, cast, overload

from worker.attempt import (
    JSON,
    ClaimedJob,
    Outcome,
    OutcomeKind,
    StageEnd,
    call,
    settled_before_start,
)
from worker.encoding import NotStorable, dumps
from worker.models import EventStatus, StageStatus
from worker.schema import MAX_TASK_NAME
from worker.tasks import Context, JobCancelled, PauseForResolution, Snooze, register

F = TypeVar("F", bound=Callable[..., Any])
log = logging.getLogger("worker.jobs")

# Stage rows still open: a stage that was running, snoozing or waiting for an answer.
_OPEN = ("running", "snoozed", "paused")
# Cleanup rows of an attempt that did not finish its cleanups: one ran, or had yet to run.
_UNFINISHED = ("running", "waiting")


class TriggerRule(StrEnum):
    """When a stage runs. `ALL_SUCCESS`: only if every earlier stage succeeded.
    `ALL_DONE`: after the other stages, whatever happened to them (a cleanup)."""

    ALL_SUCCESS = "all_success"
    ALL_DONE = "all_done"


ALL_DONE = TriggerRule.ALL_DONE
ALL_SUCCESS = TriggerRule.ALL_SUCCESS


@dataclass
class StageRow:
    """A stage's persisted state (`worker.job_stages`)."""

    stage: str
    kind: str
    status: str
    output: JSON
    error: str | None
    attempt: int


class StageStore(Protocol):
    """Where stage state lives; the daemon implements it on PostgreSQL."""

    async def load(self, job_id: str) -> list[StageRow]: ...

    # The writes take the claimed job: they apply only while its attempt still holds it.

    async def started(
        self, job: ClaimedJob, stage: str, kind: str, attempt: int, waiting: Sequence[str] = ()
    ) -> float:
        """Record the stage as running, and the cleanups `waiting` after it as waiting; return
        seconds since it first started (snoozes kept)."""

    async def finished(
        self,
        job: ClaimedJob,
        stage: str,
        status: str,
        output: JSON = None,
        error: str | None = None,
    ) -> None: ...

    async def advance(
        self,
        job: ClaimedJob,
        done: str,
        output: JSON,
        stage: str,
        kind: str,
        attempt: int,
        waiting: Sequence[str] = (),
    ) -> float:
        """Record `done` completed with `output` and `stage` running (and `waiting` as
        `started` does), in one committed write; return as `started` does. `NotStorable` if
        the database refuses `output`."""

    async def failed_for_good(self, job: ClaimedJob, error: str) -> None:
        """Record that this attempt failed for good, before its cleanups run: should they be
        cut off, the next claim fails the job with `error` (see `settled_before_start`)."""


class StageDeadlineExceeded(Exception):
    """A stage ran (or kept snoozing) past its own deadline; the job fails without a retry."""


@dataclass
class Stage:
    name: str
    fn: Callable[..., Any]
    rule: TriggerRule
    deadline: float | None
    is_async: bool


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


class Pipeline:
    """A task made of stages run in order. Registers itself under `name`.

    `result` picks the job's result from the stage outputs (a dict by stage name); by default
    it is the output of the last `ALL_SUCCESS` stage. `timeout` bounds each claim of the job
    (all its stages until it finishes, snoozes or pauses); cleanups are not bound by it.

    >>> export = Pipeline("export_report", result=lambda outputs: dict(outputs))
    >>> @export.stage
    ... def extract(ctx):
    ...     return {"rows": 3}
    >>> @export.cleanup
    ... def forget(ctx):
    ...     return "nothing to remove"
    >>> [(s.name, s.rule.value) for s in export.stages]
    [('extract', 'all_success'), ('forget', 'all_done')]
    """

    def __init__(
        self,
        name: str,
        *,
        timeout: float | None = None,
        result: Callable[[dict[str, JSON]], JSON] | None = None,
    ) -> None:
        if not isinstance(name, str) or not name:
            raise ValueError("a pipeline needs a name: the task name jobs are enqueued with")
        self.name = name
        self.timeout = timeout
        self.stages: list[Stage] = []
        self._result = result
        register(self)

    @overload
    def stage(self, fn: F, /) -> F: ...
    @overload
    def stage(
        self,
        fn: None = None,
        /,
        *,
        name: str | None = None,
        rule: TriggerRule = ALL_SUCCESS,
        deadline: float | None = None,
    ) -> Callable[[F], F]: ...

    def stage(
        self,
        fn: Callable[..., Any] | None = None,
        /,
        *,
        name: str | None = None,
        rule: TriggerRule = ALL_SUCCESS,
        deadline: float | None = None,
    ) -> Any:
        """Add a stage: a function (sync or `async`) taking a `Context`, returning a JSON value.

        The value is the stage's output, stored with the job and visible to later stages (and
        cleanups) as `ctx.outputs[name]`. `deadline`: seconds from the stage's first start,
        snoozes included, after which it gives up and the job fails with a clear error.

        >>> p = Pipeline("stage_doc_example")
        >>> @p.stage(name="wait_for_export", deadline=30)
        ... def wait(ctx):
        ...     return {"ready": True}
        >>> p.stages[0].deadline
        30
        """
        if deadline is not None and (
            isinstance(deadline, bool)
            or not isinstance(deadline, int | float)
            or not math.isfinite(deadline)
            or deadline <= 0
        ):
            raise ValueError(
                f"a stage deadline must be a positive number of seconds, not {deadline!r}"
            )

        def add(f: Callable[..., Any]) -> Callable[..., Any]:
            stage_name = name or f.__name__
            if not isinstance(stage_name, str) or not 1 <= len(stage_name) <= MAX_TASK_NAME:
                # Stage names are keys of an index, which refuses long ones on every write.
                raise ValueError(f"a stage name must be 1 to {MAX_TASK_NAME} characters")
            if any(s.name == stage_name for s in self.stages):
                raise ValueError(f"pipeline {self.name!r} already has a stage {stage_name!r}")
            self.stages.append(
                Stage(stage_name, f, TriggerRule(rule), deadline, inspect.iscoroutinefunction(f))
            )
            return f

        return add(fn) if fn is not None else add

    def cleanup(
        self, fn: F | None = None, /, *, name: str | None = None, deadline: float | None = None
    ) -> Any:
        """Add an `ALL_DONE` stage: it runs after every attempt, however it ended.

        It may run more than once for one attempt (after a lost worker): make it idempotent.

        >>> p = Pipeline("cleanup_doc_example")
        >>> @p.cleanup
        ... def remove_scratch_dir(ctx):
        ...     import shutil
        ...     shutil.rmtree("/tmp/scratch-" + ctx.job_id, ignore_errors=True)
        >>> p.cleanups[0].name
        'remove_scratch_dir'
        """
        add = self.stage(name=name, rule=ALL_DONE, deadline=deadline)
        return add(fn) if fn is not None else add

    @property
    def main_stages(self) -> Sequence[Stage]:
        return [s for s in self.stages if s.rule is ALL_SUCCESS]

    @property
    def cleanups(self) -> Sequence[Stage]:
        return [s for s in self.stages if s.rule is ALL_DONE]

    # -- running ----------------------------------------------------------------------------

    def _unclean_attempt(self, rows: dict[str, StageRow]) -> int | None:
        """The latest attempt whose stages ran but whose cleanups did not (all) run.

        `sql.CANCEL` computes the same thing in SQL; keep the two in step.
        """
        if not self.cleanups:
            return None
        cleaned = min(
            (r.attempt if (r := rows.get(c.name)) and r.status not in _UNFINISHED else 0)
            for c in self.cleanups
        )
        dirty = [r.attempt for r in rows.values() if r.kind == "stage" and r.attempt > cleaned]
        return max(dirty) if dirty else None

    async def execute(self, ctx: Context) -> Outcome:
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
        unclean = self._unclean_attempt(rows)

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
                errors = await self._run_cleanups(ctx, store, unclean)
                settled = self._with_cleanup_errors(settled, errors)
            return self._finish(ctx, settled)
        owed_errors: list[str] = []
        if unclean is not None and unclean < job.attempt:
            # The attempt that ran these stages is over (its worker was lost) and never
            # cleaned up after itself: do it now, before this attempt starts.
            owed_errors = await self._run_cleanups(ctx, store, unclean)

        # Begun by the claim, or by an earlier claim of this attempt (before a snooze, a pause
        # or a hand-back).
        began = job.first_stage_started or any(
            r.kind == "stage" and r.attempt == job.attempt for r in rows.values()
        )
        left = [s.name for s in self.main_stages if s.name not in ctx.outputs]
        if ctx.cancelled and left and not began:
            # An attempt cancelled before it began a stage has nothing to clean up: the one
            # before it cleaned up at its end, or as owed just now.
            cancelled = Outcome(OutcomeKind.CANCELLED, error=f"cancelled before stage {left[0]}")
            return self._finish(ctx, self._with_cleanup_errors(cancelled, owed_errors))
        if owed_errors:
            log.warning(
                "job %s: cleanup owed by attempt %d failed (%s); attempt %d goes on",
                job.id,
                unclean,
                "; ".join(owed_errors),
                job.attempt,
            )
        outcome = await self._run_stages(ctx, store, rows, began)
        if outcome.kind in ("snoozed", "paused"):
            return outcome  # the attempt goes on later; nothing to clean up yet
        errors = await self._run_cleanups(ctx, store, job.attempt, after=outcome)
        return self._finish(ctx, self._with_cleanup_errors(outcome, errors))

    @staticmethod
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
        self, ctx: Context, store: StageStore, rows: dict[str, StageRow], began: bool
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
                outcome.stage_end = StageEnd(self.main_stages[0].name, StageStatus.CANCELLED)
            if outcome.stage_end is not None:  # reported once it is written
                end = outcome.stage_end
                outcome.events.append(ctx.event(end.stage, cast(EventStatus, str(end.status))))
            return outcome

        async def cancelled_during(name: str) -> Outcome:
            await store.finished(job, name, "cancelled")
            error = f"cancelled during stage {name}"
            return Outcome(
                OutcomeKind.CANCELLED, error=error, events=[ctx.event(name, "cancelled")]
            )

        for stage in self.main_stages:
            row = rows.get(stage.name)
            if row is not None and row.status == "completed":
                last_output = row.output
                if not began:  # reported once per attempt, not on each return from a snooze
                    ctx.emit(stage.name, "skipped", {"reason": "completed in an earlier attempt"})
                continue
            if ctx.cancelled:  # the stage boundary: a cancel request stops the job here
                cancelled = Outcome(
                    OutcomeKind.CANCELLED, error=f"cancelled before stage {stage.name}"
                )
                if done is None and not claim_started_it and row and row.status in _OPEN:
                    # Its row is open from before (snoozed, paused, or handed back running).
                    await store.finished(job, stage.name, "cancelled")
                    cancelled.events.append(ctx.event(stage.name, "cancelled"))
                return hand_over(cancelled)
            if done is not None:
                try:
                    age = await store.advance(
                        job, done[0], done[1], stage.name, "stage", job.attempt
                    )
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
                output = await self._invoke(ctx, stage, age)
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
                return Outcome(
                    OutcomeKind.FAILED, error=await _unstorable(ctx, store, stage.name, exc)
                )
            done = (stage.name, text)
            ctx.outputs[stage.name] = last_output = output
        if self._result is None:  # the last stage's output, encoded already if it ran now
            ran_last = done is not None and done[0] == self.main_stages[-1].name
            encoded = done[1] if done is not None and ran_last else dumps(last_output)
            return hand_over(
                Outcome(OutcomeKind.COMPLETED, result=last_output, result_json=encoded)
            )
        # Whatever `result=` does, the last stage is recorded completed and reported.
        try:
            result = self._result(dict(ctx.outputs))
            encoded = dumps(result)
        except NotStorable as exc:
            error = f"pipeline {self.name}: its result= returned a value that {exc}"
            return hand_over(Outcome(OutcomeKind.FAILED, error=error))
        except Exception as exc:
            error = f"pipeline {self.name}: its result= raised {_short_error(exc)}\n"
            return hand_over(Outcome(OutcomeKind.RETRY, error=error + _traceback(exc)))
        return hand_over(Outcome(OutcomeKind.COMPLETED, result=result, result_json=encoded))

    async def _invoke(self, ctx: Context, stage: Stage, age: float) -> Any:
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
        self, ctx: Context, store: StageStore, attempt: int, after: Outcome | None = None
    ) -> list[str]:
        """Run the cleanups; a stage end the outcome `after` carries is recorded with the
        first one's start (before it runs), not left for the job's outcome."""
        errors = []
        end, reported = None, []
        if after is not None and self.cleanups:
            end, after.stage_end = after.stage_end, None
            reported, after.events = after.events, []
            if self._fails_for_good(ctx, after):
                await store.failed_for_good(ctx.job, after.error or "failed")
        # Cleanups are not bound by the job's timeout: they must run even after it passed.
        job_deadline, ctx.deadline = ctx.deadline, None
        try:
            for i, stage in enumerate(self.cleanups):
                # From the first one's start, those not run yet are known (`waiting`).
                waiting = [c.name for c in self.cleanups[i + 1 :]] if i == 0 else []
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
                    output = await self._invoke(ctx, stage, 0.0)
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

    @staticmethod
    def _fails_for_good(ctx: Context, outcome: Outcome) -> bool:
        return outcome.kind == "failed" or (
            outcome.kind == "retry" and ctx.job.retry_count >= ctx.job.max_retries
        )

    def _finish(self, ctx: Context, outcome: Outcome) -> Outcome:
        ends: dict[str, EventStatus] = {"completed": "completed", "cancelled": "cancelled"}
        final_status = ends.get(outcome.kind)
        if self._fails_for_good(ctx, outcome):
            final_status = "failed"
        if final_status is not None:
            message = {"error": outcome.error.splitlines()[0]} if outcome.error else None
            outcome.events.append(ctx.event("job", final_status, message))
        return outcome
