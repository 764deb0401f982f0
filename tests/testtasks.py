"""Tasks the test suite runs in real worker processes.

Side effects go to the `effects` table of the job's own database (created with every test
database, see conftest.py), so a test can count how many times each job really ran, across
processes and crashes.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from support.recording import task_connection

from worker import Backoff, PauseForResolution, Pipeline, task


def record(job: str, kind: str) -> None:
    task_connection().execute("INSERT INTO effects (job, kind) VALUES (%s, %s)", (job, kind))


@task
def add(payload: dict[str, Any]) -> int:
    return int(payload["a"]) + int(payload["b"])


@task
async def async_double(payload: dict[str, Any]) -> int:
    return int(payload["n"]) * 2


@task
def effect(payload: dict[str, Any]) -> str:
    """Records that it ran, optionally sleeping first (to be caught mid-job)."""
    time.sleep(float(payload.get("sleep", 0)))
    record(str(payload["key"]), "effect")
    return "done"


@task
def always_fails(payload: dict[str, Any]) -> None:
    record(str(payload.get("key", "fail")), "attempt")
    raise RuntimeError("this task always fails")


@task
def fails_then_succeeds(payload: dict[str, Any], ctx: Any) -> str:
    record(str(payload["key"]), "attempt")
    if ctx.attempt <= int(payload.get("failures", 1)):
        raise RuntimeError(f"failing attempt {ctx.attempt} on purpose")
    return f"succeeded on attempt {ctx.attempt}"


@task
async def awaits_a_cancelled_future(payload: dict[str, Any]) -> None:
    future = asyncio.get_running_loop().create_future()
    future.cancel()
    await future  # raises CancelledError, though nothing cancelled this job


@task
def not_json(payload: dict[str, Any]) -> object:
    return {"when": object()}


@task
def ask(payload: dict[str, Any], ctx: Any) -> Any:
    if ctx.answer is None:
        raise PauseForResolution({"question": payload.get("question", "go on?")})
    return {"answer": ctx.answer}


# A three-stage pipeline with a cleanup; every stage run leaves an effect row.
counted = Pipeline("counted")


@counted.stage
def first(ctx: Any) -> dict[str, int]:
    record(ctx.job_id, "first")
    return {"n": 1}


@counted.stage
def second(ctx: Any) -> dict[str, int]:
    record(ctx.job_id, "second")
    if ctx.payload.get("fail_second_until", 0) >= ctx.attempt:
        raise RuntimeError("second stage fails on purpose")
    time.sleep(float(ctx.payload.get("second_sleep", 0)))
    return {"n": ctx.outputs["first"]["n"] + 1}


@counted.stage
def third(ctx: Any) -> dict[str, int]:
    record(ctx.job_id, "third")
    return {"n": ctx.outputs["second"]["n"] + 1}


@counted.cleanup
def tidy(ctx: Any) -> str:
    record(ctx.job_id, "cleanup")
    time.sleep(float(ctx.payload.get("cleanup_sleep", 0)))
    if ctx.payload.get("cleanup_fails"):
        raise OSError("the cleanup could not tidy")
    return "tidied"


# Async stages that return without awaiting: the job reaches its next stage write in the same
# turn of the event loop in which its previous one was answered.
hasty = Pipeline("hasty")


@hasty.stage
async def one(ctx: Any) -> int:
    return 1


@hasty.stage
async def two(ctx: Any) -> int:
    return int(ctx.outputs["one"]) + 1


@hasty.stage
async def three(ctx: Any) -> int:
    return int(ctx.outputs["two"]) + 1


# A pipeline shaped like the async job watcher, reporting its progress as it polls: `ticks`
# polls of `tick` seconds each, every one a progress event with the percent and rows so far.
watched = Pipeline("watched_export")


@watched.stage
def spawn(ctx: Any) -> dict[str, int]:
    return {"ticks": int(ctx.payload.get("ticks", 5))}


@watched.stage
def poll(ctx: Any) -> dict[str, int]:
    ticks = ctx.outputs["spawn"]["ticks"]
    for i in range(1, ticks + 1):
        ctx.raise_if_cancelled()
        time.sleep(float(ctx.payload.get("tick", 0.2)))
        ctx.progress(round(100 * i / ticks), rows=10 * i)
    return {"rows": 10 * ticks}


@watched.stage
def verify(ctx: Any) -> dict[str, Any]:
    return {"verified": True, "rows": ctx.outputs["poll"]["rows"]}


@watched.cleanup
def remove_status_file(ctx: Any) -> str:
    return "removed"


@task
def counts_up(payload: dict[str, Any], ctx: Any) -> int:
    """A plain task (no stages) reporting `n` progress events."""
    n = int(payload.get("n", 3))
    for i in range(1, n + 1):
        time.sleep(float(payload.get("tick", 0.05)))
        ctx.progress(100 * i / n, i=i)
    return n


@task
def messy_progress(payload: dict[str, Any], ctx: Any) -> str:
    """Reports messages JSON cannot hold as such; the job must still complete."""
    ctx.progress(50, thing=object(), ratio=float("nan"), text="nul\x00char")
    ctx.progress(100, step_done=True)
    return "ok"


# -- stage runner guarantees (tests/test_stages.py) ------------------------------------------


def effects_of(job: str, kind: str) -> int:
    cur = task_connection().execute(
        "SELECT count(*) FROM effects WHERE job = %s AND kind = %s", (job, kind)
    )
    row = cur.fetchone()
    return int(row[0]) if row else 0


# Pauses for a human in its middle stage; every stage run leaves an effect row.
approval = Pipeline("approval")


@approval.stage(name="prepare")
def approval_prepare(ctx: Any) -> dict[str, int]:
    record(ctx.job_id, "prepare")
    return {"amount": int(ctx.payload.get("amount", 10))}


@approval.stage(name="approve")
def approval_approve(ctx: Any) -> dict[str, Any]:
    record(ctx.job_id, "approve")
    if ctx.answer is None:
        ctx.pause({"question": f"pay {ctx.outputs['prepare']['amount']}?"})
    return {"answer": ctx.answer}


@approval.stage(name="pay")
def approval_pay(ctx: Any) -> dict[str, Any]:
    record(ctx.job_id, "pay")
    return {"paid": ctx.outputs["prepare"]["amount"], "answer": ctx.outputs["approve"]["answer"]}


@approval.cleanup(name="release")
def approval_release(ctx: Any) -> str:
    record(ctx.job_id, "cleanup")
    return "released"


# Polls `polls` times, snoozing `every` seconds in between (never sleeping in its slot).
snoozer = Pipeline("snoozer")


@snoozer.stage(name="wait_until_ready")
def snoozer_wait(ctx: Any) -> dict[str, int]:
    record(ctx.job_id, "poll")
    polls = effects_of(ctx.job_id, "poll")
    if polls < int(ctx.payload.get("polls", 3)):
        ctx.snooze(float(ctx.payload.get("every", 0.5)))
    return {"polls": polls}


@snoozer.cleanup(name="snoozer_cleanup")
def snoozer_cleanup(ctx: Any) -> str:
    record(ctx.job_id, "cleanup")
    return "done"


# Its second stage fails once, then polls as `snoozer` does, in the job's second attempt.
retried_poller = Pipeline("retried_poller")


@retried_poller.stage(name="fetch")
def retried_poller_fetch(ctx: Any) -> str:
    record(ctx.job_id, "fetch")
    return "fetched"


@retried_poller.stage(name="poll")
def retried_poller_poll(ctx: Any) -> int:
    record(ctx.job_id, "poll")
    if ctx.attempt == 1:
        raise RuntimeError("not yet")
    polls = effects_of(ctx.job_id, "poll") - 1
    if polls < 3:
        ctx.snooze(0.2)
    return polls


# A stage with a 1 s deadline that is never done: it snoozes, or it sleeps, forever.
deadlined = Pipeline("deadlined")


@deadlined.stage(name="never_ready", deadline=1.0)
async def deadlined_never_ready(ctx: Any) -> None:
    import asyncio

    record(ctx.job_id, "try")
    if ctx.payload.get("mode") == "sleep":
        await asyncio.sleep(60)
    ctx.snooze(0.2)


@deadlined.cleanup(name="deadlined_cleanup")
def deadlined_cleanup(ctx: Any) -> str:
    record(ctx.job_id, "cleanup")
    time.sleep(float(ctx.payload.get("cleanup_sleep", 0)))
    return "done"


# Its stage fails (or not, with `stage_ok`); its cleanup always fails.
bad_cleanup = Pipeline("bad_cleanup")


@bad_cleanup.stage(name="work")
def bad_cleanup_work(ctx: Any) -> str:
    record(ctx.job_id, "work")
    if not ctx.payload.get("stage_ok"):
        raise ValueError("the original problem")
    return "worked"


@bad_cleanup.cleanup(name="broken_cleanup")
def bad_cleanup_broken(ctx: Any) -> None:
    record(ctx.job_id, "cleanup")
    raise OSError("the cleanup's own problem")


# A long stage that watches `ctx.cancelled` and stops as soon as it turns true.
patient = Pipeline("patient")


@patient.stage(name="long_wait")
def patient_long_wait(ctx: Any) -> str:
    record(ctx.job_id, "long_wait")
    deadline = time.monotonic() + float(ctx.payload.get("seconds", 30))
    while time.monotonic() < deadline:
        if ctx.cancelled:
            record(ctx.job_id, "saw_cancel")
            ctx.raise_if_cancelled()
        time.sleep(0.01)
    return "waited"


@patient.stage(name="after_wait")
def patient_after_wait(ctx: Any) -> str:
    record(ctx.job_id, "after_wait")
    return "after"


@patient.cleanup(name="patient_cleanup")
def patient_cleanup(ctx: Any) -> str:
    record(ctx.job_id, "cleanup")
    return "done"


# Waits for a cancel request, then snoozes for a minute or pauses, as `then` says.
late = Pipeline("late_cancel")


@late.stage(name="wait_then_wait_more")
def late_wait(ctx: Any) -> None:
    deadline = time.monotonic() + 30
    while not ctx.cancelled and time.monotonic() < deadline:
        time.sleep(0.01)
    record(ctx.job_id, "saw_cancel")
    if ctx.payload.get("then") == "pause":
        ctx.pause({"question": "asked after the cancel"})
    ctx.snooze(60)


@late.cleanup(name="late_cleanup")
def late_cleanup(ctx: Any) -> str:
    record(ctx.job_id, "cleanup")
    return "done"


# A cancel that lands after the stage's last look at `ctx.cancelled`, just before its pause,
# snooze or failure is written: the request is set as `worker cancel` sets it, minus the NOTIFY
# that would tell the running stage.
raced = Pipeline("cancel_race")


@raced.stage(name="ask")
def raced_ask(ctx: Any) -> None:
    task_connection().execute(
        "UPDATE worker.jobs SET cancel_requested = true WHERE id = %s", (ctx.job_id,)
    )
    record(ctx.job_id, "ask")
    if ctx.payload.get("then") == "pause":
        ctx.pause({"question": "go on?"})
    if ctx.payload.get("then") == "fail":
        raise RuntimeError("failed as the cancel landed")
    ctx.snooze(60)


@raced.cleanup(name="raced_cleanup")
def raced_cleanup(ctx: Any) -> str:
    record(ctx.job_id, "cleanup")
    return "done"


# Its `result=` picks a value PostgreSQL cannot store (NaN), or raises, as `result` says.
def _bad_result(outputs: dict[str, Any]) -> Any:
    if outputs["only"]["result"] == "raise":
        raise LookupError("no such output")
    return float("nan")


bad_result = Pipeline("bad_result", result=_bad_result)


@bad_result.stage(name="only")
def bad_result_only(ctx: Any) -> dict[str, str]:
    record(ctx.job_id, "only")
    return {"result": str(ctx.payload.get("result", "nan"))}


@bad_result.cleanup(name="bad_result_cleanup")
def bad_result_cleanup(ctx: Any) -> str:
    record(ctx.job_id, "cleanup")
    return "done"


# A sync cleanup that outlives its deadline the first time it runs, and notes whether its
# thread was told to stop once the job stopped waiting for it.
slow_tidy = Pipeline("slow_tidy")


@slow_tidy.stage(name="work")
def slow_tidy_work(ctx: Any) -> str:
    record(ctx.job_id, "work")
    if ctx.attempt == 1:
        time.sleep(float(ctx.payload.get("work_sleep", 0)))
    return "worked"


@slow_tidy.cleanup(name="tidy_slowly", deadline=0.5)
def slow_tidy_cleanup(ctx: Any) -> str:
    record(ctx.job_id, "cleanup")
    if effects_of(ctx.job_id, "work") == 1:  # the cleanup the first attempt owes
        time.sleep(1.5)
        record(ctx.job_id, "told to stop" if ctx.cancelled else "not told")
    return "tidied"


# Two cleanups, the first slow in the first attempt (a worker can be killed between them).
two_cleanups = Pipeline("two_cleanups")


@two_cleanups.stage(name="do_work")
def two_cleanups_work(ctx: Any) -> str:
    record(ctx.job_id, "work")
    return "worked"


@two_cleanups.cleanup(name="first_tidy")
def two_cleanups_first(ctx: Any) -> str:
    record(ctx.job_id, "first_tidy")
    if ctx.attempt == 1:
        time.sleep(float(ctx.payload.get("tidy_sleep", 0)))
    return "tidied"


@two_cleanups.cleanup(name="second_tidy")
def two_cleanups_second(ctx: Any) -> str:
    record(ctx.job_id, "second_tidy")
    return "tidied"


# Its cleanup records what it is told becomes of the job (`ctx.ending`), as a cleanup that
# keeps the state a retry needs reads it. Its stage fails with `mode` "fail", and with "hang"
# runs until cancelled (or killed) in its first attempt.
told = Pipeline("told_ending", backoff=Backoff.constant(0.05, jitter=False))


@told.stage(name="told_work")
def told_work(ctx: Any) -> str:
    record(ctx.job_id, "work")
    mode = ctx.payload.get("mode")
    if mode == "fail":
        raise RuntimeError("told_work fails on purpose")
    if mode == "hang" and ctx.attempt == 1:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            ctx.raise_if_cancelled()
            time.sleep(0.01)
    return "worked"


@told.cleanup(name="told_cleanup")
def told_cleanup(ctx: Any) -> None:
    record(ctx.job_id, f"cleanup {ctx.ending}")
