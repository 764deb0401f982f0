"""The floor: a bare claim/complete loop with no job code (after `peer-bench/limit/limit.py`).

Each process loops: claim `batch` pending rows (a CTE with FOR UPDATE SKIP LOCKED, marking them
processing), then complete them in one UPDATE ... = ANY(array), until nothing is left. No
worker registration, no job code, no results: what any SKIP LOCKED queue on this server and
this machine cannot beat.

With `stages=3` it is the floor of a 3-stage job whose stage boundaries are committed before
the next stage runs: the claim starts stage 1, one statement per boundary ends a stage (its
output stored) and starts the next while the job is still the loop's, and the completion ends
the last stage. Four commits per batch instead of two, and no job code either. Like
durable-worker's stage rows (migration 0006), a stage row names its job without a foreign key.
"""

from __future__ import annotations

import multiprocessing as mp
import time
import traceback
from typing import Any

import psycopg

from bench.harness import CpuMeter, Server, postmaster_of

DDL = """
DROP TABLE IF EXISTS lim_stages;
DROP TABLE IF EXISTS lim_jobs;
CREATE TABLE lim_jobs (
  id bigserial PRIMARY KEY, queue text NOT NULL DEFAULT 'default', task text NOT NULL,
  payload jsonb NOT NULL DEFAULT '{}', status text NOT NULL DEFAULT 'pending',
  priority int NOT NULL DEFAULT 0, run_at timestamptz NOT NULL DEFAULT now(),
  retry_count int NOT NULL DEFAULT 0, result jsonb, started_at timestamptz,
  finished_at timestamptz, worker_id text, heartbeat_at timestamptz);
CREATE INDEX lim_jobs_runnable ON lim_jobs (queue, priority, run_at, id) WHERE status = 'pending';
CREATE TABLE lim_stages (
  job_id bigint NOT NULL, stage int NOT NULL,
  status text NOT NULL, output jsonb, started_at timestamptz NOT NULL DEFAULT now(),
  finished_at timestamptz, PRIMARY KEY (job_id, stage));
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

# The same claim, starting each job's first stage.
CLAIM_STAGED = """
WITH c AS (SELECT id FROM lim_jobs
           WHERE status = 'pending' AND queue = 'default' AND run_at <= now()
           ORDER BY priority, run_at, id LIMIT %s FOR UPDATE SKIP LOCKED),
j AS (UPDATE lim_jobs j SET status = 'processing', started_at = now(), heartbeat_at = now(),
      worker_id = %s
      FROM c WHERE j.id = c.id RETURNING j.id, j.task, j.payload),
s AS (INSERT INTO lim_stages (job_id, stage, status) SELECT id, 1, 'running' FROM j)
SELECT * FROM j
"""
# End stage %(ended)s and start the next, for the jobs the loop still holds (locked against a
# concurrent rescue until commit). lim_stages is analyzed empty and fills during the run;
# planned on those statistics, a stage lookup scans it whole at every boundary. So the loop
# turns sequential scans off, and stages are found by `job_id = ANY(...)` on the primary key
# (a join with the jobs still scans the whole index).
STAGE_BOUNDARY = """
WITH held AS (SELECT id FROM lim_jobs WHERE id = ANY(%(ids)s) AND status = 'processing'
              AND worker_id = %(wid)s FOR SHARE),
ended AS (UPDATE lim_stages SET status = 'completed', output = '{"n": 1}', finished_at = now()
          WHERE job_id = ANY(ARRAY(SELECT id FROM held)) AND stage = %(ended)s)
INSERT INTO lim_stages (job_id, stage, status) SELECT id, %(ended)s + 1, 'running' FROM held
"""
DONE_STAGED = """
WITH d AS (UPDATE lim_jobs SET status = 'completed', finished_at = now(), result = '{}'
           WHERE id = ANY(%(ids)s) AND status = 'processing' RETURNING id)
UPDATE lim_stages SET status = 'completed', output = '{"n": 1}', finished_at = now()
WHERE job_id = ANY(ARRAY(SELECT id FROM d)) AND stage = %(ended)s
"""

DB = "bench_bare"


def _loop(
    dsn: str, batch: int, stages: int, wid: str, ready: Any, go: Any, out: Any, leave: Any
) -> None:
    ids: list[int] = []
    try:
        with psycopg.connect(dsn, autocommit=True, prepare_threshold=0) as c:
            if stages > 1:
                c.execute("SET enable_seqscan = off")  # see STAGE_BOUNDARY
            ready.release()
            go.wait()
            while True:
                rows = c.execute(CLAIM if stages == 1 else CLAIM_STAGED, (batch, wid)).fetchall()
                if not rows:
                    break
                got = [r[0] for r in rows]
                if stages == 1:
                    c.execute(DONE, (got,))
                else:
                    for stage in range(1, stages):
                        c.execute(STAGE_BOUNDARY, {"ids": got, "wid": wid, "ended": stage})
                    c.execute(DONE_STAGED, {"ids": got, "ended": stages})
                ids.extend(got)
            out.put((ids, None))
            # This process and its server session stay until the parent has read their CPU
            # time: a session that ends is counted only once the server has reaped it.
            leave.wait(60)
    except Exception:
        out.put((ids, traceback.format_exc()))


def measure(
    server: Server, n: int, procs: int, batch: int, run: int, stages: int = 1
) -> dict[str, Any]:
    config = f"psycopg, claim {batch} with SKIP LOCKED + one UPDATE per batch, no job code"
    if stages > 1:
        config += f"; {stages} stages, each boundary one committed statement"
    rec: dict[str, Any] = dict(
        lib="bare",
        label="bare claim/complete loop",
        workload=f"drain_{procs}p" if stages == 1 else "drain_pipeline",
        run=run,
        config=config,
        procs=procs,
    )
    ctx = mp.get_context("spawn")
    ready, go, out, leave = ctx.Semaphore(0), ctx.Event(), ctx.Queue(), ctx.Event()
    try:
        server.reset(DB)
        dsn = server.dsn(DB)
        with psycopg.connect(dsn, autocommit=True) as c:
            c.execute(DDL)
            c.execute(FILL, (n,))
        server.settle(DB)
        workers = [
            ctx.Process(
                target=_loop,
                args=(dsn, batch, stages, f"w{k}", ready, go, out, leave),
                daemon=True,
            )
            for k in range(procs)
        ]
        for p in workers:
            p.start()
        for _ in workers:
            if not ready.acquire(timeout=60):
                raise RuntimeError("bare loop process did not become ready")
        cpu = CpuMeter([p.pid for p in workers if p.pid], postmaster_of(server.admin))
        cpu.start()
        t0 = time.perf_counter()
        go.set()
        results = [out.get(timeout=300) for _ in workers]
        el = time.perf_counter() - t0
        rec.update(cpu.stop(n))
        leave.set()
        for p in workers:
            p.join(10)
        errs = [e for _, e in results if e]
        if errs:
            raise RuntimeError("\n".join(errs))
        ids = [i for got, _ in results for i in got]
        done = server.scalar(DB, "select count(*) from lim_jobs where status = 'completed'")
        ended = server.scalar(DB, "select count(*) from lim_stages where status = 'completed'")
        ok = len(ids) == n and len(set(ids)) == n and done == n
        ok = ok and ended == (n * stages if stages > 1 else 0)
        rec.update(
            value=round(n / el, 1),
            unit="jobs/s",
            n=n,
            elapsed_s=round(el, 3),
            verified=ok,
            check=f"claimed={len(ids)} distinct={len(set(ids))} db_completed={done} "
            f"stages_completed={ended}",
        )
    except Exception:
        rec.update(value=None, verified=False, error=traceback.format_exc()[-3000:])
    finally:
        leave.set()
    return rec
