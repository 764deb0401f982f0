"""Worker processes a test starts, each in its own session so it can be killed with its children.

What this does not do: it does not wait for a worker to be ready (tests wait for what they need,
see `support.waiting`).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# Timings short enough that a test sees a retry, a poll or a lease expire in a second or two.
QUICK = {
    "WORKER_POLL_MIN": "0.02",
    "WORKER_POLL_MAX": "0.5",
    "WORKER_RETRY_BACKOFF_BASE": "0.05",
    "WORKER_RETRY_BACKOFF_MAX": "0.5",
    "WORKER_LEASE_SECONDS": "3",
    "WORKER_SHUTDOWN_GRACE": "5",
}


def worker_env(
    database_url: str, *, drop: tuple[str, ...] = ("WORKER_",), **settings: str
) -> dict[str, str]:
    """Environment for `worker` subprocesses on `database_url`: quick timings, `tests/` on the
    path (so `worker run testtasks` finds the test tasks), and none of the caller's variables
    that start with one of `drop`; `settings` last, over all of it."""
    base = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
    return {
        **base,
        "DATABASE_URL": database_url,
        **QUICK,
        "PYTHONPATH": os.pathsep.join([str(ROOT / "tests"), str(ROOT)]),
        "PYTHONUNBUFFERED": "1",
        **settings,
    }


class Processes:
    """Worker processes started by a test; all are killed when the test ends."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp_path = tmp_path
        self.procs: list[subprocess.Popen[bytes]] = []

    def worker(
        self,
        env: dict[str, str],
        *modules: str,
        extra: dict[str, str] | None = None,
        args: tuple[str, ...] = (),
        prefix: tuple[str, ...] = (),
    ) -> subprocess.Popen[bytes]:
        """Start `worker run <modules>`, its output going to a log file of its own; `prefix`
        is a command that runs it (`ip netns exec NS`)."""
        log = open(self.tmp_path / f"worker-{len(self.procs)}.log", "wb")  # noqa: SIM115
        proc = subprocess.Popen(
            [*prefix, sys.executable, "-m", "worker", "run", *modules, *args],
            env={**env, **(extra or {})},
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=self.tmp_path,
            start_new_session=True,
        )
        proc.log_path = log.name  # type: ignore[attr-defined]
        self.procs.append(proc)
        return proc

    def log(self, proc: subprocess.Popen[bytes]) -> str:
        return Path(proc.log_path).read_text()  # type: ignore[attr-defined]

    def stop_all(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    kill_group(proc)
        for proc in self.procs:
            proc.wait(timeout=10)


def kill_group(proc: subprocess.Popen[bytes], sig: int = signal.SIGKILL) -> None:
    """Send `sig` to the process and everything it started (its session)."""
    os.killpg(proc.pid, sig)
