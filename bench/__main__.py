"""`python -m bench`: every workload, for durable-worker and the installed peers, in one run.

    .venv/bin/pip install -e '.[bench]'     # PgQueuer, Procrastinate, Chancy, asyncpg
    .venv/bin/python -m bench               # 3 runs of the issue's workloads (20,000 jobs)
    .venv/bin/python -m bench --runs 1 --jobs 2000 --only drain1,latency --libs durable,pgqueuer
    .venv/bin/python -m bench --only kills --libs durable   # 20 SIGKILLs: time to restart

The server: `BENCH_DATABASE_URL` (any database on it; the benchmark creates and drops its own
`bench_*` databases), else a private durable PostgreSQL (fsync on) started in
`.worker-data/bench-pg` and stopped at the end. The printed table is also written to `--out`.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench import harness, report
from bench.harness import Adapter, Bench, Server

WORKLOADS = [
    "enq1",
    "enqbulk",
    "drain1",
    "drain2",
    "latency",
    "bigtable",
    "pipeline",
    "limited",
    "memory",
    "cpu",
    "kills",
]
PEERS = ["pgqueuer", "procrastinate", "chancy"]
LIBS = ["durable", *PEERS, "bare"]
BIG_TEMPLATE = "bench_durable_history_tpl"


def parse() -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m bench", description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3, help="runs of every workload (default 3)")
    ap.add_argument(
        "--jobs", type=int, default=20_000, help="jobs per single enqueue and drain (20000)"
    )
    ap.add_argument(
        "--bulk-jobs", type=int, default=100_000, help="jobs per enqueue_many run (100000)"
    )
    ap.add_argument("--only", default="", help=f"comma list of workloads: {','.join(WORKLOADS)}")
    ap.add_argument("--libs", default="", help=f"comma list of libraries: {','.join(LIBS)}")
    ap.add_argument("--history", type=int, default=1_000_000, help="finished rows (bigtable)")
    ap.add_argument(
        "--memory-jobs", type=int, default=100_000, help="jobs drained, first run only (memory)"
    )
    ap.add_argument(
        "--cpu-jobs", type=int, default=5_000, help="CPU-bound jobs per drain (cpu; 5000)"
    )
    ap.add_argument(
        "--kills", type=int, default=20, help="SIGKILLs of a worker holding 10 jobs (kills; 20)"
    )
    ap.add_argument("--out", default="bench/results/latest.md", help="also write the table here")
    ap.add_argument("--keep-server", action="store_true", help="leave the private server up")
    return ap.parse_args()


def start_server(keep: bool) -> tuple[Server, Any]:
    given = os.environ.get("BENCH_DATABASE_URL")
    if given:
        from worker.urls import psycopg_url

        url = psycopg_url(given)
        base, _, tail = url.rpartition("/")
        query = tail.partition("?")[2]
        return Server(f"{base}/postgres" + (f"?{query}" if query else "")), None
    from worker.db.embedded import LocalPostgres

    data = Path(os.environ.get("BENCH_DATA_DIR", ".worker-data/bench-pg"))
    pg = LocalPostgres(data, durable=True, prefer_system=True)
    was_running = pg.is_running()
    pg.start()
    server = Server(pg.url("postgres"))
    # The peers' baseline ran with shared_buffers=256MB; everything else at defaults, fsync on.
    if server.scalar("postgres", "SHOW shared_buffers") != "256MB":
        server.query("postgres", "ALTER SYSTEM SET shared_buffers = '256MB'")
        pg.stop()
        pg.start()
    return server, (None if keep or was_running else pg)


def load_peers(wanted: list[str]) -> dict[str, Adapter]:
    found: dict[str, Adapter] = {}
    for lib in wanted:
        if lib not in PEERS:
            continue
        if importlib.util.find_spec(lib) is None:
            print(f"# {lib} is not installed: skipped (pip install -e '.[bench]')", file=sys.stderr)
            continue
        module = __import__(f"bench.libs.{lib}", fromlist=["adapter"])
        found[lib] = module.adapter()
    return found


def build_history_template(server: Server, rows: int) -> None:
    from bench.libs import durable

    t = time.perf_counter()
    server.reset(BIG_TEMPLATE)
    harness.arun(durable.install(server.dsn(BIG_TEMPLATE)))
    server.query(BIG_TEMPLATE, durable.FILL_FINISHED, {"n": rows})
    server.query(BIG_TEMPLATE, "VACUUM ANALYZE")
    server.query(BIG_TEMPLATE, "CHECKPOINT")
    print(f"# {rows:,} finished rows ready ({time.perf_counter() - t:.0f} s)", file=sys.stderr)


def machine(server: Server) -> dict[str, Any]:
    cpu = ""
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), "")
    except OSError:
        pass
    settings = server.query(
        "postgres",
        "SELECT name, current_setting(name) FROM pg_settings WHERE name IN "
        "('fsync','synchronous_commit','shared_buffers','max_connections') ORDER BY name",
    )
    return {
        "nproc": os.cpu_count(),
        "cpu": cpu,
        "python": platform.python_version(),
        "postgres": server.scalar("postgres", "SELECT version()").split(" on ")[0],
        "pg_settings": ", ".join(f"{k}={v}" for k, v in settings),
        "loop": "uvloop" if os.environ.get("BENCH_UVLOOP") == "1" else "asyncio",
    }


def main() -> None:
    args = parse()
    only = [w for w in args.only.split(",") if w] or WORKLOADS
    libs = [x for x in args.libs.split(",") if x] or LIBS
    for name in only:
        if name not in WORKLOADS:
            sys.exit(f"unknown workload {name!r}: choose from {', '.join(WORKLOADS)}")
    for name in libs:
        if name not in LIBS:
            sys.exit(f"unknown library {name!r}: choose from {', '.join(LIBS)}")
    from bench import cpu, kills
    from bench.libs import bare, durable

    server, owned = start_server(args.keep_server)
    os.makedirs("bench/results", exist_ok=True)
    raw = open("bench/results/runs.jsonl", "a")  # noqa: SIM115
    records: list[dict[str, Any]] = []

    def emit(rec: dict[str, Any]) -> None:
        rec["at"] = datetime.now(UTC).isoformat(timespec="seconds")
        records.append(rec)
        raw.write(json.dumps(rec) + "\n")
        raw.flush()
        shown = rec.get("value") or (rec.get("p50_ms"), rec.get("p99_ms"))
        flag = "ok" if rec.get("verified") else "NOT VERIFIED"
        print(
            f"  run {rec['run']} {rec['workload']:<16} {rec['label']:<28} "
            f"{rec.get('variant') or '':<8} {shown}  {flag}",
            file=sys.stderr,
            flush=True,
        )
        if rec.get("error"):
            print(rec["error"], file=sys.stderr)

    bench = Bench(server, args.jobs, emit, args.bulk_jobs)
    ours = durable.adapter() if "durable" in libs else None
    peers = load_peers(libs)
    info = machine(server)
    started = time.perf_counter()
    try:
        if ours and "bigtable" in only:
            build_history_template(server, args.history)
        for run in range(1, args.runs + 1):
            # Rotate who goes first, so no library always meets the machine in the same state.
            order: list[str] = [x for x in ["durable", *PEERS] if x == "durable" and ours]
            order += [p for p in PEERS if p in peers]
            shift = (run - 1) % max(1, len(order))
            order = order[shift:] + order[:shift]
            ads = [ours if lib == "durable" else peers[lib] for lib in order]

            for bulk, name in ((False, "enq1"), (True, "enqbulk")):
                if name in only:
                    bench.enqueue([a for a in ads if a is not None], run, bulk=bulk)
            for procs, name in ((1, "drain1"), (2, "drain2")):
                if name not in only:
                    continue
                for a in ads:
                    assert a is not None
                    if a.lib == "durable":
                        # The floor just before: the ratio to it is of drains seconds apart.
                        if "bare" in libs:
                            emit(bare.measure(server, args.jobs, procs, 10, run))
                        # The two levels in turns, each first every other run, so neither
                        # always meets the machine as the other left it.
                        for variant in ("warning", "info") if run % 2 else ("info", "warning"):
                            bench.drain(a, run, procs, variant=variant)
                    else:
                        bench.drain(a, run, procs)
            if "latency" in only:
                for a in ads:
                    assert a is not None
                    if a.lib == "durable":
                        bench.latency(a, run, variant="warning")
                        bench.latency(a, run, variant="info")
                    else:
                        bench.latency(a, run)
            # durable-worker against itself: each of these drains is measured right after a
            # plain one, so their ratio is of two drains a minute apart, not half an hour.
            if ours and "bigtable" in only:
                bench.drain(ours, run, 1, variant="warning", pair="drain_history")
                big = durable.adapter()
                big.succeeded_sql += " and created_at > now() - interval '12 hours'"
                bench.drain(
                    big,
                    run,
                    1,
                    workload="drain_history",
                    variant="warning",
                    template=BIG_TEMPLATE,
                    label=f"as drain 1 process, with {args.history:,} finished jobs in the table",
                )
            if ours and "limited" in only:
                bench.drain(ours, run, 1, variant="warning", pair="drain_limited")
                bench.drain(
                    ours,
                    run,
                    1,
                    workload="drain_limited",
                    variant="limited",
                    label=f"as drain 1 process, the queue limited to {durable.GENEROUS_LIMIT:,} "
                    "running at once",
                )
            if ours and "pipeline" in only:
                if "bare" in libs:
                    emit({**bare.measure(server, args.jobs, 1, 10, run), "pair": "drain_pipeline"})
                    emit(bare.measure(server, args.jobs, 1, 10, run, stages=3))
                bench.drain(ours, run, 1, variant="warning", pair="drain_pipeline")
                bench.drain(
                    durable.pipeline_adapter(), run, 1, workload="drain_pipeline", variant="warning"
                )
            if ours and "cpu" in only:
                # Which goes first alternates, so neither always meets the machine as it was.
                for procs in (1, 2) if run % 2 else (2, 1):
                    emit(cpu.bare(args.cpu_jobs, procs, run))
                    for pinned in (False, True):
                        emit(cpu.measure(server, args.cpu_jobs, procs, run, pinned))
            if ours and "kills" in only and run == 1:  # a distribution over its own kills
                emit(kills.measure(server, args.kills, run))
            if ours and "memory" in only and run == 1:  # a flatness check, not a comparison
                bench.drain(
                    ours,
                    run,
                    1,
                    workload="memory",
                    variant="info",
                    n=args.memory_jobs,
                    sample_rss=True,
                    label=f"drain {args.memory_jobs:,} jobs, 1 process, default logging (INFO)",
                )
    finally:
        for db in (
            "bench_durable",
            "bench_bare",
            "bench_kills",
            BIG_TEMPLATE,
            *(f"bench_{p}" for p in PEERS),
        ):
            try:
                server.drop(db)
            except Exception as exc:  # the report matters more than a leftover database
                print(f"# could not drop {db}: {exc}", file=sys.stderr)
        raw.close()
        if owned is not None:
            owned.stop()
    info["elapsed_s"] = round(time.perf_counter() - started)
    info["command"] = "python -m bench " + " ".join(sys.argv[1:])
    text = report.render(records, info, args)
    print(text)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(text)


if __name__ == "__main__":
    main()
