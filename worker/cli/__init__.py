"""The `worker` program: the daemon, migrations, and the operator's verbs.

Errors are one red line and exit code 1 (bad settings and usage: 2), never a traceback.
Each command group lives in a module of its own (`run`, `schedule`, `jobs`, `failures`,
`status`, `queues`, `maintenance`, `serve`); this module registers them, in the order
`worker --help` lists them, and runs the program. What this does not do: no command's work
is done here.
"""

from __future__ import annotations

import os
import sys
from typing import Annotated

import typer
from rich.markup import escape

from worker import __version__
from worker.cli import failures, maintenance, queues, serve, status
from worker.cli import jobs as job_commands
from worker.cli import run as run_command
from worker.cli import schedule as schedule_command
from worker.cli import workflows as workflow_commands
from worker.cli.errors import CliError, fail, friendly
from worker.cli.output import err, out
from worker.cli.shadowing import shadowing_message, shadowing_module

__all__ = ["CliError", "app", "err", "fail", "main", "out"]

app = typer.Typer(
    help="durable-worker: background jobs on PostgreSQL.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _print_version(value: bool) -> None:
    if value:
        out.print(f"durable-worker-pg {__version__}", highlight=False, markup=False)
        raise typer.Exit()


@app.callback()
def _program(
    version: Annotated[
        bool,
        typer.Option(
            "--version", is_eager=True, callback=_print_version, help="Print the version and exit."
        ),
    ] = False,
) -> None:
    """durable-worker: background jobs on PostgreSQL."""


db_app = typer.Typer(help="The embedded PostgreSQL (used when DATABASE_URL is unset).")
app.add_typer(db_app, name="db")
app.add_typer(queues.queue_app, name="queue")
app.add_typer(workflow_commands.workflow_app, name="workflow")

for command in (
    run_command.run,
    schedule_command.schedule,
    maintenance.migrate,
    job_commands.enqueue,
    job_commands.cancel,
    job_commands.resume,
    job_commands.retry,
    job_commands.show,
    job_commands.jobs,
    workflow_commands.workflows,
    failures.failures,
    status.stats,
    status.workers,
    queues.queues,
    maintenance.prune,
    serve.demo,
    serve.bench,
    serve.api,
):
    app.command()(friendly(command))
db_app.command("start")(friendly(maintenance.db_start))
workflow_commands.workflow_app.command("show")(friendly(workflow_commands.workflow_show))
db_app.command("stop")(friendly(maintenance.db_stop))


def main() -> None:
    """The `worker` program. Usage errors are one red line too, with exit code 2, and so is
    a module of the application's own named `worker` where task modules are imported from."""
    shadow = shadowing_module([os.getcwd(), *sys.path])
    if shadow is not None:
        message = escape(shadowing_message(shadow))
        err.print(f"[red]error:[/red] {message}", highlight=False, soft_wrap=True)
        sys.exit(2)
    try:
        code = app(standalone_mode=False)
    except typer.TyperException as exc:  # Typer's usage errors (BadParameter, ...) derive it
        if type(exc).__name__ == "NoArgsIsHelpError":
            err.print(exc.format_message(), highlight=False, markup=False)  # `worker` alone
            sys.exit(2)
        ctx = getattr(exc, "ctx", None)
        hint = f" (see `{ctx.command_path} --help`)" if ctx is not None else ""
        message = escape(exc.format_message().replace("\n", " "))
        err.print(f"[red]error:[/red] {message}{hint}", highlight=False, soft_wrap=True)
        sys.exit(exc.exit_code)
    except typer.Abort:
        err.print("[red]error:[/red] aborted", highlight=False)
        sys.exit(1)
    sys.exit(code if isinstance(code, int) else 0)
