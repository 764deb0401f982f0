"""`worker run`: the daemon in the foreground until SIGTERM or Ctrl-C.

It imports the task modules, waits for the database (or gives up after --connect-timeout),
checks or applies the schema, serves /metrics when WORKER_METRICS_PORT is set, and runs the
worker. With `--processes N` (N > 1) it runs no worker itself: after the same checks it
supervises N children, each this command as one process (`worker.daemon.supervisor`). What
this does not do: the claiming, retrying and rescuing are `worker.daemon`'s.
"""

from __future__ import annotations

import asyncio
import importlib
import logging
import os
import signal
import sys
import threading
import traceback
from typing import TYPE_CHECKING, Annotated, Any

import typer
from pydantic import ValidationError

from worker.cli.errors import CliError, fail
from worker.cli.session import ensure_schema, settings, url
from worker.settings import Settings

if TYPE_CHECKING:
    from worker.metrics import MetricsServer


def run(
    modules: Annotated[list[str], typer.Argument(help="Modules defining your tasks.")],
    queues: Annotated[str | None, typer.Option(help="Comma-separated queues.")] = None,
    concurrency: Annotated[int | None, typer.Option(min=1, help="Jobs at once.")] = None,
    processes: Annotated[
        int | None,
        typer.Option(
            help="Worker processes to start and keep running (WORKER_PROCESSES, default 1): "
            "more than one puts CPU-bound sync tasks on more cores.",
        ),
    ] = None,
    pin_cpus: Annotated[
        bool | None,
        typer.Option(
            "--pin-cpus/--no-pin-cpus",
            help="Pin worker process k to the k-th CPU it may use (WORKER_PIN_CPUS, Linux): "
            "for CPU-bound tasks on a machine given to the worker.",
        ),
    ] = None,
    burst: Annotated[
        bool,
        typer.Option(
            "--burst",
            help="Exit (code 0) once its queues have no due job and its own jobs have ended: "
            "for cron and CI. Jobs due later (run_at in the future, a retry's backoff) do not "
            "keep it running. With --processes N, each process exits when it finds nothing.",
        ),
    ] = False,
    migrate: Annotated[bool, typer.Option(help="Apply migrations before starting.")] = False,
    connect_timeout: Annotated[
        float | None,
        typer.Option(
            "--connect-timeout",
            min=0,
            help="Give up (exit 1) if the database does not answer within this many seconds "
            "at start. Default: keep retrying until it answers.",
        ),
    ] = None,
    supervisor_pid: Annotated[int | None, typer.Option(hidden=True)] = None,
) -> None:
    """Run the worker daemon until SIGTERM or Ctrl-C (with --burst: until nothing is due).

    Example: worker run myapp.tasks --queues default,emails --concurrency 20 --processes 2
    """
    from worker.daemon import DutyFailed, Worker
    from worker.daemon.db import DatabaseUnreachable, wait_for_database
    from worker.db.connect import PoolerMismatch
    from worker.logs import configure, flush

    s = settings()
    given = {
        "queues": queues,
        "concurrency": concurrency,
        "processes": processes,
        "pin_cpus": pin_cpus,
    }
    for option, value in given.items():
        if value is not None:  # the settings' own checks: 1 to 1000 slots, a queue at least
            try:
                s = s.model_validate({**s.model_dump(), option: value})
            except ValidationError as exc:
                message = str(exc.errors()[0].get("msg", "is invalid"))
                raise fail(f"--{option}: {message.removeprefix('Value error, ')}", 2) from None
    configure(s.log_level, s.log_format)
    if s.pin_cpus and s.processes == 1:
        pin_alone()  # before the task modules are imported: threads they start are pinned too
    import_task_modules(modules)
    database = url()
    try:
        wait_for_database(database, connect_timeout)
    except DatabaseUnreachable as exc:
        raise CliError(str(exc)) from None
    ensure_schema(database, migrate=migrate)
    if s.processes > 1:
        raise typer.Exit(supervise(modules, s, burst=burst))
    worker = Worker(database, s, burst=burst)
    server = serve_metrics(worker, database, s) if s.metrics_port is not None else None

    async def main() -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, worker.request_stop)
        if supervisor_pid is None:
            await worker.run()
            return
        from worker.daemon.supervisor import stop_when_orphaned

        watch = asyncio.create_task(stop_when_orphaned(supervisor_pid, worker.request_stop))
        try:
            await worker.run()
        finally:
            watch.cancel()

    try:
        asyncio.run(main())
    except DutyFailed as exc:  # logged with its traceback already
        raise CliError(str(exc)) from None
    except PoolerMismatch as exc:  # an undeclared pooler the start check could not see
        raise CliError(str(exc)) from None
    finally:
        if server is not None:
            server.stop()
        # The loop's last lines, before an error's own words and before `os._exit` below.
        flush()
    if any(t.name.startswith("worker-task") and t.is_alive() for t in threading.enumerate()):
        # A sync task ignoring its timeout still runs; its job was handed back already.
        sys.stderr.flush()
        os._exit(0)


def supervise(modules: list[str], s: Settings, *, burst: bool = False) -> int:
    """Start `s.processes` children, each this command as one process, and keep them running
    until SIGTERM or Ctrl-C (with `burst`: until each has exited); the exit code of the
    whole."""
    from worker.daemon.supervisor import STOP_MARGIN, Supervisor, usable_cpus

    command = [sys.executable, "-m", "worker", "run", *modules]
    command += ["--supervisor-pid", str(os.getpid()), *(["--burst"] if burst else [])]
    # The options given here reach the children as settings; the schema is checked already.
    # A child is pinned by the supervisor as it starts, not by itself.
    base = {
        **os.environ,
        "WORKER_PROCESSES": "1",
        "WORKER_PIN_CPUS": "false",
        "WORKER_QUEUES": ",".join(s.queues),
        "WORKER_CONCURRENCY": str(s.concurrency),
    }

    def env_for(slot: int) -> dict[str, str]:
        if s.metrics_port is None:
            return base
        return {**base, "WORKER_METRICS_PORT": str(s.metrics_port + slot - 1)}

    stop_timeout = s.shutdown_grace + STOP_MARGIN
    cpus = usable_cpus() if s.pin_cpus else None
    return Supervisor(
        command, s.processes, env_for=env_for, stop_timeout=stop_timeout, cpus=cpus, burst=burst
    ).run()


def pin_alone() -> None:
    """WORKER_PIN_CPUS with one process: it is worker process 1, on the first CPU it may use."""
    from worker.daemon.supervisor import cpu_of, pin, usable_cpus
    from worker.logs import fields

    cpu = cpu_of(1, usable_cpus())
    pin(cpu)
    logging.getLogger("worker.daemon").info(
        "pinned to CPU %d", cpu, extra=fields("worker.pinned", cpu=cpu)
    )


def import_task_modules(modules: list[str]) -> None:
    """Import the modules defining tasks, from the current directory too. A module that
    cannot be imported (missing, or raising as it is imported: a syntax error, a bad import,
    any exception) is a usage error: one line naming the file and line, exit code 2."""
    sys.path.insert(0, os.getcwd())
    for name in modules:
        try:
            importlib.import_module(name)
        except Exception as exc:
            raise fail(f"cannot import task module {name!r}: {import_failure(exc)}", 2) from None


def import_failure(exc: BaseException) -> str:
    """Why an import failed, in one line: where (file:line) and the exception's first line."""
    from worker.logs import first_line

    if isinstance(exc, SyntaxError):  # its own place: the traceback ends in the import system
        where, what = f"{exc.filename}:{exc.lineno}", f"{type(exc).__name__}: {exc.msg}"
    else:
        called = traceback.extract_tb(exc.__traceback__)[1:]  # below the importing call
        frames = [f for f in called if _user_frame(f.filename)]
        where = f"{frames[-1].filename}:{frames[-1].lineno}" if frames else ""
        what = f"{type(exc).__name__}: {first_line(exc)}"
    if not where:
        return what
    return f"{where}: {what}"


def _user_frame(filename: str) -> bool:
    """A frame of the imported code, not of the import machinery."""
    return not filename.startswith("<frozen ") and "importlib" not in filename


def serve_metrics(worker: Any, database: str, s: Settings) -> MetricsServer:
    """Count the worker's jobs and serve /metrics on WORKER_METRICS_PORT."""
    from worker import metrics
    from worker.logs import fields

    assert s.metrics_port is not None
    metrics.instrument(worker)
    try:
        server = metrics.serve(s.metrics_port, database, s.lease_seconds)
    except OSError as exc:
        raise CliError(
            f"cannot serve metrics on WORKER_METRICS_PORT={s.metrics_port}: {exc.strerror}"
        ) from None
    logging.getLogger("worker.daemon").info(
        "metrics at http://0.0.0.0:%d/metrics",
        server.port,
        extra=fields("metrics.serving", port=server.port),
    )
    return server
