"""The measuring harness: one method for every library (after `peer-bench/peers/METHOD.md`).

Timing rules, identical for every library:
  * every measurement starts from a freshly created database with the library's schema
    installed through its own API, then ANALYZE + CHECKPOINT before the clock starts;
  * enqueue: one client, one coroutine, timed from the first call to the last return (the
    producer's connection or pool is opened before the clock starts);
  * drain: N jobs bulk-loaded (untimed), worker process(es) spawned and imported before the
    clock starts; the clock starts when the workers are told to go and stops when the database
    shows every job finished;
  * latency: one idle worker process; the parent enqueues LAT_WARMUP jobs, pauses, then LAT_N
    timed jobs, one call each, on a fixed 20 ms schedule; latency = job start (perf_counter in
    the worker) - the instant just before the enqueue call (perf_counter in the parent:
    CLOCK_MONOTONIC is system-wide on Linux). The first warm-up job is reported apart.
Every measurement checks that each job ran exactly once (per-id execution counts collected from
the workers) and that the library's own table agrees.
"""

from __future__ import annotations

import asyncio
import importlib
import math
import multiprocessing as mp
import os
import sys
import tempfile
import time
import traceback
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import psycopg

CONCURRENCY = 10
BULK_BATCH = 1000
# The enqueue workloads run the libraries in turns of this many single calls (or of one
# batch): a commit's wait for the disk drifts from one stretch of seconds to the next, and in
# turns the drift falls on every library alike (docs/benchmarks.md, "Enqueues in turns").
SINGLE_TURN = 1000
LAT_N = 200
LAT_GAP_S = 0.020
# Jobs sent before the timed ones, then a pause: a worker's first jobs pay for its statements'
# first use (PgQueuer's first 3 or 4, on this 2-core machine), and with 200 samples the p99 is
# the 3rd-worst, so without them it measured the warm-up of some libraries, not their latency.
LAT_WARMUP = 5
LAT_WARMUP_PAUSE_S = 1.0
DRAIN_TIMEOUT_S = 300.0


def arun(coro: Awaitable[Any]) -> Any:
    """asyncio.run, or uvloop.run when BENCH_UVLOOP=1 (the same loop for every library)."""
    if os.environ.get("BENCH_UVLOOP") == "1":
        import uvloop

        return uvloop.run(coro)  # type: ignore[arg-type]
    return asyncio.run(coro)  # type: ignore[arg-type]


# -- databases -------------------------------------------------------------------------------


class Server:
    """Where the measurement databases are created: `admin` is a URL of the server's `postgres`
    database; `dsn(db)` names another database on the same server."""

    def __init__(self, admin: str) -> None:
        self.admin = admin

    def dsn(self, db: str) -> str:
        base, _, tail = self.admin.rpartition("/")
        query = tail.partition("?")[2]
        return f"{base}/{db}" + (f"?{query}" if query else "")

    def reset(self, db: str, template: str | None = None) -> None:
        with psycopg.connect(self.admin, autocommit=True) as c:
            c.execute(f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)')
            if template:
                c.execute(f'CREATE DATABASE "{db}" TEMPLATE "{template}" STRATEGY FILE_COPY')
            else:
                c.execute(f'CREATE DATABASE "{db}"')

    def drop(self, db: str) -> None:
        with psycopg.connect(self.admin, autocommit=True) as c:
            c.execute(f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)')

    def query(self, db: str, sql: str, params: Any = None) -> list[tuple[Any, ...]]:
        with psycopg.connect(self.dsn(db), autocommit=True) as c:
            cur = c.execute(sql, params)
            return cur.fetchall() if cur.description else []

    def scalar(self, db: str, sql: str) -> Any:
        return self.query(db, sql)[0][0]

    def settle(self, db: str) -> None:
        """The same neutral housekeeping before every timed phase."""
        self.query(db, "ANALYZE")
        self.query(db, "CHECKPOINT")


# -- adapters --------------------------------------------------------------------------------


@dataclass
class Adapter:
    """What the harness needs from one library. The worker side lives in `module`, as
    module-level `async start_worker(dsn, concurrency, variant)` / `async stop_worker(handle)`,
    so that spawned processes can import it; the job must call `harness.on_job(i)` first."""

    lib: str  # key, e.g. "pgqueuer"
    label: str  # shown in the table, e.g. "PgQueuer 1.6.0"
    config: str
    module: str
    install: Callable[[str], Awaitable[None]]  # (dsn) -> schema installed
    open_producer: Callable[[str], Awaitable[Any]]  # -> enqueue(i), enqueue_many(ids), close()
    single_note: str
    bulk_note: str
    count_jobs_sql: str
    unfinished_sql: str
    succeeded_sql: str
    variants: dict[str, Callable[[str], Awaitable[None]] | None] = field(default_factory=dict)


# -- the worker processes --------------------------------------------------------------------

_counter: Any = None
_starts: Any = None
_seen = bytearray()


def on_job(i: int) -> None:
    """Called first thing inside every benchmark job: records that job `i` ran (and when)."""
    if _starts is not None:
        _starts[i] = time.perf_counter()
    _seen[i] += 1  # a preallocated count per id: constant memory, however many jobs run
    with _counter.get_lock():
        _counter.value += 1


def _child_main(
    module: str,
    dsn: str,
    concurrency: int,
    variant: str | None,
    n: int,
    log_path: str,
    shared: dict[str, Any],
    idx: int,
) -> None:
    global _counter, _starts, _seen
    # Worker logs go to a file, as a deployed worker's go to a file or a journal.
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 2)
    os.close(fd)
    _counter = shared["counter"]
    _starts = shared["starts"]
    _seen = bytearray(n)
    err = None
    try:
        mod = importlib.import_module(module)
        arun(_child_async(mod, dsn, concurrency, variant, shared))
    except BaseException:  # reported to the parent
        err = traceback.format_exc()
    shared["results"].put((idx, bytes(_seen), err))


async def _child_async(
    mod: Any, dsn: str, concurrency: int, variant: str | None, shared: dict[str, Any]
) -> None:
    loop = asyncio.get_running_loop()
    shared["ready"].release()
    await loop.run_in_executor(None, shared["go"].wait)
    handle = await mod.start_worker(dsn, concurrency, variant)
    shared["started"].release()
    await loop.run_in_executor(None, shared["stop"].wait)
    await mod.stop_worker(handle)


class Workers:
    """N worker processes (spawned, so nothing is shared by fork)."""

    def __init__(
        self,
        adapter: Adapter,
        dsn: str,
        procs: int,
        variant: str | None,
        n: int,
        record_starts: bool = False,
    ) -> None:
        ctx = mp.get_context("spawn")
        self.logdir = tempfile.mkdtemp(prefix="bench-logs-")
        self.shared: dict[str, Any] = dict(
            counter=ctx.Value("q", 0),
            starts=ctx.Array("d", n, lock=False) if record_starts else None,
            ready=ctx.Semaphore(0),
            started=ctx.Semaphore(0),
            go=ctx.Event(),
            stop=ctx.Event(),
            results=ctx.Queue(),
        )
        self.n = n
        self.procs = [
            ctx.Process(
                target=_child_main,
                args=(
                    adapter.module,
                    dsn,
                    CONCURRENCY,
                    variant,
                    n,
                    os.path.join(self.logdir, f"worker-{k}.log"),
                    self.shared,
                    k,
                ),
                daemon=True,
            )
            for k in range(procs)
        ]

    def spawn_and_wait_ready(self) -> None:
        for p in self.procs:
            p.start()
        for _ in self.procs:
            if not self.shared["ready"].acquire(timeout=120):
                raise RuntimeError("worker process did not become ready")
        self.profilers = []
        if os.environ.get("BENCH_PROFILE"):
            # BENCH_PROFILE=dir: py-spy records every worker process (collapsed stacks).
            import subprocess

            out = os.environ["BENCH_PROFILE"]
            os.makedirs(out, exist_ok=True)
            spy = os.path.join(os.path.dirname(sys.executable), "py-spy")
            for p in self.procs:
                cmd = [spy, "record", "-r", "250", "-f", "raw", "-p", str(p.pid)]
                cmd += ["-o", os.path.join(out, f"worker-{p.pid}.txt")]
                self.profilers.append(
                    subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                )
            time.sleep(1.0)  # let py-spy attach before the clock starts

    def go(self) -> float:
        t = time.perf_counter()
        self.shared["go"].set()
        return t

    def wait_started(self, timeout: float = 60) -> None:
        for _ in self.procs:
            if not self.shared["started"].acquire(timeout=timeout):
                raise RuntimeError("worker did not start")

    @property
    def count(self) -> int:
        return int(self.shared["counter"].value)

    def stop_and_collect(self, timeout: float = 60) -> list[int]:
        """Stop the workers; return how many times each job id ran (summed over processes)."""
        self.shared["stop"].set()
        counts = [0] * self.n
        errs = []
        for _ in self.procs:
            idx, seen, err = self.shared["results"].get(timeout=timeout)
            for i, c in enumerate(seen):
                if c:
                    counts[i] += c
            if err:
                errs.append(f"worker {idx}: {err}")
        self._join(timeout)
        if errs:
            raise RuntimeError("\n".join(errs))
        return counts

    def log_errors(self) -> list[str]:
        """Lines of the workers' logs that report an error (a clean run has none)."""
        bad = []
        for name in sorted(os.listdir(self.logdir)):
            with open(os.path.join(self.logdir, name), errors="replace") as f:
                bad += [ln.rstrip() for ln in f if "ERROR" in ln or "Traceback" in ln]
        return bad

    def _join(self, timeout: float) -> None:
        for prof in getattr(self, "profilers", []):
            prof.wait(timeout=30)  # py-spy writes its output when the process exits
        for p in self.procs:
            p.join(timeout=timeout)
            if p.is_alive():  # our own child, by its handle
                p.terminate()
                p.join(5)

    def kill(self) -> None:
        self.shared["stop"].set()
        self._join(20)

    def cleanup(self) -> None:
        for name in os.listdir(self.logdir):
            os.unlink(os.path.join(self.logdir, name))
        os.rmdir(self.logdir)


def exactly_once(counts: list[int]) -> tuple[bool, str]:
    runs = sum(counts)
    missing = sum(1 for c in counts if c == 0)
    twice = sum(1 for c in counts if c > 1)
    ok = missing == 0 and twice == 0
    return ok, f"executions={runs} missing={missing} repeated={twice} expected={len(counts)}"


def pct(sorted_vals: list[float], p: float) -> float:
    """Nearest-rank percentile."""
    k = max(1, math.ceil(p / 100 * len(sorted_vals)))
    return sorted_vals[k - 1]


def rss_mb(pid: int) -> float | None:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


# -- where the CPU goes ----------------------------------------------------------------------

_TICKS = os.sysconf("SC_CLK_TCK")


def _proc_stat(pid: int | str) -> list[str] | None:
    """The fields of /proc/PID/stat after the command name (so index 0 is field 3, the state)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()
    except OSError:
        return None


def cpu_seconds(pid: int) -> float:
    """User + system CPU time a live process has used so far (0 if it is gone)."""
    stat = _proc_stat(pid)
    return (int(stat[11]) + int(stat[12])) / _TICKS if stat else 0.0


def postmaster_of(admin_dsn: str) -> int | None:
    """The PID of the server's postmaster when it runs on this machine, else None."""
    with psycopg.connect(admin_dsn, autocommit=True) as c:
        row = c.execute("SELECT pg_backend_pid()").fetchone()
        # Read while the session lives: once closed, its backend exits and its entry goes.
        stat = _proc_stat(row[0]) if row else None
    if stat is None:  # a server elsewhere: its backend's PID means nothing here
        return None
    parent = int(stat[1])
    try:
        with open(f"/proc/{parent}/comm") as f:
            return parent if f.read().strip() in ("postgres", "postmaster") else None
    except OSError:
        return None


def server_cpu_seconds(postmaster: int) -> float:
    """CPU time of the whole server so far: the postmaster, its live processes, and those
    that have exited (the postmaster reaped them, so their time is in its children's fields)."""
    stat = _proc_stat(postmaster)
    if stat is None:
        return 0.0
    total = sum(int(stat[i]) for i in (11, 12, 13, 14))
    for name in os.listdir("/proc"):
        if name.isdigit():
            child = _proc_stat(name)
            if child is not None and child[1] == str(postmaster):
                total += int(child[11]) + int(child[12])
    return total / _TICKS


def machine_ticks() -> tuple[int, int, int]:
    """Busy, steal and total ticks of all CPUs since boot (/proc/stat)."""
    with open("/proc/stat") as f:
        user, nice, system, idle, iowait, irq, softirq, steal = map(int, f.readline().split()[1:9])
    busy = user + nice + system + irq + softirq
    return busy, steal, busy + steal + idle + iowait


class CpuMeter:
    """CPU used by the worker processes and by the server between `start()` and `stop()`."""

    def __init__(self, worker_pids: list[int], postmaster: int | None) -> None:
        self._workers = worker_pids
        self._postmaster = postmaster

    def _read(self) -> tuple[float, float | None, tuple[int, int, int]]:
        workers = sum(cpu_seconds(pid) for pid in self._workers)
        server = server_cpu_seconds(self._postmaster) if self._postmaster else None
        return workers, server, machine_ticks()

    def start(self) -> None:
        self._start = self._read()

    def stop(self, jobs: int) -> dict[str, Any]:
        workers, server, ticks = self._read()
        workers0, server0, ticks0 = self._start
        busy, steal, total = (b - a for a, b in zip(ticks0, ticks, strict=True))
        out = {
            "worker_cpu_ms_per_job": round(1000 * (workers - workers0) / jobs, 4),
            "machine_busy_pct": round(100 * busy / total, 1) if total else None,
            "steal_pct": round(100 * steal / total, 1) if total else None,
        }
        if server is not None and server0 is not None:
            out["server_cpu_ms_per_job"] = round(1000 * (server - server0) / jobs, 4)
        return out


# -- measurements ----------------------------------------------------------------------------


class Bench:
    """One benchmark session on one server; `records` collects every measurement."""

    def __init__(
        self,
        server: Server,
        n: int,
        emit: Callable[[dict[str, Any]], None],
        bulk_n: int | None = None,
    ) -> None:
        self.server = server
        self.n = n
        # Jobs of the enqueue_many workload: more than `n`, whose batches take so little time
        # that one full garbage collection in the client moves the figure.
        self.bulk_n = bulk_n or n
        self.emit = emit
        self.postmaster = postmaster_of(server.admin)

    def db(self, adapter: Adapter) -> str:
        return f"bench_{adapter.lib.replace('-', '_')}"

    def fresh(self, adapter: Adapter, variant: str | None = None) -> str:
        db = self.db(adapter)
        self.server.reset(db)
        arun(adapter.install(self.server.dsn(db)))
        extra = adapter.variants.get(variant) if variant else None
        if extra is not None:
            arun(extra(self.server.dsn(db)))
        return db

    def record(self, adapter: Adapter, workload: str, run: int, **kw: Any) -> dict[str, Any]:
        rec = dict(lib=adapter.lib, label=adapter.label, workload=workload, run=run)
        rec.update(kw)
        return rec

    async def _enqueue_in_turns(
        self, adapters: list[Adapter], dsns: list[str], bulk: bool
    ) -> list[float]:
        """Each library's seconds to enqueue its jobs, the libraries taking turns."""
        producers: list[Any] = []
        elapsed = [0.0] * len(adapters)
        n, per_turn = (self.bulk_n, BULK_BATCH) if bulk else (self.n, SINGLE_TURN)
        try:
            for a, dsn in zip(adapters, dsns, strict=True):
                producers.append(await a.open_producer(dsn))
            for turn, start in enumerate(range(0, n, per_turn)):
                stop = min(n, start + per_turn)
                shift = turn % len(producers)  # who goes first rotates, turn by turn
                for i in [*range(shift, len(producers)), *range(shift)]:
                    p = producers[i]
                    t0 = time.perf_counter()
                    if bulk:
                        await p.enqueue_many(list(range(start, stop)))
                    else:
                        for j in range(start, stop):
                            await p.enqueue(j)
                    elapsed[i] += time.perf_counter() - t0
        finally:
            for p in producers:
                await p.close()
        return elapsed

    async def _fill(self, adapter: Adapter, dsn: str, n: int) -> None:
        """Enqueue, untimed, the `n` jobs a drain runs."""
        p = await adapter.open_producer(dsn)
        try:
            for start in range(0, n, BULK_BATCH):
                await p.enqueue_many(list(range(start, min(n, start + BULK_BATCH))))
        finally:
            await p.close()

    def enqueue(self, adapters: list[Adapter], run: int, bulk: bool) -> None:
        """One enqueue measurement of each library; they take turns (`SINGLE_TURN` calls, or
        one batch, each), so the server's drift falls on all of them alike."""
        workload = "enqueue_bulk" if bulk else "enqueue_single"
        recs = [
            self.record(a, workload, run, config=a.bulk_note if bulk else a.single_note)
            for a in adapters
        ]
        try:
            dbs = [self.fresh(a) for a in adapters]
            for db in dbs:
                self.server.settle(db)
            dsns = [self.server.dsn(db) for db in dbs]
            times = arun(self._enqueue_in_turns(adapters, dsns, bulk))
            n = self.bulk_n if bulk else self.n
            for a, db, rec, el in zip(adapters, dbs, recs, times, strict=True):
                rows = self.server.scalar(db, a.count_jobs_sql)
                rec.update(
                    value=round(n / el, 1),
                    unit="jobs/s",
                    elapsed_s=round(el, 3),
                    verified=rows == n,
                    check=f"rows_in_queue={rows}",
                )
        except Exception:
            for rec in recs:
                rec.update(value=None, verified=False, error=traceback.format_exc()[-3000:])
        for rec in recs:
            self.emit(rec)

    def drain(
        self,
        adapter: Adapter,
        run: int,
        procs: int,
        *,
        workload: str | None = None,
        variant: str | None = None,
        n: int | None = None,
        template: str | None = None,
        sample_rss: bool = False,
        label: str | None = None,
        pair: str | None = None,
    ) -> dict[str, Any]:
        """One drain; `pair` names the workload measured next, which this one is compared to."""
        n = n or self.n
        workload = workload or f"drain_{procs}p"
        rec = self.record(adapter, workload, run, config=label or adapter.config, procs=procs)
        rec["variant"] = variant
        if pair is not None:
            rec["pair"] = pair
        w: Workers | None = None
        try:
            db = self.db(adapter)
            if template:
                self.server.reset(db, template=template)
            else:
                self.fresh(adapter, variant)
            dsn = self.server.dsn(db)
            arun(self._fill(adapter, dsn, n))
            self.server.settle(db)
            w = Workers(adapter, dsn, procs, variant, n)
            w.spawn_and_wait_ready()
            pid = w.procs[0].pid
            samples: list[tuple[int, float]] = []
            cpu = CpuMeter([p.pid for p in w.procs if p.pid], self.postmaster)
            cpu.start()
            t0 = w.go()
            deadline = t0 + DRAIN_TIMEOUT_S
            next_sample = t0
            while w.count < n and time.perf_counter() < deadline:
                if sample_rss and time.perf_counter() >= next_sample and pid:
                    mb = rss_mb(pid)
                    if mb is not None:
                        samples.append((w.count, mb))
                    next_sample += 0.25
                time.sleep(0.002)
            t_exec = time.perf_counter()
            executed = w.count
            if executed < n:
                w.stop_and_collect()
                rec.update(
                    value=round(executed / (t_exec - t0), 1),
                    unit="jobs/s",
                    verified=False,
                    timed_out=True,
                    check=f"only {executed}/{n} executed within {DRAIN_TIMEOUT_S:.0f}s",
                )
                self.emit(rec)
                return rec
            unfinished = None
            with psycopg.connect(dsn, autocommit=True) as c:
                while time.perf_counter() < deadline + 30:
                    row = c.execute(adapter.unfinished_sql).fetchone()
                    unfinished = row[0] if row else None
                    if unfinished == 0:
                        break
                    time.sleep(0.005)
            t_done = time.perf_counter()
            rec.update(cpu.stop(n))
            if sample_rss and pid:
                mb = rss_mb(pid)
                if mb is not None:
                    samples.append((n, mb))
            time.sleep(0.3)  # give any duplicate execution a chance to show up
            counts = w.stop_and_collect()
            ok, why = exactly_once(counts)
            succ = self.server.scalar(db, adapter.succeeded_sql)
            errors = w.log_errors()
            ok = ok and unfinished == 0 and succ == n and not errors
            el = t_done - t0
            rec.update(
                value=round(n / el, 1),
                unit="jobs/s",
                n=n,
                elapsed_s=round(el, 3),
                exec_only_jobs_per_s=round(n / (t_exec - t0), 1),
                ack_lag_s=round(t_done - t_exec, 3),
                verified=ok,
                check=f"{why} db_succeeded={succ} db_unfinished={unfinished}"
                + (f" log_errors={errors[:3]}" if errors else ""),
            )
            if sample_rss:
                rec.update(rss_summary(samples, n))
        except Exception:
            if w is not None:
                w.kill()
            rec.update(value=None, verified=False, error=traceback.format_exc()[-3000:])
        finally:
            if w is not None:
                w.cleanup()
        self.emit(rec)
        return rec

    def latency(
        self, adapter: Adapter, run: int, *, variant: str | None = None, label: str | None = None
    ) -> None:
        rec = self.record(adapter, "latency", run, config=label or adapter.config)
        rec["variant"] = variant
        w: Workers | None = None
        try:
            db = self.fresh(adapter, variant)
            self.server.settle(db)
            dsn = self.server.dsn(db)
            total = LAT_WARMUP + LAT_N
            w = Workers(adapter, dsn, 1, variant, total, record_starts=True)
            w.spawn_and_wait_ready()
            w.go()
            w.wait_started()
            time.sleep(1.0)  # the worker is idle and listening
            enq = [0.0] * total

            async def produce() -> None:
                p = await adapter.open_producer(dsn)
                try:
                    t0 = time.perf_counter() + 0.05
                    for i in range(total):
                        if i == LAT_WARMUP:  # idle again before the timed jobs
                            t0 += LAT_WARMUP_PAUSE_S
                        d = t0 + i * LAT_GAP_S - time.perf_counter()
                        if d > 0:
                            await asyncio.sleep(d)
                        enq[i] = time.perf_counter()
                        await p.enqueue(i)
                finally:
                    await p.close()

            arun(produce())
            deadline = time.perf_counter() + 60
            while w.count < total and time.perf_counter() < deadline:
                time.sleep(0.005)
            time.sleep(0.3)
            starts = list(w.shared["starts"])
            counts = w.stop_and_collect()
            ok, why = exactly_once(counts)
            every = [(starts[i] - enq[i]) * 1000 if starts[i] > 0 else None for i in range(total)]
            warmup, raw = every[:LAT_WARMUP], every[LAT_WARMUP:]
            lat = sorted(x for x in raw if x is not None)
            if not lat:
                raise RuntimeError("no job started")
            errors = w.log_errors()
            rec.update(
                p50_ms=round(pct(lat, 50), 2),
                p95_ms=round(pct(lat, 95), 2),
                p99_ms=round(pct(lat, 99), 2),
                max_ms=round(lat[-1], 2),
                first_job_ms=round(warmup[0], 2) if warmup[0] is not None else None,
                warmup_ms=[None if x is None else round(x, 2) for x in warmup],
                # Which jobs make the tail: (index among the timed ones, ms) of the five slowest.
                slowest=sorted(
                    ((i, round(x, 2)) for i, x in enumerate(raw) if x is not None),
                    key=lambda s: -s[1],
                )[:5],
                n=LAT_N,
                verified=ok and len(lat) == LAT_N and None not in warmup and not errors,
                check=why + (f" log_errors={errors[:3]}" if errors else ""),
            )
        except Exception:
            if w is not None:
                w.kill()
            rec.update(verified=False, error=traceback.format_exc()[-3000:])
        finally:
            if w is not None:
                w.cleanup()
        self.emit(rec)


def rss_summary(samples: list[tuple[int, float]], n: int) -> dict[str, Any]:
    """RSS of the worker after 20% of the jobs, at the end, and the growth in between."""
    if len(samples) < 3:
        return {"rss_note": "too few samples"}
    early = [mb for done, mb in samples if done >= n * 0.2]
    base = early[0] if early else samples[0][1]
    end = samples[-1][1]
    peak = max(mb for _, mb in samples)
    return {
        "rss_at_20pct_mb": round(base, 1),
        "rss_end_mb": round(end, 1),
        "rss_peak_mb": round(peak, 1),
        "rss_growth_mb": round(end - base, 1),
        "rss_samples": len(samples),
    }
