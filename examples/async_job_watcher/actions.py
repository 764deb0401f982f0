"""The async job watcher's four actions, one per stage.

Each takes the job's payload, `{"delay_seconds": 1.0, "status_file": "/abs/path"}`, plus
`outputs` (what the earlier stages returned, by stage name), and returns `(out_dict, msg)`:
`out_dict` is the stage's output, `msg` a line for the log. They raise `RuntimeError` (or
`ValueError` for a bad payload) with a message naming the problem.

    out, msg = spawn_background_job({"delay_seconds": 1.0, "status_file": "/tmp/x.status"})
    out, msg = check_job_status_file({..., "outputs": {"spawn_background_job": out}})

The files of one job: `status_file`, `status_file + ".tmp"` (the atomic-write scratch file) and
the artifact `status_file + ".artifact.csv"`. `cleanup_job_status_file` stops the background
process if it still runs and removes all three; it is idempotent, as every ALL_DONE cleanup
must be (it runs again after a lost worker).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from examples.async_job_watcher.background import ExportStatus, artifact_path

BACKGROUND_SCRIPT = str(Path(__file__).with_name("background.py"))
MAX_DELAY_SECONDS = 3600.0

Payload = dict[str, Any]


def _status_file(payload: Payload) -> str:
    status_file = payload.get("status_file")
    if not isinstance(status_file, str) or not status_file:
        raise ValueError('payload["status_file"] must be a non-empty path string')
    if not os.path.isabs(status_file):
        # The worker's working directory is not the enqueuer's: a relative path would point
        # somewhere else.
        raise ValueError(f'payload["status_file"] must be an absolute path, not {status_file!r}')
    return status_file


def _delay(payload: Payload) -> float:
    delay = payload.get("delay_seconds", 1.0)
    if (
        isinstance(delay, bool)
        or not isinstance(delay, int | float)
        or not math.isfinite(delay)
        or not 0 <= delay <= MAX_DELAY_SECONDS
    ):
        raise ValueError(
            f'payload["delay_seconds"] must be a number from 0 to {MAX_DELAY_SECONDS:.0f}, '
            f"not {delay!r}"
        )
    return float(delay)


def _read_status(status_file: str) -> dict[str, Any] | None:
    try:
        with open(status_file, encoding="utf-8") as f:
            data = json.load(f)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise RuntimeError(f"status file {status_file} cannot be read: {exc}") from None
    if not isinstance(data, dict):
        raise RuntimeError(f"status file {status_file} does not hold a JSON object")
    return data


def _is_background_job(pid: object, status_file: str) -> bool:
    """True if `pid` is a live background export for `status_file` (never some other process
    that got the pid later)."""
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 1:
        return False
    proc = Path(f"/proc/{pid}/cmdline")
    if Path("/proc/self").exists():
        try:
            args = proc.read_bytes().split(b"\0")
        except OSError:
            return False
        command = [a.decode(errors="replace") for a in args if a]
    else:
        found = subprocess.run(
            ["ps", "-p", str(pid), "-o", "command="], capture_output=True, text=True, check=False
        )
        command = found.stdout.split()
    return status_file in command and any(a.endswith("background.py") for a in command)


def _sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 16), b""):
            digest.update(block)
    return digest.hexdigest()


def spawn_background_job(payload: Payload) -> tuple[dict[str, Any], str]:
    """Stage 1: start the detached export process; returns once its first status is on disk.

    out, msg = spawn_background_job({"delay_seconds": 1.0, "status_file": "/tmp/e.status"})
    # out == {"status_file": "/tmp/e.status", "target_delay_seconds": 1.0, "worker_pid": 4242}
    """
    status_file = _status_file(payload)
    delay = _delay(payload)
    if not Path(status_file).parent.is_dir():
        raise ValueError(f"the folder of status_file {status_file} does not exist")
    current = _read_status(status_file)
    if current is not None and _is_background_job(current.get("pid"), status_file):
        raise RuntimeError(
            f"status file {status_file} belongs to a background job that still runs "
            f"(pid {current['pid']}): use another status_file"
        )
    started = subprocess.run(
        [sys.executable, BACKGROUND_SCRIPT, status_file, repr(delay)],
        capture_output=True,
        text=True,
        start_new_session=True,
        check=False,
        timeout=30,
    )
    if started.returncode != 0 or not started.stdout.strip().isdigit():
        raise RuntimeError(
            f"the background job did not start (exit code {started.returncode}): "
            f"{started.stderr.strip() or started.stdout.strip() or 'no output'}"
        )
    pid = int(started.stdout.strip())
    out = {"status_file": status_file, "target_delay_seconds": delay, "worker_pid": pid}
    return out, f"background job {pid} started; it reports to {status_file}"


def check_job_status_file(payload: Payload) -> tuple[dict[str, Any], str]:
    """Stage 2, one tick: read the status file the background job writes.

    Raises if the file is gone (a cleanup removed it: the background job cannot be found
    again), if the job reported a failure, or if it died before it was READY.
    """
    status_file = _status_file(payload)
    data = _read_status(status_file)
    if data is None:
        raise RuntimeError(
            f"status file {status_file} is missing: the background job's files were cleaned "
            "up (or never written), so its result cannot be collected; enqueue a new job"
        )
    job_status = str(data.get("job_status", ""))
    if job_status == ExportStatus.FAILED:
        raise RuntimeError(f"the background job failed: {data.get('error') or 'no reason given'}")
    if job_status == ExportStatus.PENDING and not _is_background_job(data.get("pid"), status_file):
        raise RuntimeError(
            f"the background job (pid {data.get('pid')}) is gone but its status is still "
            "PENDING: it died before finishing"
        )
    if job_status not in (ExportStatus.PENDING, ExportStatus.READY):
        raise RuntimeError(f"status file {status_file} has an unknown status {job_status!r}")
    out = {
        "job_status": job_status,
        "progress_pct": int(data.get("progress_pct", 0)),
        "artifact_rows": int(data.get("artifact_rows", 0)),
        "artifact_sha256": str(data.get("artifact_sha256", "")),
    }
    return out, f"background job {job_status}: {out['progress_pct']}%, {out['artifact_rows']} rows"


def verify_exported_artifact(payload: Payload) -> tuple[dict[str, Any], str]:
    """Stage 3: the artifact has rows and its SHA-256 on disk is the one the job reported.

    Raises `RuntimeError` when rows <= 0, the checksum is empty, the artifact is missing or
    its checksum does not match the file on disk (it changed after the export).
    """
    status_file = _status_file(payload)
    ready = payload.get("outputs", {}).get("await_job_completion")
    if not isinstance(ready, dict):
        raise RuntimeError("no output from await_job_completion to verify")
    rows = ready.get("artifact_rows", 0)
    expected = ready.get("artifact_sha256", "")
    if not isinstance(rows, int) or rows <= 0:
        raise RuntimeError(f"the export reported {rows!r} rows: nothing was exported")
    if not expected:
        raise RuntimeError("the export reported an empty checksum: the artifact cannot be trusted")
    artifact = artifact_path(status_file)
    if not os.path.exists(artifact):
        raise RuntimeError(f"the artifact {artifact} is missing")
    actual = _sha256(artifact)
    if actual != expected:
        raise RuntimeError(
            f"the artifact {artifact} does not match its checksum: the export reported "
            f"sha256 {expected}, the file on disk has {actual} (it changed after the export)"
        )
    out = {"verified": True, "artifact_rows": rows, "artifact_sha256": expected}
    return out, f"artifact verified: {rows} rows, sha256 {expected}"


def cleanup_job_status_file(payload: Payload) -> tuple[dict[str, Any], str]:
    """Stage 4 (ALL_DONE): stop the background job if it still runs, remove its files.

    Idempotent: safe to run any number of times, with files already gone.
    """
    status_file = _status_file(payload)
    pids = set()
    spawned = payload.get("outputs", {}).get("spawn_background_job")
    if isinstance(spawned, dict):
        pids.add(spawned.get("worker_pid"))
    try:
        current = _read_status(status_file)
    except RuntimeError:
        current = None  # unreadable: it is removed below all the same
    if current is not None:
        pids.add(current.get("pid"))
    stopped = []
    for pid in pids:
        # Stop it first, or it would write its status again after we removed it.
        if _is_background_job(pid, status_file):
            _stop(pid, status_file)  # type: ignore[arg-type]
            stopped.append(pid)
    removed = []
    for path in (status_file, status_file + ".tmp", artifact_path(status_file)):
        try:
            os.remove(path)
            removed.append(path)
        except FileNotFoundError:
            pass
    out = {"removed": removed, "stopped_pids": stopped}
    return out, f"removed {len(removed)} files, stopped {len(stopped)} background jobs"


def _stop(pid: int, status_file: str, grace: float = 2.0) -> None:
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, grace)):
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            if not _is_background_job(pid, status_file):
                return
            time.sleep(0.02)
