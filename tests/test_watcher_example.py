"""The async job watcher example (examples/async_job_watcher/) end to end.

`worker run examples.async_job_watcher` runs as a real process against a real PostgreSQL; the
background export it spawns is a real detached process writing real files.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest
from support import Processes, query, status_of, wait_for

from examples.async_job_watcher import actions
from worker import Client

STAGES = ["spawn_background_job", "await_job_completion", "verify_exported_artifact"]
CLEANUP = "cleanup_job_status_file"


def job_files(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


def stage_rows(url: str, job_id: str) -> dict[str, dict[str, Any]]:
    rows = query(
        url,
        "SELECT stage, status, output, error, attempt FROM worker.job_stages WHERE job_id = %s",
        (job_id,),
    )
    return {r[0]: {"status": r[1], "output": r[2], "error": r[3], "attempt": r[4]} for r in rows}


def events(url: str, job_id: str) -> list[tuple[str, str, Any]]:
    rows = query(
        url,
        "SELECT step, status, message FROM worker.job_events WHERE job_id = %s ORDER BY id",
        (job_id,),
    )
    return [(str(r[0]), str(r[1]), r[2]) for r in rows]


def background_is_running(pid: int, status_file: str) -> bool:
    return actions._is_background_job(pid, status_file)


def wait_terminal(url: str, job_id: str, timeout: float = 60.0) -> str:
    wait_for(
        lambda: status_of(url, job_id) in ("completed", "failed", "cancelled"),
        timeout=timeout,
        message=f"job {job_id} to finish",
    )
    return status_of(url, job_id)


def enqueue(how: str, env: dict[str, str], url: str, payload: dict[str, Any], **options) -> str:
    """Enqueue the watcher the three documented ways; returns the job id."""
    if how == "python":
        return Client(url).enqueue("async_job_watcher", payload, **options).job_id
    if how == "cli":
        text = json.dumps(payload)
        done = subprocess.run(
            [sys.executable, "-m", "worker", "enqueue", "async_job_watcher", "--payload", text],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
        return done.stdout.strip()
    (row,) = query(
        url,
        "INSERT INTO worker.jobs (task, payload) VALUES ('async_job_watcher', %s) "
        "RETURNING id::text",
        (json.dumps(payload),),
    )
    return str(row[0])


@pytest.mark.parametrize("how", ["python", "cli", "sql"])
def test_watcher_completes_with_three_outputs_and_leaves_no_files(
    env, database_url, processes: Processes, tmp_path, how
):
    folder = tmp_path / "export"
    folder.mkdir()
    status_file = str(folder / "export.status")
    # One slot, and a second task module: a quick job must run while the watcher waits.
    processes.worker(
        env, "examples.async_job_watcher", "testtasks", extra={"WORKER_CONCURRENCY": "1"}
    )
    job_id = enqueue(how, env, database_url, {"delay_seconds": 5.0, "status_file": status_file})
    wait_for(lambda: "await_job_completion" in stage_rows(database_url, job_id), message="stage 2")
    spawned = stage_rows(database_url, job_id)["spawn_background_job"]["output"]
    assert spawned["status_file"] == status_file
    assert spawned["target_delay_seconds"] == 5.0
    pid = spawned["worker_pid"]
    assert background_is_running(pid, status_file)
    assert os.getsid(pid) == pid  # detached: a session of its own
    assert Client(database_url).enqueue("add", {"a": 1, "b": 1}).wait_sync(timeout=30) == 2
    assert status_of(database_url, job_id) in ("pending", "processing")  # still polling

    result = Client(database_url).get(job_id).wait_sync(timeout=60)
    assert sorted(result) == sorted(STAGES)
    ready = result["await_job_completion"]
    assert ready["job_status"] == "READY" and ready["progress_pct"] == 100
    assert ready["artifact_rows"] > 0 and len(ready["artifact_sha256"]) == 64
    assert result["verify_exported_artifact"] == {
        "verified": True,
        "artifact_rows": ready["artifact_rows"],
        "artifact_sha256": ready["artifact_sha256"],
    }
    rows = stage_rows(database_url, job_id)
    assert {name: rows[name]["output"] for name in STAGES} == result
    assert rows[CLEANUP]["status"] == "completed"
    assert job_files(folder) == []  # status file, its .tmp and the artifact are gone
    assert not background_is_running(pid, status_file)

    def polled() -> list[dict[str, int]]:
        progress = [m for _, status, m in events(database_url, job_id) if status == "progress"]
        return [m for m in progress if m["pct"] > 0]

    # Progress events are written behind the job (every 50 ms), so the last one may land just
    # after the job's outcome.
    final = {"pct": 100, "rows": ready["artifact_rows"]}
    wait_for(lambda: polled() and polled()[-1] == final, timeout=10, message="the 100% event")
    assert all("rows" in m for m in polled())


def test_crash_recovery_of_a_watcher_killed_in_stage_two(
    env, database_url, processes: Processes, tmp_path
):
    folder = tmp_path / "export"
    folder.mkdir()
    status_file = str(folder / "export.status")
    doomed = processes.worker(env, "examples.async_job_watcher")
    job_id = (
        Client(database_url)
        .enqueue("async_job_watcher", {"delay_seconds": 3.0, "status_file": status_file})
        .job_id
    )
    wait_for(lambda: "await_job_completion" in stage_rows(database_url, job_id), message="stage 2")
    pid = stage_rows(database_url, job_id)["spawn_background_job"]["output"]["worker_pid"]
    # Catch the worker inside stage 2: hold the stage's row so its next poll blocks while
    # the job is `processing` in its hands, then kill it there.
    with psycopg.connect(database_url) as blocker:
        blocker.execute(
            "SELECT 1 FROM worker.job_stages WHERE job_id = %s AND stage = "
            "'await_job_completion' FOR UPDATE",
            (job_id,),
        )
        wait_for(
            lambda: status_of(database_url, job_id) == "processing",
            message="the next poll of stage 2",
        )
        os.killpg(doomed.pid, signal.SIGKILL)
        doomed.wait(timeout=10)
        blocker.rollback()
    assert background_is_running(pid, status_file)  # the export outlives its worker
    processes.worker(env, "examples.async_job_watcher")  # recovers it after the 3 s lease

    final = wait_terminal(database_url, job_id)
    # The cleanup the killed attempt owed removed the files and stopped the export before
    # attempt 2, so stage 2 cannot find its job again: the job fails, cleanly and saying why.
    assert final == "failed"
    (error,) = query(database_url, "SELECT error FROM worker.jobs WHERE id = %s", (job_id,))[0]
    assert error.startswith("stage await_job_completion failed: RuntimeError: status file ")
    assert "is missing" in error
    assert job_files(folder) == []
    assert not background_is_running(pid, status_file)
    rows = stage_rows(database_url, job_id)
    assert (rows["spawn_background_job"]["status"], rows["spawn_background_job"]["attempt"]) == (
        "completed",
        1,
    )
    assert "verify_exported_artifact" not in rows
    log = events(database_url, job_id)
    started = [(step, m["attempt"]) for step, status, m in log if status == "started"]
    assert started.count(("spawn_background_job", 1)) == 1
    assert not any(step == "spawn_background_job" and a > 1 for step, a in started)
    # The owed cleanup (for attempt 1) ran before stage 2 started again in attempt 2.
    assert started.index((CLEANUP, 1)) < started.index(("await_job_completion", 2))


def test_cancelling_a_running_watcher_stops_at_a_boundary_and_cleans_up(
    env, database_url, processes: Processes, tmp_path
):
    folder = tmp_path / "export"
    folder.mkdir()
    status_file = str(folder / "export.status")
    processes.worker(env, "examples.async_job_watcher")
    client = Client(database_url)
    job = client.enqueue("async_job_watcher", {"delay_seconds": 10.0, "status_file": status_file})
    wait_for(
        lambda: "await_job_completion" in stage_rows(database_url, job.job_id), message="stage 2"
    )
    pid = stage_rows(database_url, job.job_id)["spawn_background_job"]["output"]["worker_pid"]
    started = time.monotonic()
    client.cancel(job.job_id)
    assert wait_terminal(database_url, job.job_id, timeout=20) == "cancelled"
    assert time.monotonic() - started < 10  # not after the export's 10 s
    rows = stage_rows(database_url, job.job_id)
    assert rows["spawn_background_job"]["status"] == "completed"
    assert rows["await_job_completion"]["status"] == "cancelled"
    assert "verify_exported_artifact" not in rows
    assert rows[CLEANUP]["status"] == "completed"
    assert rows[CLEANUP]["output"]["stopped_pids"] == [pid]
    assert job_files(folder) == []
    assert not background_is_running(pid, status_file)


def test_tampered_artifact_fails_verification_loudly(
    env, database_url, processes: Processes, tmp_path
):
    folder = tmp_path / "export"
    folder.mkdir()
    status_file = str(folder / "export.status")
    artifact = Path(status_file + ".artifact.csv")
    processes.worker(env, "examples.async_job_watcher")
    job = Client(database_url).enqueue(
        "async_job_watcher", {"delay_seconds": 3.0, "status_file": status_file}, max_retries=0
    )
    # Once the export has written rows, someone else changes the artifact under it.
    wait_for(lambda: artifact.exists() and artifact.stat().st_size > 100, message="artifact rows")
    with artifact.open("a") as f:
        f.write("999999,tampered\n")
    assert wait_terminal(database_url, job.job_id) == "failed"
    (error,) = query(database_url, "SELECT error FROM worker.jobs WHERE id = %s", (job.job_id,))[0]
    first_line = error.splitlines()[0]
    assert first_line.startswith("stage verify_exported_artifact failed: RuntimeError: ")
    assert "does not match its checksum" in first_line
    rows = stage_rows(database_url, job.job_id)
    assert rows["verify_exported_artifact"]["status"] == "failed"
    assert rows[CLEANUP]["status"] == "completed"
    assert job_files(folder) == []


# -- the actions on their own ---------------------------------------------------------------


def _artifact(tmp_path: Path, content: bytes) -> tuple[str, str]:
    status_file = str(tmp_path / "x.status")
    Path(status_file + ".artifact.csv").write_bytes(content)
    return status_file, hashlib.sha256(content).hexdigest()


@pytest.mark.parametrize(
    ("rows", "sha", "message"),
    [
        (0, "good", "reported 0 rows"),
        (-3, "good", "reported -3 rows"),
        (10, "", "empty checksum"),
        (10, "0" * 64, "does not match its checksum"),
    ],
)
def test_verify_refuses_bad_exports(tmp_path, rows, sha, message):
    status_file, good = _artifact(tmp_path, b"row,value\n1,2\n")
    ready = {"artifact_rows": rows, "artifact_sha256": good if sha == "good" else sha}
    with pytest.raises(RuntimeError, match=message):
        actions.verify_exported_artifact(
            {"status_file": status_file, "outputs": {"await_job_completion": ready}}
        )


def test_cleanup_is_idempotent(tmp_path):
    status_file, _ = _artifact(tmp_path, b"row,value\n")
    Path(status_file).write_text("{}")
    Path(status_file + ".tmp").write_text("{")
    payload = {"status_file": status_file, "outputs": {}}
    out, _ = actions.cleanup_job_status_file(payload)
    assert len(out["removed"]) == 3
    assert actions.cleanup_job_status_file(payload)[0] == {"removed": [], "stopped_pids": []}
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        ({"delay_seconds": 1.0}, "must be a non-empty path"),
        ({"delay_seconds": 1.0, "status_file": "relative.status"}, "must be an absolute path"),
        ({"delay_seconds": -1, "status_file": "/tmp/x.status"}, "delay_seconds"),
        ({"delay_seconds": "soon", "status_file": "/tmp/x.status"}, "delay_seconds"),
        ({"delay_seconds": 1.0, "status_file": "/no/such/folder/x.status"}, "does not exist"),
    ],
)
def test_spawn_refuses_a_bad_payload_naming_the_field(payload, message):
    with pytest.raises(ValueError, match=message):
        actions.spawn_background_job(payload)


def test_background_job_reports_pending_then_ready_atomically(tmp_path):
    status_file = str(tmp_path / "bg.status")
    out, _ = actions.spawn_background_job({"delay_seconds": 1.0, "status_file": status_file})
    seen = []
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        tick, _ = actions.check_job_status_file({"status_file": status_file})
        seen.append(tick["job_status"])
        if tick["job_status"] == "READY":
            break
        time.sleep(0.05)
    assert seen[0] == "PENDING" and seen[-1] == "READY"
    assert set(seen) == {"PENDING", "READY"}  # every read parsed: writes are atomic
    artifact = Path(status_file + ".artifact.csv").read_bytes()
    assert tick["artifact_sha256"] == hashlib.sha256(artifact).hexdigest()
    assert tick["artifact_rows"] == artifact.count(b"\n") - 1
    actions.cleanup_job_status_file({"status_file": status_file, "outputs": {}})
    assert not background_is_running(out["worker_pid"], status_file)
    assert list(tmp_path.iterdir()) == []
