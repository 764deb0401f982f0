"""Multi-stage jobs end to end: real worker processes, a real PostgreSQL.

Every stage of the test pipelines (tests/testtasks.py) records an `effects` row each time it
really runs, so these tests count runs across attempts, processes and kills.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from typing import Any

import pytest
from support import Processes, effects, insert_job, insert_stage, query, status_of, wait_for
from support import wait_for_status as wait_status
from support.owed import OWED_CLEANUP_CASES

from worker import Client, InvalidTransition, Job, JobNotFound, JobStatus, Pipeline
from worker.events import PostgresBus


def count(url: str, job_id: str, kind: str) -> int:
    return effects(url, job_id).count(kind)


def job_row(url: str, job_id: str) -> dict[str, Any]:
    (row,) = query(
        url,
        "SELECT status, result, error, retry_count, question, cancel_requested, finished_at "
        "FROM worker.jobs WHERE id = %s",
        (job_id,),
    )
    keys = ("status", "result", "error", "retry_count", "question", "cancel_requested", "finished")
    return dict(zip(keys, row, strict=True))


def stages(url: str, job_id: str) -> dict[str, dict[str, Any]]:
    rows = query(
        url,
        "SELECT stage, kind, status, output, error, attempt FROM worker.job_stages "
        "WHERE job_id = %s",
        (job_id,),
    )
    return {
        r[0]: {"kind": r[1], "status": r[2], "output": r[3], "error": r[4], "attempt": r[5]}
        for r in rows
    }


def counted_with_completed_stages(url: str, **outputs: str) -> Job:
    """A `counted` job whose rows hold these stages completed by an attempt 1 (their JSON
    outputs), as a deploy that changed the pipeline may leave them; due now."""
    job = Client(url).enqueue("counted", {}, delay=3600)
    for stage, output in outputs.items():
        insert_stage(url, job.job_id, stage, kind="stage", output=output)
    query(url, "UPDATE worker.jobs SET run_at = now() WHERE id = %s", (job.job_id,))
    return job


def cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "worker", *args],
        env={**env, "COLUMNS": "200"},
        capture_output=True,
        text=True,
        timeout=60,
    )


# -- definitions --------------------------------------------------------------------------


def test_a_pipeline_refuses_bad_stage_definitions_when_it_is_defined():
    pipeline = Pipeline("definition_checks")
    pipeline.stage(name="load")(lambda ctx: None)
    with pytest.raises(ValueError, match="already has a stage 'load'"):
        pipeline.stage(name="load")(lambda ctx: None)
    with pytest.raises(ValueError, match="a stage name must be 1 to 255 characters"):
        pipeline.stage(name="s" * 256)(lambda ctx: None)
    with pytest.raises(ValueError, match="a stage deadline must be a positive number"):
        pipeline.stage(deadline=0)
    assert [s.name for s in pipeline.stages] == ["load"]


# -- outputs and retries ------------------------------------------------------------------


def test_stage_outputs_are_persisted_and_passed_on(env, database_url, processes: Processes):
    processes.worker(env, "testtasks")
    client = Client(database_url)
    job = client.enqueue("counted", {})
    assert job.wait_sync(timeout=30) == {"n": 3}
    rows = stages(database_url, job.job_id)
    assert {name: (r["kind"], r["status"], r["output"]) for name, r in rows.items()} == {
        "first": ("stage", "completed", {"n": 1}),
        "second": ("stage", "completed", {"n": 2}),
        "third": ("stage", "completed", {"n": 3}),
        "tidy": ("cleanup", "completed", "tidied"),
    }
    assert job.refresh().outputs["second"] == {"n": 2}
    assert effects(database_url, job.job_id) == ["first", "second", "third", "cleanup"]


def test_a_stage_write_made_as_the_last_flush_ends_is_written(database_url, monkeypatch):
    """The stage writer that answers a job's write is still finishing when the job (its next
    stage never awaits) makes the next one. With one writer allowed at a time, that write must
    start a writer of its own, not wait for a later write that would never come."""
    import testtasks  # noqa: F401 - registers the pipelines with this process

    from worker.daemon import Worker, stage_writes
    from worker.settings import Settings

    monkeypatch.setattr(stage_writes, "MAX_FLUSHES", 1)
    job = Client(database_url).enqueue("hasty", {})

    async def main() -> Any:
        worker = Worker(database_url, Settings(DATABASE_URL=database_url, WORKER_CONCURRENCY=1))
        running = asyncio.create_task(worker.run())
        try:
            return await job.wait(timeout=30)
        finally:
            worker.request_stop()
            await running

    assert asyncio.run(main()) == 3
    assert {name: r["status"] for name, r in stages(database_url, job.job_id).items()} == {
        "one": "completed",
        "two": "completed",
        "three": "completed",
    }


def test_result_is_the_last_stages_output_when_an_earlier_attempt_completed_it(
    env, database_url, processes
):
    """A stage added by a deploy runs now, before a last stage that an earlier attempt had
    completed: the job's result is still the last stage's output."""
    job = counted_with_completed_stages(database_url, first='{"n": 1}', third='{"n": 30}')
    processes.worker(env, "testtasks")
    assert job.wait_sync(timeout=30) == {"n": 30}
    assert effects(database_url, job.job_id) == ["second", "cleanup"]


def test_cancel_seen_as_a_snoozed_stage_is_taken_up_again_closes_that_stage(
    database_url, monkeypatch
):
    """The cancel request lands after the claim, while the worker reads the stage rows of a job
    back from a snooze: the job stops at the boundary of the snoozed stage, which is closed
    as cancelled (not left snoozed), and the cleanup runs."""
    import testtasks  # noqa: F401 - registers the pipelines with this process

    from worker.daemon import Worker
    from worker.daemon import stage_store as daemon_loop

    monkeypatch.setenv("DATABASE_URL", database_url)  # where the stages record their effects
    from worker.settings import Settings

    client = Client(database_url)
    job = client.enqueue("snoozer", {"polls": 2, "every": 0.3})
    real_load = daemon_loop.DaemonStageStore.load
    cancelled: list[JobStatus] = []

    async def load(store: Any, job_id: str) -> Any:
        history = await real_load(store, job_id)
        if any(row.status == "snoozed" for row in history.rows) and not cancelled:
            # The job is processing again: the cancel only asks, by NOTIFY to this worker.
            cancelled.append(await asyncio.to_thread(client.cancel, job_id))
            await asyncio.to_thread(
                wait_for,
                lambda: query(
                    database_url,
                    "SELECT 1 FROM worker.jobs WHERE cancel_requested AND id = %s",
                    (job_id,),
                ),
            )
            await asyncio.sleep(0.5)  # the NOTIFY reaches the worker's listener
        return history

    monkeypatch.setattr(daemon_loop.DaemonStageStore, "load", load)

    async def main() -> None:
        settings = Settings(DATABASE_URL=database_url, WORKER_CONCURRENCY=1)
        worker = Worker(database_url, settings)
        running = asyncio.create_task(worker.run())
        try:
            await asyncio.to_thread(wait_status, database_url, job.job_id, "cancelled")
        finally:
            worker.request_stop()
            await running

    asyncio.run(main())
    assert cancelled == [JobStatus.PROCESSING]
    rows = stages(database_url, job.job_id)
    assert {name: r["status"] for name, r in rows.items()} == {
        "wait_until_ready": "cancelled",
        "snoozer_cleanup": "completed",
    }


def test_retried_job_does_not_rerun_completed_stages(env, database_url, processes):
    processes.worker(env, "testtasks")
    job = Client(database_url).enqueue("counted", {"fail_second_until": 1})
    # `second` fails on attempt 1; attempt 2 starts at `second`, reading `first`'s stored output.
    assert job.wait_sync(timeout=30) == {"n": 3}
    assert effects(database_url, job.job_id) == [
        "first",
        "second",
        "cleanup",
        "second",
        "third",
        "cleanup",
    ]
    rows = stages(database_url, job.job_id)
    assert rows["first"]["attempt"] == 1
    assert rows["second"]["attempt"] == rows["third"]["attempt"] == 2
    assert job_row(database_url, job.job_id)["retry_count"] == 1


def test_cleanup_runs_after_failure_and_the_stage_error_is_kept(env, database_url, processes):
    processes.worker(env, "testtasks")
    job = Client(database_url).enqueue("counted", {"fail_second_until": 99}, max_retries=1)
    wait_status(database_url, job.job_id, "failed")
    assert effects(database_url, job.job_id) == ["first", "second", "cleanup", "second", "cleanup"]
    error = job_row(database_url, job.job_id)["error"]
    first_line = error.splitlines()[0]
    assert first_line == "stage second failed: RuntimeError: second stage fails on purpose"
    rows = stages(database_url, job.job_id)
    assert rows["second"]["status"] == "failed"
    assert "second stage fails on purpose" in rows["second"]["error"]
    assert "third" not in rows


@pytest.mark.parametrize(
    ("result", "error"),
    [
        ("nan", "pipeline bad_result: its result= returned a value that is not JSON"),
        ("raise", "pipeline bad_result: its result= raised LookupError: no such output"),
    ],
)
def test_a_result_that_cannot_be_stored_fails_the_job_after_its_stages_are_recorded(
    env, database_url, processes, result, error
):
    processes.worker(env, "testtasks")
    job = Client(database_url).enqueue("bad_result", {"result": result}, max_retries=0)
    wait_status(database_url, job.job_id, "failed")
    assert job_row(database_url, job.job_id)["error"].startswith(error)
    # The stage itself succeeded: it is recorded completed, and the cleanup ran.
    rows = stages(database_url, job.job_id)
    assert rows["only"]["status"] == "completed"
    assert rows["only"]["output"] == {"result": result}
    assert effects(database_url, job.job_id) == ["only", "cleanup"]
    # Followers hear how the stage and the job ended.
    events = "SELECT step, status FROM worker.job_events WHERE job_id = %s ORDER BY id"
    wait_for(
        # The bus writes events a few milliseconds after the status: there may be none yet.
        lambda: query(database_url, events, (job.job_id,))[-1:] == [("job", "failed")],
        message="the job's final event",
    )
    assert ("only", "completed") in query(database_url, events, (job.job_id,))


# -- cancellation -------------------------------------------------------------------------


def test_a_stage_done_in_an_earlier_attempt_is_reported_skipped_once_per_attempt(
    env, database_url, processes
):
    processes.worker(env, "testtasks", extra={"WORKER_RETRY_BACKOFF_BASE": "0"})
    job = Client(database_url).enqueue("retried_poller", {})
    assert job.wait_sync(timeout=30) == 3
    assert effects(database_url, job.job_id) == ["fetch", "poll", "poll", "poll", "poll"]
    skipped = query(
        database_url,
        "SELECT step FROM worker.job_events WHERE job_id = %s AND status = 'skipped'",
        (job.job_id,),
    )
    assert skipped == [("fetch",)], "reported again on each return from a snooze"


def test_cancelling_a_running_job_stops_at_the_next_stage_boundary(env, database_url, processes):
    processes.worker(env, "testtasks")
    client = Client(database_url)
    job = client.enqueue("counted", {"second_sleep": 3})
    wait_for(lambda: count(database_url, job.job_id, "second") == 1, message="second to start")
    assert client.cancel(job.job_id) == JobStatus.PROCESSING  # requested, not yet honoured
    wait_status(database_url, job.job_id, "cancelled")
    # `second` was allowed to finish; `third` never started; the cleanup ran once.
    assert effects(database_url, job.job_id) == ["first", "second", "cleanup"]
    rows = stages(database_url, job.job_id)
    assert rows["second"]["status"] == "completed"
    assert "third" not in rows
    assert rows["tidy"]["status"] == "completed"
    assert job_row(database_url, job.job_id)["error"] == "cancelled before stage third"


def test_cancel_request_reaches_a_running_worker_within_a_second(env, database_url, processes):
    # A long lease makes the heartbeat's fallback check (every lease/3) 20 s away: only the
    # NOTIFY on `worker_cancel` can deliver the request this fast.
    processes.worker(env, "testtasks", extra={"WORKER_LEASE_SECONDS": "60"})
    client = Client(database_url)
    job = client.enqueue("patient", {"seconds": 60})
    wait_for(lambda: count(database_url, job.job_id, "long_wait") == 1, message="long stage")
    time.sleep(0.5)  # the stage is in its loop, watching ctx.cancelled
    started = time.monotonic()
    client.cancel(job.job_id)
    wait_for(
        lambda: count(database_url, job.job_id, "saw_cancel") == 1,
        timeout=20,
        interval=0.01,
        message="the stage to see the cancel",
    )
    seen_after = time.monotonic() - started
    assert seen_after < 2.0, f"the running stage saw the cancel only after {seen_after:.2f} s"
    wait_status(database_url, job.job_id, "cancelled")
    assert effects(database_url, job.job_id) == ["long_wait", "saw_cancel", "cleanup"]
    assert stages(database_url, job.job_id)["long_wait"]["status"] == "cancelled"


@pytest.mark.parametrize("then", ["snooze", "pause"])
def test_stage_that_snoozes_or_pauses_after_a_cancel_request_ends_cancelled_now(
    env, database_url, processes, then
):
    processes.worker(env, "testtasks")
    client = Client(database_url)
    job = client.enqueue("late_cancel", {"then": then})
    wait_status(database_url, job.job_id, "processing")
    time.sleep(0.5)
    client.cancel(job.job_id)
    # Not `paused` with nobody to resume it, nor `pending` for the snooze's 60 s.
    wait_status(database_url, job.job_id, "cancelled", timeout=20)
    assert effects(database_url, job.job_id) == ["saw_cancel", "cleanup"]
    assert stages(database_url, job.job_id)["wait_then_wait_more"]["status"] == "cancelled"


def test_stage_completed_under_an_earlier_first_stage_is_not_run_again(
    env, database_url, processes
):
    # The job was retried under a deploy whose pipeline began with another stage: its rows
    # hold `second` completed but nothing for today's `first`.
    job = counted_with_completed_stages(database_url, second='{"n": 2}', first_before="{}")
    processes.worker(env, "testtasks")
    assert job.wait_sync(timeout=30) == {"n": 3}
    assert effects(database_url, job.job_id) == ["first", "third", "cleanup"]


@pytest.mark.parametrize("then", ["snooze", "pause", "fail"])
def test_cancel_landing_as_a_stage_pauses_snoozes_or_fails_still_ends_cancelled(
    env, database_url, processes, then
):
    processes.worker(env, "testtasks")
    job = Client(database_url).enqueue("cancel_race", {"then": then}, max_retries=0)
    # Not left `paused` with a cancel request nobody acts on, nor `pending` for 60 s, nor
    # `failed` by its last attempt: a cancel request wins.
    wait_status(database_url, job.job_id, "cancelled", timeout=20)
    assert effects(database_url, job.job_id) == ["ask", "cleanup"]
    ended = "failed" if then == "fail" else "cancelled"
    assert stages(database_url, job.job_id)["ask"]["status"] == ended

    def events() -> list[tuple[object, ...]]:
        return query(
            database_url,
            "SELECT step, status FROM worker.job_events WHERE job_id = %s ORDER BY id",
            (job.job_id,),
        )

    wait_for(lambda: ("job", "cancelled") in events(), message="the final event")
    assert ("ask", "paused") not in events(), "a pause the cancel overrode was reported"
    assert ("ask", ended) in events()
    assert [e for e in events() if e[0] == "job"] == [("job", "cancelled")]


def test_cancelling_a_pending_job_is_immediate_and_it_never_runs(env, database_url, processes):
    client = Client(database_url)
    job = client.enqueue("counted", {})
    assert client.cancel(job.job_id) == JobStatus.CANCELLED  # no worker needed
    row = job_row(database_url, job.job_id)
    assert (row["status"], row["cancel_requested"], row["finished"] is not None) == (
        "cancelled",
        True,
        True,
    )
    processes.worker(env, "testtasks")
    assert client.enqueue("add", {"a": 1, "b": 1}).wait_sync(timeout=30) == 2
    assert status_of(database_url, job.job_id) == "cancelled"
    assert effects(database_url, job.job_id) == []


def test_cancelling_a_paused_job_runs_its_cleanup_and_ends_cancelled(env, database_url, processes):
    processes.worker(env, "testtasks")
    client = Client(database_url)
    job = client.enqueue("approval", {})
    wait_status(database_url, job.job_id, "paused")
    assert effects(database_url, job.job_id) == ["prepare", "approve"]  # no cleanup at a pause
    started = time.monotonic()
    result = cli(env, "cancel", job.job_id)
    assert result.returncode == 0, result.stderr
    # Its stages ran, so it owes its cleanup: a worker runs that (and nothing else) at once.
    wait_status(database_url, job.job_id, "cancelled", timeout=10)
    assert time.monotonic() - started < 10
    assert effects(database_url, job.job_id) == ["prepare", "approve", "cleanup"]
    rows = stages(database_url, job.job_id)
    assert rows["approve"]["status"] == "cancelled"
    assert "pay" not in rows


def test_cancelling_a_finished_job_is_a_no_op_that_says_so(env, database_url, processes):
    processes.worker(env, "testtasks")
    client = Client(database_url)
    job = client.enqueue("counted", {})
    job.wait_sync(timeout=30)
    assert client.cancel(job.job_id) == JobStatus.COMPLETED
    result = cli(env, "cancel", job.job_id)
    assert result.returncode == 1, result.stderr
    assert f"job {job.job_id} is already completed: nothing to cancel" in result.stderr
    row = job_row(database_url, job.job_id)
    assert (row["status"], row["result"], row["cancel_requested"]) == ("completed", {"n": 3}, False)
    with pytest.raises(JobNotFound):
        client.cancel("00000000-0000-0000-0000-000000000000")


# -- pause and resume ---------------------------------------------------------------------


@pytest.mark.smoke
def test_pause_then_resume_with_an_answer_completes(env, database_url, processes):
    processes.worker(env, "testtasks", extra={"WORKER_CONCURRENCY": "1"})
    client = Client(database_url)
    job = client.enqueue("approval", {"amount": 25})
    wait_status(database_url, job.job_id, "paused")
    assert job_row(database_url, job.job_id)["question"] == {"question": "pay 25?"}
    # Paused holds no slot: the only slot runs another job meanwhile.
    assert client.enqueue("add", {"a": 2, "b": 2}).wait_sync(timeout=30) == 4
    assert effects(database_url, job.job_id) == ["prepare", "approve"]

    client.resume(job.job_id, {"approved": True})
    assert job.wait_sync(timeout=30) == {"paid": 25, "answer": {"approved": True}}
    # `prepare` is not run again; `approve` runs again and sees the answer.
    assert effects(database_url, job.job_id) == ["prepare", "approve", "approve", "pay", "cleanup"]
    assert stages(database_url, job.job_id)["approve"]["output"] == {"answer": {"approved": True}}


def test_a_job_can_be_resumed_as_soon_as_its_paused_event_arrives(env, database_url, processes):
    """The `paused` event reports the job paused: a client resuming on seeing it must find the
    job paused, even while the database is slow to write that (here, a trigger)."""
    query(
        database_url,
        """
        CREATE FUNCTION slow_pause() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN PERFORM pg_sleep(1); RETURN NEW; END $$;
        CREATE TRIGGER slow_pause BEFORE UPDATE ON worker.jobs FOR EACH ROW
        WHEN (NEW.status = 'paused') EXECUTE FUNCTION slow_pause();
        """,
    )
    processes.worker(env, "testtasks")
    client = Client(database_url)
    job = client.enqueue("approval", {"amount": 5})

    async def resume_on_the_paused_event() -> None:
        bus = PostgresBus(database_url)
        try:
            async with asyncio.timeout(30):
                async for event in bus.follow(job.job_id):
                    if event.status == "paused":
                        assert event.message == {"question": {"question": "pay 5?"}}
                        client.resume(job.job_id, "yes")
                        return
        finally:
            await bus.aclose()

    asyncio.run(resume_on_the_paused_event())
    assert job.wait_sync(timeout=30) == {"paid": 5, "answer": "yes"}


def test_resume_from_the_cli_passes_the_answer(env, database_url, processes):
    processes.worker(env, "testtasks")
    job = Client(database_url).enqueue("approval", {})
    wait_status(database_url, job.job_id, "paused")
    result = cli(env, "resume", job.job_id, "--answer", '"yes"')
    assert result.returncode == 0, result.stderr
    assert job.wait_sync(timeout=30) == {"paid": 10, "answer": "yes"}


def test_resuming_a_job_that_is_not_paused_is_a_clear_error(env, database_url):
    client = Client(database_url)
    job = client.enqueue("approval", {})
    with pytest.raises(InvalidTransition, match=f"job {job.job_id} is pending, not paused"):
        client.resume(job.job_id, "yes")
    result = cli(env, "resume", job.job_id, "--answer", '"yes"')
    assert result.returncode == 1
    assert "is pending, not paused: nothing to resume" in result.stderr
    row = job_row(database_url, job.job_id)
    assert (row["status"], row["question"]) == ("pending", None)
    assert query(database_url, "SELECT answer FROM worker.jobs WHERE id = %s", (job.job_id,)) == [
        (None,)
    ]


# -- snoozing and deadlines ---------------------------------------------------------------


def test_snoozing_does_not_count_as_a_retry_or_hold_a_slot(env, database_url, processes):
    processes.worker(env, "testtasks", extra={"WORKER_CONCURRENCY": "1"})
    client = Client(database_url)
    # max_retries=0: a snooze counted as a retry would fail this job on its first snooze.
    job = client.enqueue("snoozer", {"polls": 4, "every": 1.0}, max_retries=0)
    wait_for(lambda: count(database_url, job.job_id, "poll") >= 1, message="first poll")
    # The only slot is free while the job snoozes: another job runs to completion meanwhile.
    assert client.enqueue("add", {"a": 1, "b": 2}).wait_sync(timeout=30) == 3
    assert status_of(database_url, job.job_id) == "pending"
    assert count(database_url, job.job_id, "poll") < 4
    assert job.wait_sync(timeout=30) == {"polls": 4}
    row = job_row(database_url, job.job_id)
    assert row["retry_count"] == 0
    # Cleanup runs once, at the end of the attempt, not after each snooze.
    assert effects(database_url, job.job_id) == ["poll"] * 4 + ["cleanup"]


@pytest.mark.parametrize("mode", ["snooze", "sleep"])
def test_stage_deadline_gives_up_with_a_clear_error(env, database_url, processes, mode):
    processes.worker(env, "testtasks")
    job = Client(database_url).enqueue("deadlined", {"mode": mode})
    started = time.monotonic()
    wait_status(database_url, job.job_id, "failed")
    assert time.monotonic() - started < 15  # the stage would sleep 60 s, or snooze forever
    row = job_row(database_url, job.job_id)
    assert row["error"].startswith("stage never_ready failed: StageDeadlineExceeded: ")
    assert "gave up" in row["error"] and "deadline" in row["error"]
    assert row["retry_count"] == 0  # giving up is final: no retry
    assert count(database_url, job.job_id, "cleanup") == 1
    assert stages(database_url, job.job_id)["never_ready"]["status"] == "failed"


@pytest.mark.parametrize("lost", ["killed", "stopped"])
def test_a_stage_that_gave_up_is_not_run_again_when_its_cleanup_is_cut_off(
    env, database_url, processes, lost
):
    """The attempt failed for good before its cleanup ran; the worker is then killed, or
    stopped with too short a grace, during the cleanup. The next worker runs the cleanup it
    owes and fails the job with the stage's error; the stage does not run again."""
    extra = {"WORKER_SHUTDOWN_GRACE": "0.5"}
    first = processes.worker(env, "testtasks", extra=extra)
    job = Client(database_url).enqueue("deadlined", {"mode": "sleep", "cleanup_sleep": 10})
    wait_for(lambda: count(database_url, job.job_id, "cleanup") == 1, message="the cleanup")
    if lost == "killed":
        os.killpg(first.pid, signal.SIGKILL)
    else:
        first.send_signal(signal.SIGTERM)
    first.wait(timeout=30)
    processes.worker(env, "testtasks", extra=extra)  # after the lease (3 s), if killed
    wait_status(database_url, job.job_id, "failed", timeout=60)
    assert effects(database_url, job.job_id) == ["try", "cleanup", "cleanup"]
    row = job_row(database_url, job.job_id)
    assert row["error"].startswith("stage never_ready failed: StageDeadlineExceeded: ")
    assert stages(database_url, job.job_id)["deadlined_cleanup"]["status"] == "completed"


# -- failing cleanups ---------------------------------------------------------------------


def test_failing_cleanup_is_recorded_and_does_not_hide_the_original_error(
    env, database_url, processes
):
    processes.worker(env, "testtasks")
    job = Client(database_url).enqueue("bad_cleanup", {}, max_retries=0)
    wait_status(database_url, job.job_id, "failed")
    error = job_row(database_url, job.job_id)["error"]
    assert error.splitlines()[0] == "stage work failed: ValueError: the original problem"
    assert "(cleanup also failed: broken_cleanup: OSError: the cleanup's own problem)" in error
    cleanup = stages(database_url, job.job_id)["broken_cleanup"]
    assert cleanup["status"] == "failed"
    assert "OSError: the cleanup's own problem" in cleanup["error"]


def test_failing_cleanup_after_successful_stages_is_retried_not_ignored(
    env, database_url, processes
):
    processes.worker(env, "testtasks")
    job = Client(database_url).enqueue("bad_cleanup", {"stage_ok": True}, max_retries=1)
    wait_status(database_url, job.job_id, "failed")
    # The retry runs the cleanup only: the completed stage is not run again.
    assert effects(database_url, job.job_id) == ["work", "cleanup", "cleanup"]
    error = job_row(database_url, job.job_id)["error"]
    assert error == "cleanup failed: broken_cleanup: OSError: the cleanup's own problem"


# -- crash recovery -----------------------------------------------------------------------


@pytest.mark.smoke
def test_crash_recovery_runs_the_owed_cleanup_before_the_next_attempt(env, database_url, processes):
    client = Client(database_url)
    job = client.enqueue("counted", {"second_sleep": 3})
    doomed = processes.worker(env, "testtasks")
    wait_for(lambda: count(database_url, job.job_id, "second") == 1, message="second to start")
    os.killpg(doomed.pid, signal.SIGKILL)
    doomed.wait(timeout=10)
    processes.worker(env, "testtasks")  # recovers the job once the lease (3 s) runs out
    assert job.wait_sync(timeout=60) == {"n": 3}
    # The cleanup the killed attempt owed ran before attempt 2; `first` did not run again.
    assert effects(database_url, job.job_id) == [
        "first",
        "second",
        "cleanup",
        "second",
        "third",
        "cleanup",
    ]
    rows = stages(database_url, job.job_id)
    assert rows["first"]["attempt"] == 1
    assert rows["second"]["attempt"] == 2
    assert job_row(database_url, job.job_id)["retry_count"] == 1


def test_an_owed_sync_cleanup_past_its_deadline_does_not_cancel_the_job(
    env, database_url, processes
):
    """The owed cleanup's thread is told to stop, and the next attempt runs: a deadline
    reached is that cleanup's failure, not a cancel request for its job."""
    client = Client(database_url)
    job = client.enqueue("slow_tidy", {"work_sleep": 30})
    doomed = processes.worker(env, "testtasks")
    wait_for(lambda: count(database_url, job.job_id, "work") == 1, message="work to start")
    os.killpg(doomed.pid, signal.SIGKILL)
    doomed.wait(timeout=10)
    processes.worker(env, "testtasks")  # recovers the job once the lease (3 s) runs out
    assert job.wait_sync(timeout=60) == "worked"
    wait_for(lambda: len(effects(database_url, job.job_id)) == 5, message="the thread's note")
    seen = effects(database_url, job.job_id)
    assert "told to stop" in seen
    assert [e for e in seen if e != "told to stop"] == ["work", "cleanup", "work", "cleanup"]


def test_a_cancel_after_a_worker_lost_between_two_cleanups_still_runs_the_second(
    env, database_url, processes
):
    """From the first cleanup's start the second is recorded `waiting`, so a cancel of the job,
    rescued with its first cleanup done and its second never started, sends it to a worker to
    run what is owed, instead of cancelling it at once."""
    client = Client(database_url)
    job = client.enqueue("two_cleanups", {"tidy_sleep": 30})
    doomed = processes.worker(env, "testtasks")
    wait_for(lambda: count(database_url, job.job_id, "first_tidy") == 1, message="first cleanup")
    rows = stages(database_url, job.job_id)
    assert rows["first_tidy"]["status"] == "running"
    assert (rows["second_tidy"]["status"], rows["second_tidy"]["attempt"]) == ("waiting", 1)
    os.killpg(doomed.pid, signal.SIGKILL)
    doomed.wait(timeout=10)
    # As if the worker died just after the first cleanup ended, then was found out (`RESCUE`).
    query(
        database_url,
        "UPDATE worker.job_stages SET status = 'completed', finished_at = now() "
        "WHERE job_id = %s AND stage = 'first_tidy'",
        (job.job_id,),
    )
    query(
        database_url,
        "UPDATE worker.jobs SET status = 'pending', retry_count = retry_count + 1 WHERE id = %s",
        (job.job_id,),
    )
    assert client.cancel(job.job_id) == JobStatus.PENDING  # owed: not cancelled at once
    processes.worker(env, "testtasks")
    wait_status(database_url, job.job_id, "cancelled")
    assert effects(database_url, job.job_id) == ["work", "first_tidy", "first_tidy", "second_tidy"]
    rows = stages(database_url, job.job_id)
    assert rows["second_tidy"]["status"] == "completed"


@pytest.mark.parametrize("cleanup_fails", [False, True])
def test_a_cancel_during_an_owed_cleanup_runs_that_cleanup_once(
    env, database_url, processes, cleanup_fails
):
    """The attempt that runs a killed one's cleanup, cancelled meanwhile, began no stage of its
    own: it owes no second cleanup. A failure of the owed one is in the job's error."""
    client = Client(database_url)
    payload = {"second_sleep": 3, "cleanup_sleep": 2, "cleanup_fails": cleanup_fails}
    job = client.enqueue("counted", payload)
    doomed = processes.worker(env, "testtasks")
    wait_for(lambda: count(database_url, job.job_id, "second") == 1, message="second to start")
    os.killpg(doomed.pid, signal.SIGKILL)
    doomed.wait(timeout=10)
    processes.worker(env, "testtasks")  # recovers the job once the lease (3 s) runs out
    wait_for(
        lambda: count(database_url, job.job_id, "cleanup") == 1, timeout=30, message="the cleanup"
    )
    client.cancel(job.job_id)
    wait_status(database_url, job.job_id, "cancelled")
    assert effects(database_url, job.job_id) == ["first", "second", "cleanup"]
    rows = stages(database_url, job.job_id)
    assert (rows["second"]["status"], rows["second"]["attempt"]) == ("failed", 1)
    assert "interrupted" in rows["second"]["error"]
    assert (rows["tidy"]["status"], rows["tidy"]["attempt"]) == (
        "failed" if cleanup_fails else "completed",
        1,
    )
    error = job_row(database_url, job.job_id)["error"]
    assert error.startswith("cancelled before stage second")
    assert ("(cleanup also failed: tidy: OSError: the cleanup could not tidy)" in error) is (
        cleanup_fails
    )


@pytest.mark.parametrize("retry", ["one job", "--all"])
def test_owed_cleanup_still_runs_after_a_manual_retry_and_a_kill(
    env, database_url, processes, retry
):
    client = Client(database_url)
    job = client.enqueue("patient", {"seconds": 60}, max_retries=0)
    first = processes.worker(env, "testtasks")
    wait_for(lambda: count(database_url, job.job_id, "long_wait") == 1, message="long stage")
    client.cancel(job.job_id)
    wait_status(database_url, job.job_id, "cancelled")
    assert effects(database_url, job.job_id) == ["long_wait", "saw_cancel", "cleanup"]

    # Attempts count from 1 again.
    if retry == "one job":
        client.retry(job.job_id)
    else:
        done = cli(env, "retry", "--all", "--status", "cancelled")
        assert done.returncode == 0, done.stderr
    wait_for(lambda: count(database_url, job.job_id, "long_wait") == 2, message="second run")
    os.killpg(first.pid, signal.SIGKILL)
    first.wait(timeout=10)
    processes.worker(env, "testtasks")
    # No retries left: the job fails, but only after the cleanup the killed run owed.
    wait_status(database_url, job.job_id, "failed", timeout=60)
    assert effects(database_url, job.job_id) == [
        "long_wait",
        "saw_cancel",
        "cleanup",
        "long_wait",
        "cleanup",
    ]
    row = job_row(database_url, job.job_id)
    assert "was lost" in row["error"]
    assert stages(database_url, job.job_id)["long_wait"]["status"] == "failed"


@pytest.mark.parametrize(
    ("history", "owed"),
    [pytest.param(rows, owed, id=name) for name, rows, owed in OWED_CLEANUP_CASES],
)
def test_the_attempt_that_owes_its_cleanup_is_known_to_the_database(database_url, history, owed):
    job_id = insert_job(database_url, "pipe", status="paused")
    for stage, kind, status, attempt in history:
        insert_stage(database_url, job_id, stage, status, attempt, kind=kind)
    found = query(database_url, "SELECT worker.owed_cleanup_attempt(%s)", (job_id,))[0][0]
    assert found == owed
    # A cancel reads the same rule: a job that owes a cleanup goes back to a worker for it.
    Client(database_url).cancel(job_id)
    assert status_of(database_url, job_id) == ("pending" if owed else "cancelled")
