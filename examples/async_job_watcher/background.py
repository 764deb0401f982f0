"""The background export job the watcher spawns: a separate, detached process.

    python background.py STATUS_FILE DELAY_SECONDS

It detaches (double fork, new session: it outlives the worker that started it and is never
its zombie), prints its pid, then writes an artifact of CSV rows little by little over
`DELAY_SECONDS`, reporting in STATUS_FILE:

    {"job_status": "PENDING", "progress_pct": 40, "artifact_rows": 400, "artifact_sha256": "", ...}
    {"job_status": "READY", "progress_pct": 100, "artifact_rows": 1000, "artifact_sha256": "9f…"}

Every status write is atomic (write STATUS_FILE.tmp, then rename it over STATUS_FILE), so a
reader never sees half a file. The checksum is of the bytes this process wrote, so an artifact
changed by anyone else no longer matches it. Standard library only: it runs with any Python.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from enum import StrEnum
from pathlib import Path

ROWS_PER_TICK = 100
TICKS = 10


class ExportStatus(StrEnum):
    """Where the export is, as the status file's `job_status` says."""

    PENDING = "PENDING"  # still writing the artifact
    READY = "READY"  # the artifact is complete; `artifact_sha256` is its checksum
    FAILED = "FAILED"  # the export stopped; `error` says why


def artifact_path(status_file: str) -> str:
    """Where the export for `status_file` is written (next to it)."""
    return status_file + ".artifact.csv"


def write_status(status_file: str, status: dict[str, object]) -> None:
    """Replace the status file atomically: readers see the old content or the new, never half."""
    tmp = status_file + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(status, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, status_file)


def status(
    job_status: ExportStatus, pct: int, rows: int, sha: str, error: str | None = None
) -> dict[str, object]:
    return {
        "job_status": job_status,
        "progress_pct": pct,
        "artifact_rows": rows,
        "artifact_sha256": sha,
        "pid": os.getpid(),
        "error": error,
    }


def export(status_file: str, delay: float) -> None:
    """Write the artifact over `delay` seconds, then mark the status READY with its checksum."""
    artifact = artifact_path(status_file)
    digest = hashlib.sha256()
    rows = 0
    header = b"row,value\n"
    with open(artifact, "wb") as f:
        f.write(header)
    digest.update(header)
    for tick in range(TICKS):
        time.sleep(delay / TICKS)
        chunk = b"".join(
            f"{rows + i + 1},{(rows + i + 1) * 7919 % 10007}\n".encode()
            for i in range(ROWS_PER_TICK)
        )
        # Appended, not rewritten: whatever someone else adds stays in the file.
        with open(artifact, "ab") as f:
            f.write(chunk)
        digest.update(chunk)
        rows += ROWS_PER_TICK
        if tick < TICKS - 1:
            write_status(
                status_file, status(ExportStatus.PENDING, (tick + 1) * 100 // TICKS, rows, "")
            )
    write_status(status_file, status(ExportStatus.READY, 100, rows, digest.hexdigest()))


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print("usage: background.py STATUS_FILE DELAY_SECONDS", file=sys.stderr)
        return 2
    status_file, delay = argv[1], float(argv[2])
    ready_r, ready_w = os.pipe()
    pid = os.fork()
    if pid > 0:
        # The intermediate process: report the export's pid once its first status is on disk,
        # then exit, so the export is adopted by init and never waits as a zombie.
        os.close(ready_w)
        ok = os.read(ready_r, 1) == b"1"
        print(pid, flush=True)
        return 0 if ok else 1
    os.close(ready_r)
    os.setsid()
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):  # let go of the spawner's pipes: it reads our pid until EOF
        os.dup2(devnull, fd)
    try:
        Path(artifact_path(status_file)).unlink(missing_ok=True)
        write_status(status_file, status(ExportStatus.PENDING, 0, 0, ""))
        os.write(ready_w, b"1")
        os.close(ready_w)
        export(status_file, delay)
    except Exception as exc:
        write_status(
            status_file, status(ExportStatus.FAILED, 0, 0, "", f"{type(exc).__name__}: {exc}")
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
