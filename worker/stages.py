"""Multi-stage jobs: a pipeline of named stages whose outputs are persisted per job.

A retry resumes after the last completed stage: completed stages are never run again, their
outputs are read back from `worker.job_stages`. Stages with the `ALL_DONE` rule are cleanups:
they run after every attempt, whether the other stages succeeded, raised or were cancelled,
and see what those stored. When a worker dies mid-attempt, the cleanup it owed runs when the
job is next picked up, before the next attempt (or before the job is marked failed or
cancelled). Cleanups may therefore run more than once for one attempt: write them to be
idempotent (remove a file that may already be gone, release a lock you may not hold).

    pipeline = Pipeline("export")

    @pipeline.stage
    def extract(ctx):
        return {"rows": 10}

    @pipeline.stage
    def load(ctx):
        return {"loaded": ctx.outputs["extract"]["rows"]}

    @pipeline.cleanup
    def remove_temp_files(ctx):
        ...

What a pipeline does not do: stages run in order, one at a time (no fan-out), and a stage that
raises is retried with its whole job, not on its own.
"""

from __future__ import annotations

import inspect
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Protocol, TypeVar, overload
from uuid import UUID

from worker.tasks import (
    JSON,
    Context,
    JobCancelled,
    Outcome,
    PauseForResolution,
    Snooze,
    call,
    dumps,
    register,
    settled_before_start,
)

F = TypeVar("F", bound=Callable[..., Any])


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

    async def load(self, job_id: UUID) -> list[StageRow]: ...

    async def started(self, job_id: UUID, stage: str, kind: str, attempt: int) -> float:
        """Record the stage as running; return seconds since it first started (snoozes kept)."""

    async def finished(
        self, job_id: UUID, stage: str, status: str, output: JSON = None, error: str | None = None
    ) -> None: ...


class StageDeadlineExceeded(Exception):
    """A stage ran (or kept snoozing) past its own deadline."""


@dataclass
class Stage:
    name: str
    fn: Callable[..., Any]
    rule: TriggerRule
    deadline: float | None
    is_async: bool


def _short_error(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


class Pipeline:
    """A task made of stages run in order. Registers itself under `name`.

    `result` picks the job's result from the stage outputs; by default it is the output of the
    last `ALL_SUCCESS` stage.
    """

    def __init__(
        self,
        name: str,
        *,
        timeout: float | None = None,
        result: Callable[[dict[str, JSON]], JSON] | None = None,
    ) -> None:
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
        """Add a stage: a function taking a `Context` and returning a JSON value (its output).

        `deadline`: seconds from the stage's first start (snoozes included) after which it
        gives up with a clear error.
        """

        def add(f: Callable[..., Any]) -> Callable[..., Any]:
            stage_name = name or f.__name__
            if any(s.name == stage_name for s in self.stages):
                raise ValueError(f"pipeline {self.name!r} already has a stage {stage_name!r}")
            self.stages.append(
                Stage(stage_name, f, TriggerRule(rule), deadline, inspect.iscoroutinefunction(f))
            )
            return f

        return add(fn) if fn is not None else add

    def cleanup(self, fn: F | None = None, /, *, name: str | None = None) -> Any:
        """Add an `ALL_DONE` stage: it runs after every attempt, however it ended."""
        if fn is not None:
            return self.stage(fn, name=name, rule=ALL_DONE)
        return self.stage(name=name, rule=ALL_DONE)

    @property
    def main_stages(self) -> Sequence[Stage]:
        return [s for s in self.stages if s.rule is ALL_SUCCESS]

    @property
    def cleanups(self) -> Sequence[Stage]:
        return [s for s in self.stages if s.rule is ALL_DONE]

    # -- running ----------------------------------------------------------------------------

    def _unclean_attempt(self, rows: dict[str, StageRow]) -> int | None:
        """The latest attempt whose stages ran but whose cleanups did not (all) run."""
        if not self.cleanups:
            return None
        cleaned = min(
            (r.attempt if (r := rows.get(c.name)) and r.status != "running" else 0)
            for c in self.cleanups
        )
        dirty = [r.attempt for r in rows.values() if r.kind == "stage" and r.attempt > cleaned]
        return max(dirty) if dirty else None

    async def execute(self, ctx: Context) -> Outcome:
        store: StageStore = ctx.runtime.store  # type: ignore[attr-defined]
        job = ctx.job
        rows = {r.stage: r for r in await store.load(job.id)}
        ctx.outputs.update(
            {
                name: r.output
                for name, r in rows.items()
                if r.kind == "stage" and r.status == "completed"
            }
        )
        unclean = self._unclean_attempt(rows)
        interrupted = any(r.status == "running" for r in rows.values())

        settled = settled_before_start(job)
        if settled is not None:
            # Cancelled while pending or paused, or out of attempts after a lost worker: only
            # the cleanup the last attempt owes is left to do.
            if unclean is not None:
                await self._run_cleanups(ctx, store, unclean)
            return self._finish(ctx, settled)
        if interrupted and unclean is not None:
            # The worker that ran this attempt died (or stopped) mid-stage: clean up after it.
            await self._run_cleanups(ctx, store, unclean)

        outcome = await self._run_stages(ctx, store, rows)
        if outcome.kind in ("snoozed", "paused"):
            return outcome  # the attempt goes on later; nothing to clean up yet
        errors = await self._run_cleanups(ctx, store, job.attempt)
        if errors:
            note = "; ".join(errors)
            if outcome.kind == "completed":
                outcome = Outcome("retry", error=f"cleanup failed: {note}")
            else:
                outcome.error = f"{outcome.error}\n(cleanup also failed: {note})"
        return self._finish(ctx, outcome)

    async def _run_stages(
        self, ctx: Context, store: StageStore, rows: dict[str, StageRow]
    ) -> Outcome:
        job = ctx.job
        last_output: JSON = None
        for stage in self.main_stages:
            row = rows.get(stage.name)
            if row is not None and row.status == "completed":
                last_output = row.output
                ctx.emit(stage.name, "skipped", {"reason": "completed in an earlier attempt"})
                continue
            if ctx.cancelled:
                return Outcome("cancelled", error="cancelled")
            age = await store.started(job.id, stage.name, "stage", job.attempt)
            ctx.emit(stage.name, "started", {"attempt": job.attempt})
            ctx.step = stage.name
            try:
                if stage.deadline is not None and age > stage.deadline:
                    raise StageDeadlineExceeded(
                        f"stage {stage.name} gave up: still not done {age:.1f} s after it "
                        f"first started (deadline {stage.deadline} s)"
                    )
                output = await call(ctx, stage.fn, stage.is_async, ctx)
                text = dumps(output)
            except Snooze as snooze:
                await store.finished(job.id, stage.name, "snoozed")
                return Outcome("snoozed", delay=snooze.seconds)
            except PauseForResolution as pause:
                await store.finished(job.id, stage.name, "paused")
                ctx.emit(stage.name, "paused", {"question": pause.question})
                return Outcome("paused", result=pause.question)
            except JobCancelled:
                await store.finished(job.id, stage.name, "cancelled")
                ctx.emit(stage.name, "cancelled")
                return Outcome("cancelled", error="cancelled")
            except Exception as exc:
                await store.finished(
                    job.id, stage.name, "failed", error=traceback.format_exc(limit=20)
                )
                ctx.emit(stage.name, "failed", {"error": _short_error(exc)})
                return Outcome(
                    "retry",
                    error=f"stage {stage.name} failed: {_short_error(exc)}\n"
                    + traceback.format_exc(limit=20),
                )
            finally:
                ctx.step = ""
            await store.finished(job.id, stage.name, "completed", output=text)
            ctx.emit(stage.name, "completed")
            ctx.outputs[stage.name] = last_output = output
        result = self._result(ctx.outputs) if self._result else last_output
        return Outcome("completed", result=result)

    async def _run_cleanups(self, ctx: Context, store: StageStore, attempt: int) -> list[str]:
        errors = []
        for stage in self.cleanups:
            await store.started(ctx.job.id, stage.name, "cleanup", attempt)
            ctx.emit(stage.name, "started", {"attempt": attempt})
            ctx.step = stage.name
            try:
                output = await call(ctx, stage.fn, stage.is_async, ctx)
                text = dumps(output)
            except Exception as exc:
                errors.append(f"{stage.name}: {_short_error(exc)}")
                await store.finished(
                    ctx.job.id, stage.name, "failed", error=traceback.format_exc(limit=20)
                )
                ctx.emit(stage.name, "failed", {"error": _short_error(exc)})
                continue
            finally:
                ctx.step = ""
            await store.finished(ctx.job.id, stage.name, "completed", output=text)
            ctx.emit(stage.name, "completed")
        return errors

    def _finish(self, ctx: Context, outcome: Outcome) -> Outcome:
        final_status = {"completed": "completed", "cancelled": "cancelled"}.get(outcome.kind)
        if outcome.kind == "failed" or (
            outcome.kind == "retry" and ctx.job.retry_count >= ctx.job.max_retries
        ):
            final_status = "failed"
        if final_status is not None:
            message = {"error": outcome.error.splitlines()[0]} if outcome.error else None
            ctx.emit("job", final_status, message)
        return outcome
