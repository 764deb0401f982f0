"""`worker queues` and `worker queue pause|resume|limit`: what each queue does, and steering it.

A pause or a limit holds on every worker from its next claim on (within a poll, at once for
idle ones: a resume or a new limit wakes them); running jobs go on. What this does not do: the
rule of what a claim may take is `worker.queue_budget`'s (migration 0008), and the writes are
the client's.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Annotated

import typer

from worker.cli.errors import friendly
from worker.cli.options import AsJson
from worker.cli.output import Column, Fit, emit_json, fitted, out
from worker.cli.session import client
from worker.client.queues import QueueState

queue_app = typer.Typer(help="Pause, resume or limit one queue, on every worker at once.")

QueueName = Annotated[str, typer.Argument(help="The queue's name.")]


def _limits(state: QueueState) -> str:
    parts = []
    if state.concurrency is not None:
        parts.append(f"{state.concurrency} at once")
    if state.rate is not None:
        burst = f", bursts of {state.burst:g}" if state.burst is not None else ""
        parts.append(f"{state.rate:g}/s{burst}")
    return "; ".join(parts) or "none"


def _said(state: QueueState) -> None:
    paused = "[yellow]paused[/yellow]" if state.paused else "[green]running[/green]"
    out.print(f"queue {state.name}: {paused}, limits: {_limits(state)}")


def queues(as_json: AsJson = False) -> None:
    """Each queue with live jobs or controls: running or paused, its limits, its depth.

    Example: worker queues --json
    """
    states = client().queues()
    if as_json:
        emit_json([asdict(state) for state in states])
        return
    if not states:
        out.print("no queue has live jobs, and none is paused or limited")
        return
    table, _ = fitted(
        [
            Column("queue", [state.name for state in states], Fit.WRAP, least=12),
            Column("state", ["paused" if state.paused else "running" for state in states]),
            Column("limits", [_limits(state) for state in states], Fit.WRAP, least=12),
            Column("pending", [str(state.pending) for state in states]),
            Column("processing", [str(state.processing) for state in states]),
        ]
    )
    out.print(table)


def pause(name: QueueName) -> None:
    """Stop claims from the queue on every worker; running jobs finish.

    Example: worker queue pause emails
    """
    _said(client().pause_queue(name))


def resume(name: QueueName) -> None:
    """Let every worker claim from the queue again.

    Example: worker queue resume emails
    """
    _said(client().resume_queue(name))


def limit(
    name: QueueName,
    concurrency: Annotated[
        int | None, typer.Option(help="Jobs of the queue running at once, across all workers.")
    ] = None,
    rate: Annotated[float | None, typer.Option(help="Jobs started per second, at most.")] = None,
    burst: Annotated[
        float | None, typer.Option(help="With --rate: jobs that may start at once (default: rate).")
    ] = None,
) -> None:
    """Set the queue's limits; those not given are lifted (no option lifts them all).

    Example: worker queue limit emails --concurrency 2 --rate 5
    """
    _said(client().limit_queue(name, concurrency=concurrency, rate=rate, burst=burst))


for command in (pause, resume, limit):
    queue_app.command()(friendly(command))
