"""How the CLI prints: the two consoles, short durations and ages, status colours, JSON.

Tables and results go to stdout; progress bars and errors to stderr, so a script reading
stdout gets only what it asked for. What this does not do: it reads nothing and decides
nothing; each command chooses what to show.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from rich.console import Console

from worker.models import JobStatus

if TYPE_CHECKING:
    from rich.progress import Progress

out = Console()
err = Console(stderr=True)

_STATUS_STYLE: dict[str, str] = {
    JobStatus.PENDING: "yellow",
    JobStatus.PROCESSING: "cyan",
    JobStatus.COMPLETED: "green",
    JobStatus.FAILED: "red",
    JobStatus.PAUSED: "magenta",
    JobStatus.CANCELLED: "dim",
}


def emit_json(data: Any) -> None:
    """Print `data` as JSON on stdout; moments as ISO 8601, anything else as its text."""

    def encode(value: Any) -> str:
        return value.isoformat() if isinstance(value, datetime) else str(value)

    out.print_json(json.dumps(data, default=encode))


def span(seconds: float | None) -> str:
    """A short human duration: 850ms, 4.2s, 3m 05s, 2h 10m, 3d 4h."""
    if seconds is None:
        return "-"
    if seconds < 1:
        return f"{seconds * 1000:.0f}ms"
    if seconds < 60:
        return f"{seconds:.1f}s" if seconds < 10 else f"{seconds:.0f}s"
    minutes, secs = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes}m {secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    if hours < 48:
        return f"{hours}h {minutes:02d}m"
    days, hours = divmod(hours, 24)
    return f"{days}d {hours}h"


def ago(moment: datetime | None) -> str:
    """How long before now `moment` was, as `span` words it: `3m 05s ago`."""
    if moment is None:
        return "-"
    return f"{span((datetime.now(UTC) - moment).total_seconds())} ago"


def styled(status: str) -> str:
    """A status in its colour, as Rich markup."""
    return f"[{_STATUS_STYLE.get(status, 'default')}]{status}[/]"


def summary(text: str | None, width: int = 60) -> str:
    """The first line of an error (`Type: message`; the traceback follows it), shortened."""
    line = (text or "").strip().split("\n", 1)[0]
    return line if len(line) <= width else line[: width - 1] + "…"


def progress(console: Console = err, width: int = 0) -> Progress:
    """A progress bar (on stderr by default, so stdout stays clean for scripts); `width` pads
    the descriptions so that several bars line up."""
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
    )

    description = f"{{task.description:<{width}}}" if width else "{task.description}"
    return Progress(
        TextColumn(description),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
    )
