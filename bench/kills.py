"""Killed workers: how soon the jobs of a SIGKILLed `worker run` start again, at the defaults.

Each kill, on a fresh set of jobs in one database: a victim `worker run bench.kills` (default
settings: lease 15 s, concurrency 10) is started and `HELD` jobs enqueued, which it claims and
runs (`bench.hold`: its first attempt sleeps until killed); once the database shows it holding
all of them, a survivor `worker run bench.kills` is started and registers; then the victim's
process group is sent SIGKILL and the clock runs until the database shows every one of the
jobs claimed again (a second attempt, which returns at once). The survivor is stopped with
SIGTERM before the next kill. Nothing is judged dead in the first lease after the server
started, so the measure waits for the server to have run for one. Verified: every job started
again and completed, in exactly two attempts.

The figure is the distribution over the kills (min, p50, p90, max), in seconds.
"""

from __future__ import annotations

import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.harness import Server
from bench.libs.durable import VERSION
from worker import Context, task

DB = "bench_kills"
HELD = 10
LEASE_S = 15.0  # the default WORKER_LEASE_SECONDS, which the processes run with
TIMEOUT_S = 120.0
ROOT = Path(__file__).resolve().parents[1]
RESTARTED = (
    "SELECT count(*) FROM worker.jobs WHERE id = ANY(%s::uuid[]) AND retry_count = 1 "
    "AND status IN ('processing', 'completed')"
)


@task(name="bench.hold")
def hold(payload: dict[str, Any], ctx: Context) -> int:
    """Its first attempt holds a slot until the worker running it is killed."""
    while ctx.attempt == 1:
        time.sleep(0.1)
    return ctx.attempt


def _wait(what: str, check: Any, proc: subprocess.Popen[bytes] | None = None) -> float:
    """Poll `check` until it holds; the seconds it took."""
    started = time.perf_counter()
    while not check():
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"worker run exited with code {proc.returncode}: {what}")
        if time.perf_counter() - started > TIMEOUT_S:
            raise RuntimeError(f"timed out after {TIMEOUT_S:.0f} s waiting for {what}")
        time.sleep(0.01)
    return time.perf_counter() - started


def _worker(dsn: str, log: Path) -> subprocess.Popen[bytes]:
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("WORKER_")},
        "DATABASE_URL": dsn,
        "WORKER_LOG_LEVEL": "WARNING",
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    with open(log, "ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "worker", "run", "bench.kills"],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=ROOT,
            start_new_session=True,  # SIGKILL reaches its whole process group
        )


def _worker_id(server: Server, pid: int) -> Any:
    rows = server.query(DB, "SELECT id FROM worker.workers WHERE pid = %s", (pid,))
    return rows[0][0] if rows else None


def _one_kill(server: Server, dsn: str, log: Path) -> float:
    from worker import Client, JobSpec

    victim = _worker(dsn, log)
    survivor: subprocess.Popen[bytes] | None = None
    try:
        _wait("the victim to register", lambda: _worker_id(server, victim.pid), victim)
        victim_id = _worker_id(server, victim.pid)
        client = Client(dsn)
        try:
            ids = [
                j.job_id
                for j in client.enqueue_many([JobSpec("bench.hold", {"i": i}) for i in range(HELD)])
            ]
        finally:
            client.close()
        held = "SELECT count(*) FROM worker.jobs WHERE status = 'processing' AND worker_id = %s"
        _wait(
            f"the victim to hold {HELD} jobs",
            lambda: server.query(DB, held, (victim_id,))[0][0] == HELD,
            victim,
        )
        survivor = _worker(dsn, log)
        _wait("the survivor to register", lambda: _worker_id(server, survivor.pid), survivor)
        os.killpg(victim.pid, signal.SIGKILL)
        took = _wait(
            "the jobs to start again", lambda: server.query(DB, RESTARTED, (ids,))[0][0] == HELD
        )
        done = (
            "SELECT count(*) FROM worker.jobs WHERE id = ANY(%s::uuid[]) AND status = 'completed'"
        )
        _wait("the jobs to complete", lambda: server.query(DB, done, (ids,))[0][0] == HELD)
        return took
    finally:
        if victim.poll() is None:
            os.killpg(victim.pid, signal.SIGKILL)
        victim.wait(timeout=30)
        if survivor is not None:
            if survivor.poll() is None:
                os.killpg(survivor.pid, signal.SIGTERM)
            survivor.wait(timeout=60)


def measure(server: Server, kills: int, run: int) -> dict[str, Any]:
    """`kills` kills of a worker holding `HELD` jobs; the distribution of time-to-restart."""
    from worker.db import migrate

    rec: dict[str, Any] = dict(
        lib="durable",
        label=f"durable-worker {VERSION}",
        workload="kill_restart",
        run=run,
        kills=kills,
        config=f"`worker run` at the default settings (lease {LEASE_S:.0f} s, concurrency 10), "
        f"SIGKILL of a worker holding {HELD} jobs, a live worker beside it",
    )
    log = Path(tempfile.mkstemp(prefix="bench-kills-", suffix=".log")[1])
    try:
        server.reset(DB)
        dsn = server.dsn(DB)
        migrate.upgrade(dsn)
        up = f"SELECT pg_postmaster_start_time() < now() - interval '{LEASE_S + 1} s'"
        _wait("the server to have run for a lease", lambda: server.query(DB, up)[0][0])
        times = [_one_kill(server, dsn, log) for _ in range(kills)]
        (wrong,) = server.query(
            DB, "SELECT count(*) FROM worker.jobs WHERE status <> 'completed' OR retry_count <> 1"
        )[0]
        quantiles = statistics.quantiles(times, n=10, method="inclusive") if kills > 1 else times
        rec.update(
            samples_s=[round(t, 3) for t in times],
            min_s=round(min(times), 3),
            p50_s=round(statistics.median(times), 3),
            p90_s=round(quantiles[-1], 3),
            max_s=round(max(times), 3),
            value=round(statistics.median(times), 3),
            verified=wrong == 0,
            check=None if wrong == 0 else f"{wrong} jobs not completed in exactly two attempts",
        )
    except Exception as exc:
        rec.update(verified=False, error=f"{type(exc).__name__}: {exc}\n{log.read_text()[-2000:]}")
    finally:
        log.unlink(missing_ok=True)
    return rec


def section(records: list[dict[str, Any]]) -> list[str]:
    """The report's lines for the kills measured, if any."""
    found = [r for r in records if r["workload"] == "kill_restart" and r.get("verified")]
    lines: list[str] = []
    for r in found:
        lines += [
            f"Time to restart after a SIGKILL ({r['config']}), over {r['kills']} kills: "
            f"min {r['min_s']:.2f} s, p50 {r['p50_s']:.2f} s, p90 {r['p90_s']:.2f} s, "
            f"max {r['max_s']:.2f} s.",
            "",
        ]
    return lines
