"""The progress bar the programs draw on a terminal: the CLI's bulk commands, the demo and
`worker bench` alike.

What this does not do: it reads nothing; each caller says what it counts.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rich.console import Console
    from rich.progress import Progress


def progress_bar(console: Console, width: int = 0) -> Progress:
    """A progress bar on `console` (the CLI's is stderr, so stdout stays clean for scripts);
    `width` pads the descriptions so that several bars line up."""
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
