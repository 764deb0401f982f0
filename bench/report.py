"""Folds the measurements of one `python -m bench` session into one Markdown table."""

from __future__ import annotations

import statistics
from collections.abc import Callable
from typing import Any

from bench import kills

PEERS = ["pgqueuer", "procrastinate", "chancy"]


def _values(records: list[dict[str, Any]], key: str, **match: Any) -> list[float]:
    out = []
    for r in records:
        matches = all(r.get(k) == v for k, v in match.items())
        if matches and r.get(key) is not None and r.get("verified"):
            out.append(float(r[key]))
    return out


def _fmt(x: float) -> str:
    return f"{x:,.0f}" if x >= 100 else f"{x:,.1f}" if x >= 10 else f"{x:,.2f}"


def cell(vals: list[float]) -> str:
    if not vals:
        return "-"
    med = statistics.median(vals)
    if len(vals) == 1:
        return _fmt(med)
    return f"{_fmt(med)} ({_fmt(min(vals))}-{_fmt(max(vals))})"


def xcell(ratios: list[float]) -> str:
    """Ratios as `cell` shows values: the median (min-max), each with its x."""
    if not ratios:
        return "-"
    mid = f"{statistics.median(ratios):.2f}x"
    return mid if len(ratios) == 1 else f"{mid} ({min(ratios):.2f}x-{max(ratios):.2f}x)"


def med(vals: list[float]) -> float | None:
    return statistics.median(vals) if vals else None


def render(records: list[dict[str, Any]], info: dict[str, Any], args: Any) -> str:
    labels = {r["lib"]: r["label"] for r in records}
    peers = [p for p in PEERS if p in labels]
    n = args.jobs

    def m(lib: str, workload: str, key: str = "value", **kw: Any) -> list[float]:
        # A drain measured as the pair of another workload counts for that comparison only.
        return _values(records, key, lib=lib, workload=workload, **{"pair": None, **kw})

    runs = sorted({int(r["run"]) for r in records})

    def per_run(a: dict[str, Any], b: dict[str, Any], key: str = "value") -> list[float]:
        """Per run, the figure of the measurement matching `a` / that of the one matching `b`."""
        out = []
        for run in runs:
            x, y = _values(records, key, run=run, **a), _values(records, key, run=run, **b)
            if x and y:
                out.append(x[0] / y[0])
        return out

    def paired(lib: str, workload: str) -> list[float]:
        """Per run, `workload` / the plain drain measured just before it."""
        return per_run(
            {"lib": lib, "workload": workload},
            {"lib": lib, "workload": "drain_1p", "pair": workload},
        )

    head = ["workload", "durable-worker"] + [labels[p] for p in peers] + ["bare loop"]
    head += [f"x {labels[p].split()[0]}" for p in peers] + ["x bare", "target", "met"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]

    def row(
        title: str,
        workload: str,
        key: str,
        ours: dict[str, Any],
        target: str,
        check: Callable[[dict[str, float | None]], bool | None],
    ) -> None:
        others = [*peers, "bare"]
        mine = {"lib": "durable", "workload": workload, "pair": None, **ours}
        ratios = {
            p: med(per_run(mine, {"lib": p, "workload": workload, "pair": None}, key))
            for p in others
        }
        cells = [title, cell(m("durable", workload, key, **ours))]
        cells += [cell(m(p, workload, key)) for p in others]
        cells += [f"{ratios[p]:.2f}x" if ratios[p] else "-" for p in others]
        verdict = check(ratios)
        cells += [target, "-" if verdict is None else ("yes" if verdict else "**no**")]
        lines.append("| " + " | ".join(cells) + " |")

    def at_least(lib: str, k: float) -> Callable[[dict[str, float | None]], Any]:
        return lambda r: None if not r.get(lib) else r[lib] >= k  # type: ignore[operator]

    def at_most(lib: str, k: float) -> Callable[[dict[str, float | None]], Any]:
        return lambda r: None if not r.get(lib) else r[lib] <= k  # type: ignore[operator]

    def both(*fs: Callable[..., Any]) -> Callable[..., Any]:
        def f(r: Any) -> Any:
            got = [g(r) for g in fs]
            return None if any(x is None for x in got) else all(got)

        return f

    row(
        f"enqueue, 1 job per call, {n:,} calls (jobs/s)",
        "enqueue_single",
        "value",
        {},
        ">= 1.0x PgQueuer",
        at_least("pgqueuer", 1.0),
    )
    row(
        f"enqueue_many, 1,000 jobs per call, {args.bulk_jobs:,} jobs (jobs/s)",
        "enqueue_bulk",
        "value",
        {},
        ">= 1.5x PgQueuer",
        at_least("pgqueuer", 1.5),
    )
    for procs in (1, 2):
        wl = f"drain_{procs}p"
        title = f"drain {n:,}, {procs} process{'es' if procs > 1 else ''} x c10 (jobs/s)"
        target = ">= 3x PgQueuer" + (", >= 0.5x bare" if procs == 1 else "")
        check = (
            both(at_least("pgqueuer", 3.0), at_least("bare", 0.5))
            if procs == 1
            else at_least("pgqueuer", 3.0)
        )
        row(title, wl, "value", {"variant": "warning"}, target, check)
        row(
            "... same, durable-worker at default INFO logging (jobs/s)",
            wl,
            "value",
            {"variant": "info"},
            target,
            check,
        )
    for key, name, k in (("p50_ms", "p50", 0.7), ("p99_ms", "p99", 1.0)):
        row(
            f"insert -> start latency {name} (ms)",
            "latency",
            key,
            {"variant": "warning"},
            f"<= {k}x PgQueuer",
            at_most("pgqueuer", k),
        )
        row(
            "... same, durable-worker at default INFO logging (ms)",
            "latency",
            key,
            {"variant": "info"},
            f"<= {k}x PgQueuer",
            at_most("pgqueuer", k),
        )
    lines.append("")

    # durable-worker against itself: each run's drain / the plain drain measured just before it
    own = [
        "| durable-worker workload | result | x the plain drain beside it (as many processes, "
        "WARNING logging, empty table) | target | met |",
        "|---|---|---|---|---|",
    ]

    def own_row(title: str, workload: str, k: float) -> None:
        vals, ratios = m("durable", workload), paired("durable", workload)
        if not vals:
            return
        r = med(ratios)
        met = "-" if r is None else ("yes" if r >= k else "**no**")
        plain = m("durable", "drain_1p", variant="warning", pair=workload)
        own.append(
            f"| {title} | {cell(vals)} jobs/s (plain: {cell(plain)}) "
            f"| {xcell(ratios)} | >= {k}x | {met} |"
        )

    for procs in (1, 2):
        wl, ours = f"drain_{procs}p", {"lib": "durable", "pair": None}
        at_info, at_warning = m("durable", wl, variant="info"), m("durable", wl, variant="warning")
        ratios = per_run(
            {**ours, "workload": wl, "variant": "info"},
            {**ours, "workload": wl, "variant": "warning"},
        )
        if at_info and at_warning:
            r = med(ratios)
            met = "-" if r is None else ("yes" if r >= 0.9 else "**no**")
            own.append(
                f"| drain {n:,}, {procs} process{'es' if procs > 1 else ''}, default INFO "
                f"logging (a line per job start and outcome) | {cell(at_info)} jobs/s (at "
                f"WARNING: {cell(at_warning)}) | {xcell(ratios)} | >= 0.9x | {met} |"
            )
    own_row(
        f"drain {n:,}, 1 process, with {args.history:,} finished jobs in the table",
        "drain_history",
        0.8,
    )
    own_row(
        f"drain {n:,}, 1 process, the queue limited to 10,000 running at once",
        "drain_limited",
        0.8,
    )
    own_row(
        f"drain {n:,} 3-stage pipeline jobs (stage outputs persisted), 1 process",
        "drain_pipeline",
        0.5,
    )
    mem = [r for r in records if r["workload"] == "memory" and r.get("verified")]
    if mem:
        growth = [float(r["rss_growth_mb"]) for r in mem if "rss_growth_mb" in r]
        start = [float(r["rss_at_20pct_mb"]) for r in mem if "rss_at_20pct_mb" in r]
        end = [float(r["rss_end_mb"]) for r in mem if "rss_end_mb" in r]
        rate = [float(r["value"]) for r in mem]
        flat = all(g <= max(2.0, 0.05 * s) for g, s in zip(growth, start, strict=True))
        own.append(
            f"| worker RSS while draining {args.memory_jobs:,} jobs (INFO logging, run 1): "
            f"after 20% "
            f"of the jobs -> at the end (MB) | {cell(start)} -> {cell(end)} "
            f"(growth {cell(growth)}); {cell(rate)} jobs/s | - | flat: growth <= max(2 MB, 5%) "
            f"in every run | {'yes' if flat else '**no**'} |"
        )
    if len(own) > 2:
        lines += [*own, ""]
    floor = m("bare", "drain_pipeline")
    over_floor = per_run(
        {"lib": "durable", "workload": "drain_pipeline"},
        {"lib": "bare", "workload": "drain_pipeline"},
    )
    if floor:
        lines += [
            "The pipeline's floor, same run: the bare loop with 3 stages (the claim starts stage "
            "1, one committed statement per stage boundary, the completion ends stage 3; no job "
            f"code) drains {cell(floor)} jobs/s: {xcell(paired('bare', 'drain_pipeline'))} the "
            "bare claim/complete loop measured just before it. durable-worker's pipeline is "
            f"{xcell(over_floor)} that floor in the same run.",
            "",
        ]

    lines += _processes_table(records, per_run, args)
    lines += _cpu_table(
        m, labels, peers, info["nproc"], m("durable", "drain_1p", pair="drain_pipeline")
    )

    lines += kills.section(records)

    bad = [r for r in records if not r.get("verified")]
    total = len(records)
    lines.append(
        f"Every cell: median (min-max) over {args.runs} run(s), verified measurements only; "
        f"{total - len(bad)} of {total} measurements passed the exactly-once and database "
        "checks. Ratios: the median over the runs of durable-worker's figure / the other's in "
        "the same run (the machine's speed drifts from minute to minute, the runs are minutes "
        "apart); for latency, lower is better, so its targets are at most a ratio."
    )
    for r in bad:
        why = r.get("check") or (r.get("error") or "").strip().splitlines()[-1:]
        lines.append(f"- NOT VERIFIED: run {r['run']} {r['workload']} {r['label']}: {why}")
    lines += ["", "Configurations:", ""]
    seen = set()
    for r in records:
        seen_key = (r["label"], r.get("config"))
        if seen_key not in seen and r["workload"].startswith(("drain_1p", "enqueue")):
            seen.add(seen_key)
            lines.append(f"- {r['label']}, {r['workload']}: {r.get('config')}")
    lines += [
        "",
        f"Machine: {info['nproc']} CPUs ({info['cpu']}), Python {info['python']} "
        f"({info['loop']}), {info['postgres']} on the same machine "
        f"({info['pg_settings']}).",
        f"Command: `{info['command']}` ({info['elapsed_s']} s).",
    ]
    return "\n".join(lines) + "\n"


def _processes_table(
    records: list[dict[str, Any]], per_run: Callable[..., list[float]], args: Any
) -> list[str]:
    """CPU-bound sync tasks: `worker run --processes 2` / `--processes 1`, per run, with the
    defaults and with `--pin-cpus`."""
    from bench.cpu import LOOPS

    if not _values(records, "value", lib="durable", workload="cpu_1p"):
        return []
    ceiling = per_run(
        {"lib": "bare_processes", "workload": "cpu_2p"},
        {"lib": "bare_processes", "workload": "cpu_1p"},
    )
    job_ms = cell(_values(records, "worker_cpu_ms_per_job", lib="durable", workload="cpu_1p"))
    lines = [
        f"CPU-bound sync tasks: {LOOPS:,} loops of pure Python a job ({job_ms} ms of worker CPU "
        f"a job with `--processes 1`), a drain of {args.cpu_jobs:,} by `worker run --processes "
        "P`, concurrency 10 per process. The same loop in 2 / 1 bare processes, no queue (the "
        f"ceiling of the moment): {xcell(ceiling)}.",
        "",
        "| `worker run` | `--processes 1` (jobs/s) | `--processes 2` (jobs/s) | x, per run "
        "| cores the workers used (1 -> 2) | PostgreSQL's cores (2 processes) | target | met |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for option, suffix in (("defaults", ""), ("`--pin-cpus`", "_pinned")):
        one, two = f"cpu_1p{suffix}", f"cpu_2p{suffix}"
        ratios = per_run({"lib": "durable", "workload": two}, {"lib": "durable", "workload": one})
        r = med(ratios)
        met = "-" if r is None else ("yes" if r >= 1.7 else "**no**")
        cores = [
            cell(_values(records, "worker_cores", lib="durable", workload=w)) for w in (one, two)
        ]
        server = cell(_values(records, "server_cores", lib="durable", workload=two))
        per = " · ".join(f"{x:.2f}x" for x in ratios) or "-"
        lines.append(
            f"| {option} | {cell(_values(records, 'value', lib='durable', workload=one))} "
            f"| {cell(_values(records, 'value', lib='durable', workload=two))} "
            f"| {per} (median {xcell(ratios)}) | {cores[0]} -> {cores[1]} | {server} "
            f"| >= 1.7x | {met} |"
        )
    return [*lines, ""]


def _cpu_table(
    m: Callable[..., list[float]],
    labels: dict[str, str],
    peers: list[str],
    cpus: int,
    single_stage: list[float],
) -> list[str]:
    """Where the CPU of a drain goes: the worker processes' and the server's time per job.

    Together they bound the rate on this machine: `cpus` CPUs cannot finish more than
    cpus / (CPU time per job) jobs a second, however the work overlaps.
    """
    runs: list[tuple[str, str, str, dict[str, Any]]] = [
        ("durable", "drain 1 process", "drain_1p", {"variant": "warning"}),
        ("durable", "drain 1 process, INFO logging", "drain_1p", {"variant": "info"}),
        *((p, "drain 1 process", "drain_1p", {}) for p in peers),
        ("bare", "drain 1 process", "drain_1p", {}),
        ("durable", "3-stage pipeline", "drain_pipeline", {}),
        ("bare", "3-stage pipeline", "drain_pipeline", {}),
    ]
    out = [
        "Where the CPU goes (median per job over the runs; the server's time is that of all "
        "its processes, so it includes the harness's few queries and any autovacuum):",
        "",
        "| library | workload | jobs/s | worker CPU (ms/job) | PostgreSQL CPU (ms/job) "
        f"| ceiling on {cpus} CPUs (jobs/s) | machine busy | steal |",
        "|---|---|---|---|---|---|---|---|",
    ]
    pipeline_cpu = None
    for lib, title, workload, match in runs:
        worker = med(m(lib, workload, "worker_cpu_ms_per_job", **match))
        server = med(m(lib, workload, "server_cpu_ms_per_job", **match))
        if worker is None:
            continue
        total = worker + (server or 0.0)
        ceiling = f"{1000 * cpus / total:,.0f}" if server is not None else "-"
        if lib == "durable" and workload == "drain_pipeline" and server is not None:
            pipeline_cpu = total
        out.append(
            f"| {labels.get(lib, lib)} | {title} | {cell(m(lib, workload, **match))} "
            f"| {worker:.3f} | {'-' if server is None else f'{server:.3f}'} | {ceiling} "
            f"| {_pct(m(lib, workload, 'machine_busy_pct', **match))} "
            f"| {_pct(m(lib, workload, 'steal_pct', **match))} |"
        )
    if len(out) == 5:
        return []
    out.append("")
    target = med(single_stage)
    if pipeline_cpu is not None and target:
        need = 1000 * cpus / (0.5 * target)
        out += [
            f"The pipeline target, 0.5x the single-stage drain ({0.5 * target:,.0f} jobs/s), "
            f"leaves {need:.3f} ms of CPU per job on {cpus} CPUs, worker and server together; "
            f"durable-worker's pipeline used {pipeline_cpu:.3f}.",
            "",
        ]
    return out


def _pct(vals: list[float]) -> str:
    return f"{med(vals):.0f}%" if vals else "-"
