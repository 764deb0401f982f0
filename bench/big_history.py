"""`python -m bench.big_history`: the one-process drain with a big finished history.

    .venv/bin/python -m bench.big_history                    # 10,000,000 finished rows, 2 runs
    .venv/bin/python -m bench.big_history --history 1000000 --prune 100000 --runs 1

Each run measures three drains of `--jobs` jobs by one worker process, seconds apart, with the
harness of `python -m bench` (same server, same timing rules, each job checked to run once):

  * plain: the empty table;
  * history: `--history` finished jobs in the table (a template database, copied per drain);
  * history + retention: the same, while the product's retention statement (`PRUNE_BATCH`, in
    batches of the retention plugin's size) deletes the oldest `--prune` of those rows from
    another connection, as another worker's retention would.

The ratios to the plain drain are the figures (targets: >= 0.8x with history; retention
costing at most 20% more).
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import psycopg

from bench import harness
from bench.__main__ import machine, start_server
from bench.harness import Bench, Server
from bench.libs import durable
from worker.daemon.plugins.retention import PRUNE_BATCH as BATCH
from worker.daemon.plugins.retention import PRUNE_REST
from worker.db import sql
from worker.models import TERMINAL_STATUSES

TEMPLATE = "bench_durable_big_history_tpl"
RECENT = " and created_at > now() - interval '12 hours'"  # the drained jobs, not the history


def parse() -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m bench.big_history")
    ap.add_argument("--history", type=int, default=10_000_000, help="finished rows")
    ap.add_argument("--prune", type=int, default=1_000_000, help="of them, deleted meanwhile")
    ap.add_argument("--jobs", type=int, default=20_000, help="jobs per drain")
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--out", default="bench/results/big_history.md")
    ap.add_argument("--keep-server", action="store_true")
    ap.add_argument(
        "--keep-template", action="store_true", help="keep the history for the next run"
    )
    return ap.parse_args()


def build_template(server: Server, rows: int, oldest: int) -> datetime:
    """The history: `oldest` finished rows, then the rest a moment later; returns the time
    before which retention deletes exactly the first ones. A template kept from an earlier
    run with the same sizes is used as it is."""
    marker = f"{rows} finished rows, the oldest {oldest} first"
    kept = server.query(
        "postgres",
        "SELECT shobj_description(oid, 'pg_database') FROM pg_database WHERE datname = %s",
        (TEMPLATE,),
    )
    if not (kept and kept[0][0] == marker):
        fill(server, rows, oldest)
        server.query("postgres", f"COMMENT ON DATABASE {TEMPLATE} IS '{marker}'")
    ((before,),) = server.query(
        TEMPLATE, "SELECT min(finished_at) + interval '1 millisecond' FROM worker.jobs"
    )
    return before  # type: ignore[no-any-return]


def fill(server: Server, rows: int, oldest: int) -> None:
    started = time.perf_counter()
    server.reset(TEMPLATE)
    harness.arun(durable.install(server.dsn(TEMPLATE)))
    # Two statements, so the oldest rows share a finished_at that no later row has.
    server.query(TEMPLATE, durable.FILL_FINISHED, {"n": oldest})
    time.sleep(0.05)
    server.query(TEMPLATE, durable.FILL_FINISHED, {"n": rows - oldest})
    server.query(TEMPLATE, "VACUUM ANALYZE")
    server.query(TEMPLATE, "CHECKPOINT")
    size = server.scalar(TEMPLATE, "SELECT pg_size_pretty(pg_database_size(current_database()))")
    took = time.perf_counter() - started
    print(f"# {rows:,} finished rows, {size} ({took:.0f} s)", file=sys.stderr)


class Retention(threading.Thread):
    """Deletes the oldest history rows in retention's batches, from the drain's first completed
    job until `target` rows are gone or `stop()`."""

    def __init__(self, dsn: str, before: datetime, target: int) -> None:
        super().__init__(daemon=True)
        self.dsn, self.before, self.target = dsn, before, target
        self.deleted = 0
        self.seconds = 0.0
        self._halt = threading.Event()

    def _wait_for_drain(self) -> psycopg.Connection[Any] | None:
        while not self._halt.is_set():
            try:
                conn = psycopg.connect(self.dsn, autocommit=True)
                started = conn.execute(
                    "SELECT EXISTS (SELECT 1 FROM worker.jobs WHERE status = 'completed'"
                    + RECENT
                    + ")"
                ).fetchone()
                if started and started[0]:
                    return conn
                conn.close()
            except psycopg.Error:
                pass  # the drain's database is being made from the template
            self._halt.wait(0.005)
        return None

    def run(self) -> None:
        conn = self._wait_for_drain()
        if conn is None:
            return
        params = {"statuses": sorted(TERMINAL_STATUSES), "before": self.before, "batch": BATCH}
        t0 = time.perf_counter()
        with conn:
            while not self._halt.is_set() and self.deleted < self.target:
                began = time.perf_counter()
                pruned = conn.execute(sql.PRUNE_BATCH, params).rowcount
                self.deleted += pruned
                if pruned < BATCH:
                    break
                self._halt.wait((time.perf_counter() - began) * PRUNE_REST)  # as the plugin rests
        self.seconds = time.perf_counter() - t0

    def stop(self) -> None:
        self._halt.set()
        self.join(timeout=60)


def main() -> None:
    args = parse()
    server, owned = start_server(args.keep_server)
    records: list[dict[str, Any]] = []
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)

    def emit(rec: dict[str, Any]) -> None:
        records.append(rec)
        flag = "ok" if rec.get("verified") else "NOT VERIFIED"
        print(
            f"  run {rec['run']} {rec['workload']:<22} {rec.get('value')}  {flag}", file=sys.stderr
        )

    try:
        info = machine(server)
        before = build_template(server, args.history, args.prune)
        bench = Bench(server, args.jobs, emit)
        rows: list[dict[str, Any]] = []
        for run in range(1, args.runs + 1):
            plain = bench.drain(durable.adapter(), run, 1, variant="warning")
            big = durable.adapter()
            # Both counts read only the drained jobs (by jobs_created_idx): a scan of the whole
            # history in the clock's last poll would be the harness's cost, not the drain's.
            big.succeeded_sql += RECENT
            big.unfinished_sql += RECENT
            history = bench.drain(
                big, run, 1, workload="drain_history", variant="warning", template=TEMPLATE
            )
            # Gone first, so retention waits for the drain's own copy, not the last one's jobs.
            server.drop(bench.db(big))
            retention = Retention(server.dsn(bench.db(big)), before, args.prune)
            retention.start()
            pruning = bench.drain(
                big,
                run,
                1,
                workload="drain_retention",
                variant="warning",
                template=TEMPLATE,
            )
            retention.stop()
            rows.append(
                {
                    "run": run,
                    "plain": plain.get("value"),
                    "history": history.get("value"),
                    "history_retention": pruning.get("value"),
                    "exec_only": [r.get("exec_only_jobs_per_s") for r in (plain, history, pruning)],
                    "verified": all(r.get("verified") for r in (plain, history, pruning)),
                    "pruned": retention.deleted,
                    "prune_rows_per_s": round(retention.deleted / retention.seconds)
                    if retention.seconds
                    else None,
                }
            )
        text = report(args, info, rows)
        print(text)
        out.write_text(text)
        out.with_suffix(".jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    finally:
        server.drop("bench_durable")
        if not args.keep_template:
            server.drop(TEMPLATE)
        if owned is not None:
            owned.stop()


def report(args: argparse.Namespace, info: dict[str, Any], rows: list[dict[str, Any]]) -> str:
    lines = [
        f"drain of {args.jobs:,} jobs, 1 process x c{harness.CONCURRENCY}; history "
        f"{args.history:,} finished rows; retention deleting the oldest {args.prune:,}",
        f"machine: {info['nproc']} cpus, {info['cpu']}; {info['postgres']}; {info['pg_settings']}",
        "",
        "| run | empty table (jobs/s) | with history (jobs/s) | x empty | history + retention "
        "(jobs/s) | x history | rows retention deleted during it | retention rows/s | checked |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    executed = [
        "",
        "The same drains timed to the last job executed (as the workers report it), not to the "
        "database showing them all completed:",
        "",
        "| run | empty table (jobs/s) | with history (jobs/s) | x empty | history + retention "
        "(jobs/s) | x history |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        ratio = r["history"] / r["plain"] if r["plain"] and r["history"] else None
        cost = (
            r["history_retention"] / r["history"]
            if r["history"] and r["history_retention"]
            else None
        )
        lines.append(
            f"| {r['run']} | {r['plain']:,.0f} | {r['history']:,.0f} | "
            f"{ratio:.2f}x | {r['history_retention']:,.0f} | {cost:.2f}x | {r['pruned']:,} | "
            f"{r['prune_rows_per_s'] or '-'} | {'yes' if r['verified'] else 'NO'} |"
        )
        plain, history, pruning = r["exec_only"]
        executed.append(
            f"| {r['run']} | {plain:,.0f} | {history:,.0f} | {history / plain:.2f}x | "
            f"{pruning:,.0f} | {pruning / history:.2f}x |"
        )
    return "\n".join(lines + executed) + "\n"


if __name__ == "__main__":
    main()
