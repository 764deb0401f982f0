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
- `ctx.pause(q)` / `PauseForResolution(q)`: the job is `paused` until `resume(id, answer)`;
- `ctx.wait_for_children(output)`: the stage is completed with `output` and the job `held`,
  holding no slot, until the children it spawned (`ctx.spawn`) have ended.

Cleanups run after the first four, not after a snooze, a pause or a wait (the attempt goes on
later).

What a pipeline does not do: stages run in order, one at a time (fan out to jobs of their own
with `ctx.spawn_many`); a stage that
raises is retried with its whole job, not on its own; a sync stage past its deadline cannot be
stopped, only told (`ctx.cancelled` turns true) while its thread keeps the job's slot.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Sequence
from typing import Any, TypeVar, overload

from worker.models import JSON, Outcome
from worker.retries import Backoff, rules
from worker.schema import MAX_TASK_NAME
from worker.stages import runner
from worker.stages.stage import ALL_DONE, ALL_SUCCESS, Stage, TriggerRule
from worker.tasks import Context, register

F = TypeVar("F", bound=Callable[..., Any])


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
        max_retries: int | None = None,
        backoff: Backoff | None = None,
        give_up_on: type[BaseException] | tuple[type[BaseException], ...] = (),
    ) -> None:
        if not isinstance(name, str) or not name:
            raise ValueError("a pipeline needs a name: the task name jobs are enqueued with")
        self.name = name
        self.timeout = timeout
        # As a task's (`worker.retries`): a stage that fails retries the job from that stage.
        self.retries = rules(max_retries, backoff, give_up_on)
        self.concurrency: int | None = None  # a pipeline's jobs share no concurrency key
        self.stages: list[Stage] = []
        self.result = result
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
        """The `ALL_SUCCESS` stages, in the order they run."""
        return [s for s in self.stages if s.rule is ALL_SUCCESS]

    @property
    def cleanups(self) -> Sequence[Stage]:
        """The `ALL_DONE` stages, in the order they run after the others."""
        return [s for s in self.stages if s.rule is ALL_DONE]

    async def execute(self, ctx: Context) -> Outcome:
        """Run one attempt of this pipeline for the job `ctx` holds (see `worker.stages.runner`)."""
        return await runner.execute(self, ctx)
