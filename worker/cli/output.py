"""How the CLI prints: the two consoles, short durations and ages, status colours, JSON, and
tables fitted to the terminal.

Tables and results go to stdout; progress bars and errors to stderr, so a script reading
stdout gets only what it asked for. A table wider than the terminal gives up width in a fixed
order (`Fit`): an error summary first, then ids (down to their last characters), then names
that may be cut, then columns that wrap; a task, a status or a count is never shortened.
What this does not do: it reads nothing and decides nothing; each command chooses what to
show.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import Enum
from typing import Any

from rich.cells import cell_len
from rich.console import Console
from rich.table import Table
from rich.text import Text

from worker.models import JobStatus

out = Console()
err = Console(stderr=True)

_STATUS_STYLE: dict[str, str] = {
    JobStatus.PENDING: "yellow",
    JobStatus.PROCESSING: "cyan",
    JobStatus.COMPLETED: "green",
    JobStatus.FAILED: "red",
    JobStatus.PAUSED: "magenta",
    JobStatus.CANCELLED: "dim",
    JobStatus.HELD: "blue",
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


def status_style(status: str) -> str:
    """The colour a status is shown in."""
    return _STATUS_STYLE.get(status, "default")


class Fit(Enum):
    """How a column of `fitted` gives up width, in this order, when the table is too wide."""

    DROP = 1  # an extra (an error summary): cut, and left out when under `least`
    TAIL = 2  # an id: its last characters after an ellipsis (UUIDv7 ids begin with the time)
    CUT = 3  # a name read at a glance (a queue): cut with an ellipsis
    WRAP = 4  # a name that must be read whole (a task): folded onto more lines
    KEEP = 5  # a status, a count, an age: never shortened


@dataclass
class Column:
    """One column of a `fitted` table: its header, its cells as text, how it gives up width
    and the least width it keeps (the header's, by default); `styles` colours its cells."""

    name: str
    cells: list[str]
    fit: Fit = Fit.KEEP
    least: int = 0
    styles: list[str] | None = None

    @property
    def natural(self) -> int:
        """The width it takes unshortened (in terminal cells: a CJK character takes two)."""
        return max([cell_len(self.name), *(cell_len(c) for c in self.cells)])


GAP = 2  # the space between two columns of a table without borders
_SHRINK_ORDER = (Fit.DROP, Fit.TAIL, Fit.CUT, Fit.WRAP)


def _widths(columns: list[Column], width: int) -> list[int]:
    """Each column's width: the natural one, less what the table must give up, taken from
    the columns in `_SHRINK_ORDER`; a `DROP` column that cannot give enough is left out (0)."""
    widths = [c.natural for c in columns]
    excess = sum(widths) + GAP * (len(columns) - 1) - width
    for fit in _SHRINK_ORDER:
        for i, column in enumerate(columns):
            if excess <= 0 or column.fit is not fit:
                continue
            take = min(excess, widths[i] - min(max(column.least, 1), widths[i]))
            widths[i] -= take
            excess -= take
            if fit is Fit.DROP and excess > 0:
                excess -= widths[i] + GAP
                widths[i] = 0
    return widths


def _shorten(text: str, fit: Fit, width: int) -> str:
    if len(text) <= width or fit in (Fit.WRAP, Fit.KEEP):
        return text
    if fit is Fit.TAIL:
        return "…" + text[len(text) - width + 1 :]
    return text[: width - 1] + "…"


def fitted(columns: list[Column], width: int | None = None) -> tuple[Table, bool]:
    """The table of `columns` within `width` (the terminal's by default), and whether an id
    column was shortened (a caller then says how to see ids whole)."""
    widths = _widths(columns, out.width if width is None else width)
    shown = [(c, w) for c, w in zip(columns, widths, strict=True) if w > 0]
    table = Table(box=None, pad_edge=False, header_style="bold")
    for column, w in shown:
        wraps = column.fit is Fit.WRAP
        table.add_column(
            column.name, width=w, no_wrap=not wraps, overflow="fold" if wraps else "ellipsis"
        )
    for row in range(len(columns[0].cells) if columns else 0):
        table.add_row(
            *(
                Text(
                    _shorten(column.cells[row], column.fit, w),
                    style=column.styles[row] if column.styles else "",
                )
                for column, w in shown
            )
        )
    shortened = any(
        c.fit is Fit.TAIL and w < c.natural for c, w in zip(columns, widths, strict=True)
    )
    return table, shortened


def summary(text: str | None, width: int = 60) -> str:
    """The first line of an error (`Type: message`; the traceback follows it), shortened."""
    line = (text or "").strip().split("\n", 1)[0]
    return line if len(line) <= width else line[: width - 1] + "…"
