"""CPU-bound sync tasks: `worker run --processes 2` against `--processes 1`, in the same run.

Each job is the sync task `bench.cpu`: a fixed loop of pure-Python arithmetic, about 2 ms of
one core of the machine `docs/benchmarks.md` names (the same work however busy the machine, so
a slower machine shows as fewer jobs a second, not as shorter jobs; the report gives the
worker CPU a job measured with `--processes 1`). In one thread pool the GIL lets one of the
loops run at a time, whatever WORKER_CONCURRENCY is; a second process has a GIL of its own.

Method, the same for both: a fresh database, its `default` queue paused and loaded with the
jobs (untimed); the real `worker run bench.cpu --processes P` started, with the settings'
defaults and WARNING logging, until each of its P workers has registered; the clock starts when
the queue is resumed (which wakes the idle workers at once) and stops when the database shows
every job completed. Verified: every job completed with no attempt counted twice (a job run a
second time is one rescued or retried, and either counts an attempt), no error in the log, and
`worker run` exits 0 on SIGTERM. The cores the worker processes used (their CPU time over the
drain's) are recorded too: the ratio means something only when `--processes 1` used about one
core. On a machine shared with other logged-in sessions it does not: Linux's autogroup
scheduler gives each session (the benchmark and every process it starts are one) an equal share
of the CPUs, however many processes run in it. Beside each drain, `bare` runs the same loops in
plain processes with no queue: its 2-to-1 ratio is the ceiling of that moment. Each drain runs
twice, with the defaults and with `--pin-cpus` (each worker process on a CPU of its own).
"""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

import psycopg

from bench.harness import CpuMeter, Server, postmaster_of
from bench.libs.durable import VERSION
from worker import task

DB = "bench_cpu"
LOOPS = 18_000  # about 2 ms of one core of a 2-vCPU AMD EPYC, Python 3.11
BATCH = 1000
TIMEOUT_S = 300.0
COMPLETED = "SELECT count(*) FROM worker.jobs WHERE status = 'completed'"
ROOT = Path(__file__).resolve().parents[1]


@task(name="bench.cpu")
def spin(payload: dict[str, Any]) -> int:
    total = 0
    for i in range(LOOPS):
        total += i * i % 7
    return total


def _load(dsn: str, n: int) -> None:
    from worker import Client, JobSpec

    client = Client(dsn)
    try:
        client.pause_queue("default")
        for start in range(0, n, BATCH):
            specs = [JobSpec("bench.cpu", {"i": i}) for i in range(start, min(n, start + BATCH))]
            client.enqueue_many(specs)
    finally:
        client.close()


def _resume(dsn: str) -> None:
    from worker import Client

    client = Client(dsn)
    try:
        client.resume_queue("default")
    finally:
        client.close()


def measure(server: Server, n: int, procs: int, run: int, pinned: bool) -> dict[str, Any]:
    """One drain of `n` CPU-bound jobs by `worker run --processes procs`, `--pin-cpus` if
    `pinned`."""
    from worker.db import migrate

    rec: dict[str, Any] = dict(
        lib="durable",
        label=f"durable-worker {VERSION}",
        workload=f"cpu_{procs}p" + ("_pinned" if pinned else ""),
        run=run,
        procs=procs,
        config=f"`worker run bench.cpu --processes {procs}{' --pin-cpus' if pinned else ''}`, "
        f"sync tasks of {LOOPS:,} loops of pure Python, concurrency 10 per process, WARNING "
        "logging",
    )
    log_path = Path(tempfile.mkstemp(prefix="bench-cpu-", suffix=".log")[1])
    proc: subprocess.Popen[bytes] | None = None
    try:
        server.reset(DB)
        dsn = server.dsn(DB)
        migrate.upgrade(dsn)
        _load(dsn, n)
        server.settle(DB)
        env = {
            **{k: v for k, v in os.environ.items() if not k.startswith("WORKER_")},
            "DATABASE_URL": dsn,
            "WORKER_LOG_LEVEL": "WARNING",
            "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
        }
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", "worker", "run", "bench.cpu", "--processes", str(procs)]
                + (["--pin-cpus"] if pinned else []),
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=ROOT,
            )
        pids = _registered(server, procs, proc)
        supervisor = [proc.pid] if procs > 1 else []
        cpu = CpuMeter(pids + supervisor, postmaster_of(server.admin))
        # One kept connection: a new one per look would cost the server a process each time.
        with psycopg.connect(dsn, autocommit=True) as conn:
            cpu.start()
            t0 = time.perf_counter()
            _resume(dsn)
            done = 0
            while time.perf_counter() - t0 < TIMEOUT_S:
                row = conn.execute(COMPLETED).fetchone()
                done = row[0] if row else 0
                if done >= n:
                    break
                time.sleep(0.05)
            el = time.perf_counter() - t0
        rec.update(cpu.stop(n))
        rec["worker_cores"] = round(rec["worker_cpu_ms_per_job"] * n / 1000 / el, 2)
        if "server_cpu_ms_per_job" in rec:
            rec["server_cores"] = round(rec["server_cpu_ms_per_job"] * n / 1000 / el, 2)
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=60)
        twice = server.scalar(DB, "SELECT count(*) FROM worker.jobs WHERE retry_count > 0")
        text = log_path.read_text(errors="replace")
        errors = [ln for ln in text.splitlines() if "ERROR" in ln or "Traceback" in ln]
        rec.update(
            value=round(done / el, 1),
            unit="jobs/s",
            n=n,
            elapsed_s=round(el, 3),
            verified=done == n and twice == 0 and code == 0 and not errors,
            check=f"db_completed={done} attempts_counted_twice={twice} exit_code={code}"
            + (f" log_errors={errors[:3]}" if errors else ""),
        )
    except Exception:
        rec.update(value=None, verified=False, error=traceback.format_exc()[-3000:])
    finally:
        if proc is not None and proc.poll() is None:
            proc.kill()  # the workers it started stop by themselves once it is gone
            proc.wait()
        log_path.unlink(missing_ok=True)
        server.drop(DB)
    return rec


def _spin_many(count: int, ready: Any, go: Any) -> None:
    ready.release()
    go.wait()
    for _ in range(count):
        spin({})


def bare(n: int, procs: int, run: int) -> dict[str, Any]:
    """The ceiling: the same `n` loops split over `procs` bare processes, no queue at all.

    Their 2-to-1 ratio is what the machine gives two processes at that moment; a shared or
    throttled machine shows it here first."""
    rec: dict[str, Any] = dict(
        lib="bare_processes",
        label="bare processes",
        workload=f"cpu_{procs}p",
        run=run,
        procs=procs,
        config=f"the same loop in {procs} plain processes (multiprocessing), no queue",
    )
    ctx = mp.get_context("spawn")
    ready, go = ctx.Semaphore(0), ctx.Event()
    shares = [n // procs + (1 if k < n % procs else 0) for k in range(procs)]
    workers = [ctx.Process(target=_spin_many, args=(c, ready, go)) for c in shares]
    for w in workers:
        w.start()
    for _ in workers:
        ready.acquire()
    t0 = time.perf_counter()
    go.set()
    for w in workers:
        w.join()
    el = time.perf_counter() - t0
    ok = all(w.exitcode == 0 for w in workers)
    rec.update(value=round(n / el, 1), unit="jobs/s", n=n, elapsed_s=round(el, 3), verified=ok)
    return rec


def _registered(server: Server, procs: int, proc: subprocess.Popen[bytes]) -> list[int]:
    """The pids of the worker processes, once all `procs` have registered."""
    deadline = time.perf_counter() + 120
    while time.perf_counter() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"worker run exited with code {proc.returncode} before it was up")
        rows = server.query(DB, "SELECT pid FROM worker.workers")
        if len(rows) == procs:
            return [pid for (pid,) in rows]
        time.sleep(0.05)
    raise RuntimeError(f"{procs} workers did not register within 120 s")
