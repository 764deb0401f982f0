"""The floor: a bare claim/complete loop with no job code (after `peer-bench/limit/limit.py`).

Each process loops: claim `batch` pending rows (a CTE with FOR UPDATE SKIP LOCKED, marking them
processing), then complete them in one UPDATE ... = ANY(array), until nothing is left. No
worker registration, no job code, no results: what any SKIP LOCKED queue on this server and
this machine cannot beat.
"""

from __future__ import annotations

import multiprocessing as mp
import time
import traceback
from typing import Any

import psycopg

from bench.harness import Server

DDL = """
DROP TABLE IF EXISTS lim_jobs;
CREATE TABLE lim_jobs (
  id bigserial PRIMARY KEY, queue text NOT NULL DEFAULT 'default', task text NOT NULL,
  payload jsonb NOT NULL DEFAULT '{}', status text NOT NULL DEFAULT 'pending',
  priority int NOT NULL DEFAULT 0, run_at timestamptz NOT NULL DEFAULT now(),
  retry_count int NOT NULL DEFAULT 0, result jsonb, started_at timestamptz,
  finished_at timestamptz, worker_id text, heartbeat_at timestamptz);
CREATE INDEX lim_jobs_runnable ON lim_jobs (queue, priority, run_at, id) WHERE status = 'pending';
"""
FILL = """
INSERT INTO lim_jobs (task, payload)
SELECT 'noop', jsonb_build_object('i', g) FROM generate_series(1, %s) g
"""
CLAIM = """
WITH c AS (SELECT id FROM lim_jobs
           WHERE status = 'pending' AND queue = 'default' AND run_at <= now()
           ORDER BY priority, run_at, id LIMIT %s FOR UPDATE SKIP LOCKED)
UPDATE lim_jobs j SET status = 'processing', started_at = now(), heartbeat_at = now(),
       worker_id = %s
FROM c WHERE j.id = c.id RETURNING j.id, j.task, j.payload
"""
DONE = """UPDATE lim_jobs SET status = 'completed', finished_at = now(), result = '{}'
          WHERE id = ANY(%s) AND status = 'processing'"""

DB = "bench_bare"


def _loop(dsn: str, batch: int, wid: str, ready: Any, go: Any, out: Any) -> None:
    ids: list[int] = []
    try:
        with psycopg.connect(dsn, autocommit=True, prepare_threshold=0) as c:
            ready.release()
            go.wait()
            while True:
                rows = c.execute(CLAIM, (batch, wid)).fetchall()
                if not rows:
                    break
                c.execute(DONE, ([r[0] for r in rows],))
                ids.extend(r[0] for r in rows)
        out.put((ids, None))
    except Exception:
        out.put((ids, traceback.format_exc()))


def measure(server: Server, n: int, procs: int, batch: int, run: int) -> dict[str, Any]:
    rec: dict[str, Any] = dict(
        lib="bare",
        label="bare claim/complete loop",
        workload=f"drain_{procs}p",
        run=run,
        config=f"psycopg, claim {batch} with SKIP LOCKED + one UPDATE per batch, no job code",
        procs=procs,
    )
    try:
        server.reset(DB)
        dsn = server.dsn(DB)
        with psycopg.connect(dsn, autocommit=True) as c:
            c.execute(DDL)
            c.execute(FILL, (n,))
        server.settle(DB)
        ctx = mp.get_context("spawn")
        ready, go, out = ctx.Semaphore(0), ctx.Event(), ctx.Queue()
        workers = [
            ctx.Process(target=_loop, args=(dsn, batch, f"w{k}", ready, go, out), daemon=True)
            for k in range(procs)
        ]
        for p in workers:
            p.start()
        for _ in workers:
            if not ready.acquire(timeout=60):
                raise RuntimeError("bare loop process did not become ready")
        t0 = time.perf_counter()
        go.set()
        results = [out.get(timeout=300) for _ in workers]
        el = time.perf_counter() - t0
        for p in workers:
            p.join(10)
        errs = [e for _, e in results if e]
        if errs:
            raise RuntimeError("\n".join(errs))
        ids = [i for got, _ in results for i in got]
        done = server.scalar(DB, "select count(*) from lim_jobs where status = 'completed'")
        ok = len(ids) == n and len(set(ids)) == n and done == n
        rec.update(
            value=round(n / el, 1),
            unit="jobs/s",
            n=n,
            elapsed_s=round(el, 3),
            verified=ok,
            check=f"claimed={len(ids)} distinct={len(set(ids))} db_completed={done}",
        )
    except Exception:
        rec.update(value=None, verified=False, error=traceback.format_exc()[-3000:])
    return rec
