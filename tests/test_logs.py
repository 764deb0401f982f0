"""Logs: one structured line per job transition and per daemon event; JSON lines with
WORKER_LOG_FORMAT=json (checked on a real worker process), text otherwise. A job's lines are
written straight out, batched per event-loop turn, yet none is lost at a stop or an exit, none
is cut into another process's, and a handler of your own still sees every record."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from support import Processes, dead_worker_with_orphans, insert_job, query, wait_for

from worker import Client, JobSpec
from worker.logs import configure, fields, log_info
from worker.logs.writer import PIPE_BUF, LineWriter

JSON_ENV = {"WORKER_LOG_FORMAT": "json"}


def json_lines(processes: Processes, proc: Any) -> list[dict[str, Any]]:
    """Every line the worker wrote, each parsed as JSON (a line that is not JSON fails)."""
    return [json.loads(line) for line in processes.log(proc).splitlines() if line.strip()]


def events_of(lines: list[dict[str, Any]], job_id: str) -> list[str]:
    return [line["event"] for line in lines if line.get("job_id") == job_id]


def test_worker_logs_each_job_transition_and_its_lifecycle_as_json(
    env, database_url, processes: Processes
):
    # The tests' retry backoff is short: the retry is due again about when its outcome is
    # written, and its second start still comes after the requeue's line.
    proc = processes.worker(env, "testtasks", extra=JSON_ENV)
    client = Client(database_url)
    done = client.enqueue("add", {"a": 1, "b": 2})
    flaky = client.enqueue("fails_then_succeeds", {"key": "f", "failures": 1})
    doomed = client.enqueue("always_fails", {"key": "d"}, max_retries=0)
    asking = client.enqueue("ask", {})
    slow = client.enqueue("counted", {"second_sleep": 3})
    done.wait_sync(timeout=30)
    flaky.wait_sync(timeout=30)
    wait_for(lambda: doomed.refresh().status == "failed", timeout=30, message="failed")
    wait_for(lambda: asking.refresh().status == "paused", timeout=30, message="paused")
    wait_for(lambda: slow.refresh().status == "processing", timeout=30, message="processing")
    client.cancel(slow.id)
    wait_for(lambda: slow.refresh().status == "cancelled", timeout=30, message="cancelled")
    os.killpg(proc.pid, signal.SIGTERM)
    assert proc.wait(timeout=60) == 0

    lines = json_lines(processes, proc)
    for line in lines:
        assert {"ts", "level", "logger", "message"} <= line.keys(), line
    assert events_of(lines, done.id) == ["job.started", "job.completed"]
    assert events_of(lines, flaky.id) == [
        "job.started",
        "job.requeued",
        "job.started",
        "job.completed",
    ]
    assert events_of(lines, doomed.id) == ["job.started", "job.failed"]
    assert events_of(lines, asking.id) == ["job.started", "job.paused"]
    assert events_of(lines, slow.id) == ["job.started", "job.cancel_requested", "job.cancelled"]

    (completed,) = [
        line for line in lines if line.get("job_id") == done.id and line["event"] == "job.completed"
    ]
    assert completed["task"] == "add" and completed["queue"] == "default"
    assert completed["status"] == "completed" and completed["retry_count"] == 0
    assert isinstance(completed["duration"], float) and completed["level"] == "info"
    assert done.id in completed["message"] and completed["logger"] == "worker.jobs"
    (requeued,) = [
        line for line in lines if line.get("job_id") == flaky.id and line["event"] == "job.requeued"
    ]
    assert requeued["status"] == "pending" and requeued["retry_count"] == 1

    lifecycle = [line for line in lines if line.get("event", "").startswith("worker.")]
    assert [line["event"] for line in lifecycle] == [
        "worker.started",
        "worker.stopping",
        "worker.stopped",
    ]
    started, _, stopped = lifecycle
    assert started["queues"] == ["default"] and started["concurrency"] == 10
    assert "counted" in started["tasks"] and started["worker_id"] == stopped["worker_id"]
    assert stopped["processed"] >= 6


def test_rescue_and_reconnect_are_logged_as_events(env, database_url, processes):
    # A worker that died holding a job: its heartbeat is old and its job still processing.
    _, (orphan,) = dead_worker_with_orphans(
        database_url, {"payload": '{"a": 1, "b": 1}'}, hostname="gone", concurrency=1
    )
    proc = processes.worker(env, "testtasks", extra=JSON_ENV)

    def logged(event: str) -> list[dict[str, Any]]:
        return [line for line in json_lines(processes, proc) if line.get("event") == event]

    (rescued,) = wait_for(lambda: logged("job.rescued"), timeout=60, message="a rescue line")
    assert (
        rescued["job_id"] == orphan and rescued["task"] == "add" and rescued["level"] == "warning"
    )
    wait_for(lambda: Client(database_url).get(orphan).status == "completed", timeout=30)

    # Every connection of the worker cut at once, as a database restart would.
    query(
        database_url,
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
        "WHERE datname = current_database() AND pid <> pg_backend_pid()",
    )
    wait_for(lambda: logged("listener.reconnected"), timeout=60, message="a reconnect line")
    (lost,) = logged("listener.lost")
    assert lost["level"] == "warning" and lost["error"]
    assert Client(database_url).enqueue("add", {"a": 2, "b": 2}).wait_sync(timeout=30) == 4


@pytest.mark.parametrize("log_format", ["json", "text"])
def test_a_retry_and_a_failure_log_line_say_why_with_the_exception_type(
    env, database_url, processes: Processes, log_format: str
):
    proc = processes.worker(env, "testtasks", extra={"WORKER_LOG_FORMAT": log_format})
    client = Client(database_url)
    doomed = client.enqueue("always_fails", {"key": "why"}, max_retries=1)
    wait_for(lambda: doomed.refresh().status == "failed", timeout=30, message="failed")
    why = "RuntimeError: this task always fails"

    def outcome_lines() -> list[str]:
        return [
            line
            for line in processes.log(proc).splitlines()
            if doomed.id in line and ("back to pending" in line or " failed after " in line)
        ]

    requeued, failed = wait_for(
        lambda: outcome_lines() if len(outcome_lines()) == 2 else None,
        timeout=30,
        message="the retry's and the failure's lines",
    )
    if log_format == "text":
        assert requeued.endswith(f"(queue default, retries 1): {why}"), requeued
        assert failed.endswith(f"): {why}") and " failed after " in failed, failed
        return
    entries = [json.loads(requeued), json.loads(failed)]
    assert [e["event"] for e in entries] == ["job.requeued", "job.failed"]
    for entry in entries:
        assert entry["error"] == why and entry["message"].endswith(f": {why}")
    done = client.enqueue("add", {"a": 1, "b": 1})
    done.wait_sync(timeout=30)
    (completed,) = wait_for(
        lambda: [e for e in json_lines(processes, proc) if e.get("event") == "job.completed"],
        timeout=30,
        message="the completed line",
    )
    assert completed["job_id"] == done.id and "error" not in completed


@pytest.fixture
def worker_logger(capsys: pytest.CaptureFixture[str]) -> Iterator[logging.Logger]:
    root, base = logging.getLogger("worker"), logging.getLogger()
    saved = (root.handlers[:], root.level, root.propagate, base.handlers[:])
    gathered = (logging._srcfile, logging.logThreads, logging.logProcesses)
    yield logging.getLogger("worker.jobs")
    root.handlers[:], root.level, root.propagate, base.handlers[:] = saved
    logging._srcfile, logging.logThreads, logging.logProcesses = gathered


def test_text_lines_for_people_and_json_lines_for_machines_never_show_a_password(
    worker_logger, capsys
):
    url = "postgresql://app:s3cret@db:5432/app"
    extra = fields("db.unreachable", during="connecting", url=url)
    configure("INFO", "text")
    worker_logger.warning("cannot reach %s", url, extra=extra)
    text = capsys.readouterr().err.strip()
    assert text.endswith("WARNING worker.jobs: cannot reach postgresql://app:***@db:5432/app")
    assert not text.startswith("{")

    configure("INFO", "json")
    worker_logger.warning("cannot reach %s", url, extra=extra)
    worker_logger.debug("below the level")
    (line,) = capsys.readouterr().err.strip().splitlines()
    entry = json.loads(line)
    assert entry["event"] == "db.unreachable" and entry["during"] == "connecting"
    assert entry["message"] == "cannot reach postgresql://app:***@db:5432/app"
    assert entry["url"] == "postgresql://app:***@db:5432/app"
    assert "s3cret" not in line

    logging.getLogger("psycopg.pool").error("a library's error")
    assert json.loads(capsys.readouterr().err)["message"] == "a library's error"


def test_each_text_line_shows_the_second_it_was_logged(worker_logger):
    configure("INFO", "text")
    (handler,) = logging.getLogger("worker").handlers
    times = [3600.2, 3600.9, 3601.1, 3600.5]  # the last one: a record formatted late
    shown = []
    for created in times:
        record = logging.LogRecord("worker.jobs", logging.INFO, __file__, 1, "tick", None, None)
        record.created = created
        shown.append(handler.format(record).split()[0])
    assert shown == [time.strftime("%H:%M:%S", time.localtime(t)) for t in times]
    assert shown[1] != shown[2]


def test_event_fields_never_overwrite_the_standard_keys(worker_logger, capsys):
    configure("INFO", "json")
    worker_logger.info("hello", extra=fields("x.y", message="spoof", level="spoof", n=1))
    entry = json.loads(capsys.readouterr().err)
    assert entry["message"] == "hello" and entry["level"] == "info" and entry["n"] == 1


def test_json_timestamps_have_one_fixed_form(worker_logger):
    configure("INFO", "json")
    (handler,) = logging.getLogger("worker").handlers
    stamps = []
    for created in (3600.0, 3600.25, 3601.000001):  # on the second: microseconds still shown
        record = logging.LogRecord("worker.jobs", logging.INFO, __file__, 1, "tick", None, None)
        record.created = created
        stamps.append(json.loads(handler.format(record))["ts"])
    assert stamps == [
        "1970-01-01T01:00:00.000000+00:00",
        "1970-01-01T01:00:00.250000+00:00",
        "1970-01-01T01:00:01.000001+00:00",
    ]


STARTED = "job %s (%s) started, attempt %d (queue %s)"


def log_a_start(job_id: str, url: str = "") -> None:
    log_info(
        logging.getLogger("worker.jobs"),
        "job.started",
        STARTED,
        job_id,
        f"add{url}",
        1,
        "default",
        job_id=job_id,
        task=f"add{url}",
        queue="default",
        attempt=1,
    )


def without_time(line: str, log_format: str) -> Any:
    if log_format == "json":
        return {k: v for k, v in json.loads(line).items() if k != "ts"}
    return line.split(" ", 1)[1]


@pytest.mark.parametrize("log_format", ["json", "text"])
def test_a_job_line_written_straight_out_is_the_line_logging_writes(
    worker_logger, capsys, log_format
):
    configure("INFO", log_format)
    url = "postgresql://app:s3cret@db/app"  # in the task's name: scrubbed on both ways
    log_a_start("0b0e", url)
    logging.getLogger("worker.jobs").info(
        STARTED,
        "0b0e",
        f"add{url}",
        1,
        "default",
        extra=fields("job.started", job_id="0b0e", task=f"add{url}", queue="default", attempt=1),
    )
    straight, through_logging = capsys.readouterr().err.splitlines()
    assert without_time(straight, log_format) == without_time(through_logging, log_format)
    assert "s3cret" not in straight and "app:***@db" in straight


class Kept(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def test_a_handler_or_filter_of_your_own_sees_every_job_record(worker_logger, capsys):
    configure("INFO", "json")
    kept = Kept()
    logging.getLogger("worker").addHandler(kept)
    log_a_start("first")
    logging.getLogger("worker").removeHandler(kept)
    (worker_handler,) = logging.getLogger("worker").handlers
    seen: list[str] = []

    def tag(record: logging.LogRecord) -> bool:
        seen.append(record.getMessage())
        return True

    worker_handler.addFilter(tag)
    log_a_start("second")
    worker_handler.removeFilter(tag)

    (record,) = kept.records
    assert record.getMessage() == "job first (add) started, attempt 1 (queue default)"
    assert getattr(record, "event", None) == "job.started"
    assert getattr(record, "fields", {}).get("job_id") == "first"
    assert seen == ["job second (add) started, attempt 1 (queue default)"]
    lines = [json.loads(line) for line in capsys.readouterr().err.splitlines()]
    assert [line["job_id"] for line in lines] == ["first", "second"]


def test_each_write_is_whole_lines_of_at_most_pipe_buf_and_a_turns_lines_go_together():
    # Each write to a datagram socket arrives as one message: the writes can be seen one by one.
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    writer = LineWriter(open(ours.fileno(), "w", closefd=False))  # noqa: SIM115
    line = "x" * 99  # a hundred bytes with its newline
    theirs.setblocking(False)

    def received() -> list[bytes]:
        got = []
        while True:
            try:
                got.append(theirs.recv(1 << 16))
            except BlockingIOError:
                return got

    writer.write(line)  # no event loop here: at once
    assert received() == [line.encode() + b"\n"]

    async def in_one_turn(count: int) -> tuple[list[bytes], list[bytes]]:
        for _ in range(count):
            writer.write(line)
        before = received()
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        return before, received()

    before, after = asyncio.run(in_one_turn(30))
    assert before == [] and after == [(line.encode() + b"\n") * 30]
    before, after = asyncio.run(in_one_turn(100))
    writes = before + after
    assert b"".join(writes) == (line.encode() + b"\n") * 100
    assert all(len(w) <= PIPE_BUF and w.endswith(b"\n") for w in writes), [len(w) for w in writes]
    assert len(writes) == -(-100 * 100 // (PIPE_BUF - PIPE_BUF % 100))  # as few as fit
    ours.close()
    theirs.close()


def test_lines_of_several_processes_on_one_pipe_are_never_cut_into_each_other(env, database_url):
    proc = subprocess.Popen(
        [sys.executable, "-m", "worker", "run", "testtasks", "--processes", "2"],
        env={**env, **JSON_ENV},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    out: list[bytes] = []
    assert proc.stdout is not None
    reader = threading.Thread(target=lambda: out.append(proc.stdout.read()))
    reader.start()
    try:
        jobs = Client(database_url).enqueue_many(
            [JobSpec("async_double", {"n": i}) for i in range(3000)]
        )
        done = "SELECT count(*) FROM worker.jobs WHERE status = 'completed'"
        wait_for(lambda: query(database_url, done)[0][0] == len(jobs), timeout=120)
        os.killpg(proc.pid, signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        reader.join(timeout=30)
    lines = [json.loads(line) for line in out[0].decode().splitlines()]  # each whole JSON
    ids = {job.id for job in jobs}
    for event in ("job.started", "job.completed"):
        logged = [line["job_id"] for line in lines if line.get("event") == event]
        assert sorted(logged) == sorted(ids), event
    stopped = [line for line in lines if line.get("event") == "worker.stopped"]
    assert len(stopped) == 2 and sum(line["processed"] for line in stopped) == len(ids)


def test_no_line_is_lost_when_a_busy_worker_is_stopped(env, database_url, processes):
    proc = processes.worker(env, "testtasks")
    client = Client(database_url)
    jobs = client.enqueue_many([JobSpec("async_double", {"n": i}) for i in range(10_000)])
    done = "SELECT count(*) FROM worker.jobs WHERE status = 'completed'"
    wait_for(lambda: query(database_url, done)[0][0] >= 300, timeout=60)
    os.killpg(proc.pid, signal.SIGTERM)  # mid-drain
    assert proc.wait(timeout=60) == 0

    completed = {
        str(row[0])
        for row in query(database_url, "SELECT id FROM worker.jobs WHERE status = 'completed'")
    }
    assert 300 <= len(completed) < len(jobs)
    lines = processes.log(proc).splitlines()

    def ids(words: str) -> set[str]:
        return {line.split("job ", 1)[1].split()[0] for line in lines if words in line}

    assert ids(" started, attempt ") == ids(" completed after ") == completed
    assert f"stopped after {len(completed)} jobs" in lines[-1]


def test_no_line_is_lost_when_the_worker_exits_past_a_thread_it_cannot_stop(
    env, database_url, processes
):
    # A sync task that ignores its timeout: its thread still runs when the worker has stopped,
    # so the process ends without waiting for it (`os._exit`).
    proc = processes.worker(env, "chaos.faulttasks", extra=JSON_ENV)
    stuck = insert_job(database_url, "stuck_sync", '{"sleep": 60}', max_retries=0)
    wait_for(lambda: Client(database_url).get(stuck).status == "failed", timeout=60)
    os.killpg(proc.pid, signal.SIGTERM)
    assert proc.wait(timeout=30) == 0  # long before the thread would have returned

    lines = json_lines(processes, proc)
    assert events_of(lines, stuck) == ["job.started", "job.thread_stuck", "job.failed"]
    assert lines[-1]["event"] == "worker.stopped"
