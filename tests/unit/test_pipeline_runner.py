"""The pipeline runner's guarantees, attempt by attempt, against the in-memory stage store.

No database and no processes: each test plays the daemon's part (claims, retries, a lost
worker) by building the `ClaimedJob` of each attempt, and runs `Pipeline.execute` through
`worker.stages.run_attempt`, which writes the outcome's stage end as the outcome write does.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
from typing import Any

import pytest
from support.owed import OWED_CLEANUP_CASES

from worker.encoding import NotStorable
from worker.models import ClaimedJob, Outcome, OutcomeKind, StageStatus
from worker.stages import MemoryRuntime, MemoryStageStore, Pipeline, run_attempt
from worker.stages.endings import ENDINGS, Ended, Ending, StageDeadlineExceeded
from worker.tasks import JobCancelled, PauseForResolution, Snooze, WaitForChildren

_names = itertools.count()


class Clock:
    """A clock the test moves: stage deadlines count from a stage's first start."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Job:
    """One job of a pipeline, claimed attempt after attempt as the daemon would claim it."""

    def __init__(self, pipeline: Pipeline, max_retries: int = 3) -> None:
        self.pipeline = pipeline
        self.clock = Clock()
        self.store = MemoryStageStore(clock=self.clock)
        self.runtime = MemoryRuntime(self.store)
        self.id = f"job-{next(_names)}"
        self.retry_count = 0
        self.max_retries = max_retries
        self.last_error: str | None = None

    def claim(self, *, cancel_requested: bool = False, answer: Any = None) -> ClaimedJob:
        """The next claim of the job; its first claim starts the first stage, as `sql.CLAIM`."""
        first = (
            not self.store.rows(self.id)
            and not cancel_requested
            and self.retry_count <= self.max_retries
        )
        job = ClaimedJob(
            id=self.id,
            task=self.pipeline.name,
            payload={},
            queue="default",
            priority=0,
            retry_count=self.retry_count,
            max_retries=self.max_retries,
            cancel_requested=cancel_requested,
            answer=answer,
            last_error=self.last_error,
            final_error=self.store.final_errors.get(self.id),
            first_stage_started=first,
        )
        if first:
            self.store.claim_started(job, self.pipeline.main_stages[0].name)
        return job

    def run(self, job: ClaimedJob | None = None, cancel: threading.Event | None = None) -> Outcome:
        """Run an attempt; a retry outcome counts a retry, as the outcome write does."""
        job = job or self.claim()
        outcome = asyncio.run(run_attempt(self.pipeline, job, self.runtime, cancel))
        if outcome.kind == OutcomeKind.RETRY:
            self.retry_count += 1
            self.last_error = outcome.error
        return outcome

    def lose_worker(self) -> None:
        """The worker holding the job was lost: the rescue counts an attempt."""
        self.retry_count += 1

    def statuses(self) -> dict[str, str]:
        return {name: str(row.status) for name, row in self.store.rows(self.id).items()}

    def events(self) -> list[tuple[str, str]]:
        history = asyncio.run(self.runtime.bus.history(self.id))
        return [(e.step, e.status) for e in history]


def pipeline(
    ran: list[str], *, fail: dict[str, int] | None = None, cleanup: bool = True
) -> Pipeline:
    """Stages `a`, `b`, `c` returning `{"n": 1..3}` and a cleanup `tidy`; each appends its name
    to `ran` when it really runs. `fail[name]`: how many of its runs raise first."""
    failures = dict(fail or {})
    p = Pipeline(f"unit_pipeline_{next(_names)}")
    for n, name in enumerate(("a", "b", "c"), start=1):

        def run(ctx: Any, name: str = name, n: int = n) -> dict[str, int]:
            ran.append(name)
            if failures.get(name, 0) > 0:
                failures[name] -= 1
                raise RuntimeError(f"{name} broke")
            return {"n": n, "seen": sorted(ctx.outputs)}

        p.stage(name=name)(run)
    if cleanup:

        @p.cleanup
        def tidy(ctx: Any) -> str:
            ran.append("tidy")
            return "tidied"

    return p


# -- how a stage's end maps to its row, its event and the attempt's outcome ---------------


def test_every_way_a_stage_can_end_but_completing_has_one_rule():
    # A wait for children is a completion too, written with the job's outcome.
    assert set(ENDINGS) == set(Ending) - {Ending.COMPLETED, Ending.WAITING}


def test_a_cancel_requested_during_a_snooze_or_a_pause_ends_the_stage_cancelled():
    waits = WaitForChildren({"parts": 2})
    for raised in (Snooze(1.0), PauseForResolution("ok?"), JobCancelled("stop"), waits):
        assert Ended.raised("load", raised, cancelled=True).how is Ending.CANCELLED
    assert Ended.raised("load", Snooze(1.0), cancelled=False).how is Ending.SNOOZED
    assert Ended.raised("load", PauseForResolution("ok?"), cancelled=False).how is Ending.PAUSED


def test_a_stage_past_its_deadline_fails_for_good_and_any_other_error_is_retried():
    deadline = Ended.raised("load", StageDeadlineExceeded("gave up"), cancelled=False)
    assert ENDINGS[deadline.how].outcome is OutcomeKind.FAILED
    other = Ended.raised("load", ValueError("bad row"), cancelled=False)
    assert ENDINGS[other.how].outcome is OutcomeKind.RETRY
    assert other.stored_error is not None
    assert other.stored_error.startswith("stage load failed: ValueError: bad row")
    assert other.message == {"error": "ValueError: bad row"}


# -- attempts ---------------------------------------------------------------------------


def test_a_completed_pipeline_stores_every_output_and_returns_the_last():
    ran: list[str] = []
    job = Job(pipeline(ran))
    outcome = job.run()
    assert outcome.kind is OutcomeKind.COMPLETED
    assert outcome.result == {"n": 3, "seen": ["a", "b"]}
    assert ran == ["a", "b", "c", "tidy"]
    rows = job.store.rows(job.id)
    assert {name: (str(r.kind), str(r.status)) for name, r in rows.items()} == {
        "a": ("stage", "completed"),
        "b": ("stage", "completed"),
        "c": ("stage", "completed"),
        "tidy": ("cleanup", "completed"),
    }
    assert rows["b"].output == {"n": 2, "seen": ["a"]}
    assert job.events()[-1] == ("job", "completed")


def test_a_completed_stage_is_never_run_again_on_retry():
    ran: list[str] = []
    job = Job(pipeline(ran, fail={"b": 1}))
    first = job.run()
    assert first.kind is OutcomeKind.RETRY
    assert first.error is not None and first.error.startswith("stage b failed: RuntimeError")
    second = job.run()
    assert second.kind is OutcomeKind.COMPLETED
    assert ran == ["a", "b", "tidy", "b", "c", "tidy"]
    rows = job.store.rows(job.id)
    assert (rows["a"].attempt, rows["b"].attempt, rows["c"].attempt) == (1, 2, 2)
    assert ("a", "skipped") in job.events()


def test_an_all_done_cleanup_runs_after_a_failed_stage():
    ran: list[str] = []
    job = Job(pipeline(ran, fail={"a": 1}))
    outcome = job.run()
    assert outcome.kind is OutcomeKind.RETRY
    assert ran == ["a", "tidy"]
    assert job.statuses() == {"a": "failed", "tidy": "completed"}
    error = job.store.rows(job.id)["a"].error
    assert error is not None and "RuntimeError: a broke" in error and "Traceback" in error


def test_a_cancel_between_stages_runs_the_cleanup_and_ends_cancelled():
    ran: list[str] = []
    p = pipeline(ran)
    cancel = threading.Event()
    real_a = p.main_stages[0].fn

    def a(ctx: Any) -> Any:
        cancel.set()  # a cancel request arrives while `a` runs; `a` still completes
        return real_a(ctx)

    p.main_stages[0].fn = a
    job = Job(p)
    outcome = job.run(cancel=cancel)
    assert outcome.kind is OutcomeKind.CANCELLED
    assert outcome.error == "cancelled before stage b"
    assert ran == ["a", "tidy"]
    assert job.statuses() == {"a": "completed", "tidy": "completed"}
    assert job.events()[-1] == ("job", "cancelled")


def test_a_cancel_raised_inside_a_stage_closes_it_cancelled_and_runs_the_cleanup():
    ran: list[str] = []
    p = pipeline(ran)

    def b(ctx: Any) -> None:
        ctx.cancel_event.set()  # a cancel request arrives while `b` runs
        ctx.raise_if_cancelled()

    p.main_stages[1].fn = b
    job = Job(p)
    outcome = job.run()
    assert outcome.kind is OutcomeKind.CANCELLED
    assert outcome.error == "cancelled during stage b"
    assert job.statuses() == {"a": "completed", "b": "cancelled", "tidy": "completed"}
    assert ran == ["a", "tidy"]


def test_a_cancel_before_the_stage_the_claim_started_closes_it_cancelled():
    ran: list[str] = []
    job = Job(pipeline(ran))
    cancel = threading.Event()
    cancel.set()
    outcome = job.run(cancel=cancel)
    assert outcome.kind is OutcomeKind.CANCELLED
    assert job.statuses()["a"] == "cancelled"
    assert "a" not in ran


def test_a_snoozed_stage_keeps_its_first_start():
    ran: list[str] = []
    p = Pipeline(f"unit_snoozer_{next(_names)}")

    @p.stage(deadline=10)
    def wait(ctx: Any) -> str:
        ran.append("wait")
        ctx.snooze(1.0)
        return "never"

    @p.cleanup
    def tidy(ctx: Any) -> None:
        ran.append("tidy")

    job = Job(p)
    first = job.run()
    assert (first.kind, first.delay) == (OutcomeKind.SNOOZED, 1.0)
    assert job.statuses() == {"wait": "snoozed"}
    job.clock.now += 6
    assert job.run().kind is OutcomeKind.SNOOZED
    job.clock.now += 6  # 12 s after the first start, past the stage's 10 s deadline
    last = job.run()
    assert last.kind is OutcomeKind.FAILED
    assert last.error is not None and "not done 12.0 s after it first started" in last.error
    assert ran == ["wait", "wait", "tidy"]
    assert [s for s, status in job.events() if status == "started"] == ["wait", "tidy"]


def test_a_stage_that_waits_for_its_children_is_completed_and_the_next_runs_after():
    ran: list[str] = []
    p = Pipeline(f"unit_waiter_{next(_names)}")

    @p.stage
    def split(ctx: Any) -> None:
        ran.append("split")
        ctx.wait_for_children({"parts": 2})

    @p.stage
    def gather(ctx: Any) -> Any:
        ran.append("gather")
        return ctx.outputs["split"]

    @p.cleanup
    def tidy(ctx: Any) -> None:
        ran.append("tidy")

    job = Job(p)
    waiting = job.run()
    assert waiting.kind is OutcomeKind.WAITING
    # The stage's completion is written with the outcome, which also reports it.
    assert job.statuses() == {"split": "completed"}
    assert job.events()[-1] == ("split", "completed")
    assert ran == ["split"]  # no cleanup: the attempt goes on once the children have ended
    done = job.run()
    assert (done.kind, done.result) == (OutcomeKind.COMPLETED, {"parts": 2})
    assert ran == ["split", "gather", "tidy"]


def test_a_snooze_or_a_pause_runs_no_cleanup_until_the_attempt_ends():
    ran: list[str] = []
    p = Pipeline(f"unit_pauser_{next(_names)}")

    @p.stage
    def ask(ctx: Any) -> Any:
        ran.append("ask")
        if ctx.answer is None:
            ctx.pause({"question": "ship it?"})
        return ctx.answer

    @p.cleanup
    def tidy(ctx: Any) -> None:
        ran.append("tidy")

    job = Job(p)
    paused = job.run()
    assert (paused.kind, paused.result) == (OutcomeKind.PAUSED, {"question": "ship it?"})
    assert ran == ["ask"]
    assert job.events()[-1] == ("ask", "paused")  # published once the outcome is written
    resumed = job.run(job.claim(answer="yes"))
    assert (resumed.kind, resumed.result) == (OutcomeKind.COMPLETED, "yes")
    assert ran == ["ask", "ask", "tidy"]


def test_a_cancel_of_a_paused_job_closes_its_stage_and_runs_the_cleanup():
    ran: list[str] = []
    p = Pipeline(f"unit_paused_cancel_{next(_names)}")
    p.stage(name="ask")(lambda ctx: ran.append("ask") or ctx.pause("ok?"))
    p.cleanup(name="tidy")(lambda ctx: ran.append("tidy"))
    job = Job(p)
    assert job.run().kind is OutcomeKind.PAUSED
    outcome = job.run(job.claim(cancel_requested=True))
    assert outcome.kind is OutcomeKind.CANCELLED
    assert job.statuses() == {"ask": "cancelled", "tidy": "completed"}
    assert ran == ["ask", "tidy"]


def test_the_cleanup_a_lost_worker_owed_runs_before_the_next_attempt():
    ran: list[str] = []
    job = Job(pipeline(ran))
    job.claim()  # the claim started `a`; its worker is lost before `a` ends
    job.lose_worker()
    outcome = job.run()
    assert outcome.kind is OutcomeKind.COMPLETED
    assert ran == ["tidy", "a", "b", "c", "tidy"]
    failed = [(s, st) for s, st in job.events() if st == "failed"]
    assert failed == [("a", "failed")]  # reported as interrupted, then run again


def test_out_of_attempts_after_a_lost_worker_runs_the_owed_cleanup_and_fails():
    ran: list[str] = []
    job = Job(pipeline(ran), max_retries=0)
    job.claim()
    job.lose_worker()
    outcome = job.run()
    assert outcome.kind is OutcomeKind.FAILED
    assert outcome.error == "out of attempts: the worker running attempt 1 was lost in a"
    assert ran == ["tidy"]
    assert job.statuses() == {"a": "failed", "tidy": "completed"}
    assert job.events()[-1] == ("job", "failed")


def test_a_stage_past_its_deadline_fails_the_job_without_a_retry():
    p = Pipeline(f"unit_slow_{next(_names)}")

    @p.stage(deadline=0.05)
    async def slow(ctx: Any) -> None:
        await asyncio.sleep(5)

    job = Job(p)
    outcome = job.run()
    assert outcome.kind is OutcomeKind.FAILED
    assert outcome.error is not None
    assert outcome.error.startswith("stage slow failed: StageDeadlineExceeded")
    assert job.statuses() == {"slow": "failed"}


def test_an_output_that_cannot_be_stored_fails_the_job_and_still_cleans_up():
    ran: list[str] = []
    p = pipeline(ran)
    p.main_stages[1].fn = lambda ctx: object()
    job = Job(p)
    outcome = job.run()
    assert outcome.kind is OutcomeKind.FAILED
    assert outcome.error is not None and outcome.error.startswith("stage b returned a value that")
    assert job.statuses() == {"a": "completed", "b": "failed", "tidy": "completed"}
    assert ran == ["a", "tidy"]


def test_a_failed_cleanup_retries_the_cleanup_alone():
    ran: list[str] = []
    p = pipeline(ran, cleanup=False)
    failures = [1]

    @p.cleanup
    def tidy(ctx: Any) -> None:
        ran.append("tidy")
        if failures.pop() if failures else 0:
            raise OSError("disk busy")

    job = Job(p)
    first = job.run()
    assert first.kind is OutcomeKind.RETRY
    assert first.error == "cleanup failed: tidy: OSError: disk busy"
    assert job.run().kind is OutcomeKind.COMPLETED
    assert ran == ["a", "b", "c", "tidy", "tidy"]


def test_the_last_stage_is_recorded_completed_with_the_outcome_not_before():
    ran: list[str] = []
    job = Job(pipeline(ran, cleanup=False))
    claimed = job.claim()
    outcome = asyncio.run(job.pipeline.execute(_context(job, claimed)))
    assert outcome.stage_end is not None
    assert (outcome.stage_end.stage, outcome.stage_end.status) == ("c", StageStatus.COMPLETED)
    assert job.statuses()["c"] == "running"  # until the outcome is written
    assert ("c", "completed") not in job.events()
    job.store.record_outcome(claimed, outcome)
    assert job.statuses()["c"] == "completed"


def test_a_result_function_picks_the_job_result_from_all_outputs():
    p = Pipeline(f"unit_result_{next(_names)}", result=lambda outputs: sorted(outputs))
    p.stage(name="x")(lambda ctx: 1)
    p.stage(name="y")(lambda ctx: 2)
    outcome = Job(p).run()
    assert (outcome.kind, outcome.result) == (OutcomeKind.COMPLETED, ["x", "y"])


def _context(job: Job, claimed: ClaimedJob) -> Any:
    from worker.tasks import Context

    return Context(claimed, job.runtime, threading.Event())


@pytest.mark.parametrize(
    ("history", "owed"),
    [pytest.param(rows, owed, id=name) for name, rows, owed in OWED_CLEANUP_CASES],
)
def test_a_cleanup_left_waiting_or_running_by_a_lost_worker_is_still_owed(history, owed):
    store = MemoryStageStore()
    for stage, kind, status, attempt in history:
        store.start_stage("job", stage, kind, attempt, ())
        if status != "running":
            store.end_stage("job", stage, status, "null", None)
    assert asyncio.run(store.load("job")).owed_cleanup == owed


class RefusingStore(MemoryStageStore):
    """Refuses to store an output holding "huge", as PostgreSQL refuses one past its limits."""

    async def advance(self, job: ClaimedJob, done: str, output: Any, *args: Any) -> float:
        if output is not None and "huge" in output:
            raise NotStorable("PostgreSQL refused to store (string too long)")
        return await super().advance(job, done, output, *args)


def refusing(job: Job) -> Job:
    job.store = RefusingStore(clock=job.clock)
    job.runtime = MemoryRuntime(job.store)
    return job


def test_a_stage_output_the_store_refuses_fails_the_job_without_running_the_next_stage():
    ran: list[str] = []
    p = pipeline(ran)
    p.main_stages[0].fn = lambda ctx: ran.append("a") or "huge"
    job = refusing(Job(p))
    outcome = job.run()
    assert outcome.kind is OutcomeKind.FAILED
    assert (
        outcome.error
        == "stage a returned a value that PostgreSQL refused to store (string too long)"
    )
    assert ran == ["a", "tidy"]
    assert job.statuses() == {"a": "failed", "tidy": "completed"}


def test_a_last_stage_output_the_store_refuses_fails_the_job_and_the_cleanup_runs_once():
    ran: list[str] = []
    p = pipeline(ran)
    p.main_stages[2].fn = lambda ctx: ran.append("c") or "huge"
    job = refusing(Job(p))
    outcome = job.run()
    assert outcome.kind is OutcomeKind.FAILED
    assert (outcome.result, outcome.result_json, outcome.stage_end) == (None, None, None)
    assert ran == ["a", "b", "c", "tidy"]
    assert job.statuses() == {
        "a": "completed",
        "b": "completed",
        "c": "failed",
        "tidy": "completed",
    }
    # Recorded before the cleanup ran: were it cut off, the next claim fails the job.
    assert job.store.final_errors[job.id] == outcome.error
    assert ("c", "completed") not in job.events()
    assert job.events()[-1] == ("job", "failed")
