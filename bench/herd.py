"""Idle workers on a trickle: what a fleet of idle `worker run` processes costs the server.

For each fleet size in `FLEETS`, in a fresh database: that many `worker run bench.herd`
processes are started (default settings: concurrency 10), each under its own application
name, and left to settle idle; then `jobs` jobs are inserted by plain SQL, one every
`INTERVAL_S`, each waiting for none. The figures, per fleet size: the server's CPU per job
(the postmaster and every backend, from their process times: `bench.harness.CpuMeter`), the
insert -> start p50 (`started_at` less `created_at`), and the most sessions one process held
(`pg_stat_activity` by application name, sampled throughout). Verified: every job completed
once. The ratio of the server's CPU per job, many processes to one, is the herd's price.

It needs the server on this machine (its process times); elsewhere the CPU is left out.
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

from bench.harness import CpuMeter, Server, postmaster_of
from bench.libs.durable import VERSION
from worker import task

DB = "bench_herd"
FLEETS = (1, 12)
INTERVAL_S = 0.05  # between two inserts of the trickle
TIMEOUT_S = 120.0
ROOT = Path(__file__).resolve().parents[1]
SESSIONS = (
    "SELECT max(n) FROM (SELECT count(*) AS n FROM pg_stat_activity "
    "WHERE application_name LIKE 'bench-herd-%' GROUP BY application_name) s"
)
DONE = "SELECT count(*) FROM worker.jobs WHERE status = 'completed'"


@task(name="bench.herd_noop")
def noop(payload: dict[str, Any]) -> None:
    return None


def _worker(dsn: str, i: int, log: Path) -> subprocess.Popen[bytes]:
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("WORKER_")},
        "DATABASE_URL": dsn,
        "PGAPPNAME": f"bench-herd-{i}",
        "WORKER_LOG_LEVEL": "WARNING",
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    with open(log, "ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "worker", "run", "bench.herd"],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=ROOT,
            start_new_session=True,
        )


def _wait(what: str, check: Any) -> None:
    started = time.perf_counter()
    while not check():
        if time.perf_counter() - started > TIMEOUT_S:
            raise RuntimeError(f"timed out after {TIMEOUT_S:.0f} s waiting for {what}")
        time.sleep(0.05)


def _fleet(server: Server, n: int, jobs: int, log: Path) -> dict[str, Any]:
    """One fleet of `n` idle processes on a trickle of `jobs`: its figures."""
    from worker.db import migrate

    server.reset(DB)
    dsn = server.dsn(DB)
    migrate.upgrade(dsn)
    procs = [_worker(dsn, i, log) for i in range(n)]
    try:
        listening = (
            "SELECT count(*) FROM pg_stat_activity "
            "WHERE application_name LIKE 'bench-herd-%' AND query LIKE 'LISTEN%'"
        )
        _wait(f"{n} workers to listen", lambda: server.query(DB, listening)[0][0] == n)
        time.sleep(3)  # their start-up claims and duties settle, as an idle fleet's would
        sessions = [int(server.query(DB, SESSIONS)[0][0] or 0)]
        meter = CpuMeter([p.pid for p in procs], postmaster_of(server.dsn("postgres")))
        meter.start()
        for _ in range(jobs):
            server.query(
                DB, "INSERT INTO worker.jobs (task, payload) VALUES ('bench.herd_noop', '{}')"
            )
            sessions.append(int(server.query(DB, SESSIONS)[0][0] or 0))
            time.sleep(INTERVAL_S)
        _wait("the trickle to complete", lambda: server.query(DB, DONE)[0][0] == jobs)
        cpu = meter.stop(jobs)
        delays = [
            float(d)
            for (d,) in server.query(
                DB, "SELECT extract(epoch FROM started_at - created_at) FROM worker.jobs"
            )
        ]
        (once,) = server.query(
            DB, "SELECT count(*) = %s FROM worker.jobs WHERE retry_count = 0", (jobs,)
        )[0]
        return {
            "processes": n,
            "server_cpu_ms_per_job": cpu.get("server_cpu_ms_per_job"),
            "p50_ms": round(1000 * statistics.median(delays), 2),
            "sessions_per_process": max(sessions),
            "once": bool(once),
        }
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
        for p in procs:
            try:
                p.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(timeout=30)


def measure(server: Server, jobs: int, run: int) -> dict[str, Any]:
    """The trickle on each fleet size of `FLEETS`, side by side."""
    rec: dict[str, Any] = dict(
        lib="durable",
        label=f"durable-worker {VERSION}",
        workload="herd",
        run=run,
        jobs=jobs,
        config=f"`worker run` at the default settings (concurrency 10), idle, {jobs} plain-SQL "
        f"inserts {INTERVAL_S * 1000:.0f} ms apart",
    )
    log = Path(tempfile.mkstemp(prefix="bench-herd-", suffix=".log")[1])
    try:
        fleets = [_fleet(server, n, jobs, log) for n in FLEETS]
        one, many = fleets[0], fleets[-1]
        ratio = None
        if one["server_cpu_ms_per_job"] and many["server_cpu_ms_per_job"] is not None:
            ratio = round(many["server_cpu_ms_per_job"] / one["server_cpu_ms_per_job"], 2)
        rec.update(
            fleets=fleets,
            cpu_ratio=ratio,
            value=ratio,
            verified=all(f["once"] for f in fleets),
            check=None if all(f["once"] for f in fleets) else "a job ran more than once",
        )
    except Exception as exc:
        rec.update(verified=False, error=f"{type(exc).__name__}: {exc}\n{log.read_text()[-2000:]}")
    finally:
        log.unlink(missing_ok=True)
    return rec


def section(records: list[dict[str, Any]]) -> list[str]:
    """The report's lines for the herd measured, if any."""
    lines: list[str] = []
    for r in (r for r in records if r["workload"] == "herd" and r.get("verified")):
        lines += [f"Idle processes on a trickle ({r['config']}):", ""]
        lines += [
            "| processes | server CPU per job (ms) | insert -> start p50 (ms) | "
            "most sessions one process held |",
            "|---|---|---|---|",
        ]
        for f in r["fleets"]:
            lines.append(
                f"| {f['processes']} | {f['server_cpu_ms_per_job']} | {f['p50_ms']} | "
                f"{f['sessions_per_process']} |"
            )
        lines += ["", f"Server CPU per job, {FLEETS[-1]} processes to 1: {r['cpu_ratio']}x.", ""]
    return lines
