"""What the CLI reads from its command line: ages, job ids, JSON, and the shared options.

Each parser names the option it read when it refuses a value, so the red line says what to
fix. What this does not do: it opens no connection; a value the database refuses is
reported by `worker.cli.errors`.
"""

from __future__ import annotations

import json
import math
from enum import StrEnum
from typing import Annotated, Any

import typer

from worker.cli.errors import UsageError
from worker.ids import job_id_text

_AGE_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}


class Retryable(StrEnum):
    """The statuses `worker retry --all --status` accepts."""

    FAILED = "failed"
    CANCELLED = "cancelled"


def parse_age(text: str, option: str) -> float:
    """An age such as `30s`, `15m`, `12h`, `7d`, `2w` (or plain seconds) in seconds.

    >>> parse_age("15m", "--older-than")
    900.0
    """
    value = text.strip().lower()
    unit = value[-1:] if value[-1:] in _AGE_UNITS else "s"
    number = value[:-1] if value[-1:] in _AGE_UNITS else value
    try:
        seconds = float(number) * _AGE_UNITS[unit]
    except ValueError:
        seconds = math.nan
    if not 0 <= seconds < math.inf:
        raise typer.BadParameter(
            f"{text!r} is not an age like 30s, 15m, 12h, 7d or 2w", param_hint=option
        )
    return seconds


# What `worker jobs` prints before a shortened id, and its ASCII spelling.
ELLIPSES = ("…", "...")
SHORTEST_ID = 4  # hex digits: fewer would name too many jobs to be worth a lookup


def parse_job_id(value: str | None) -> str | None:
    """A job id argument: a whole id in its canonical form, or the part of one that `worker
    jobs` prints (`…` and its last characters), or its first characters, as at least four hex
    digits (`worker.cli.lookup` finds the job); None stays None. Anything else is refused."""
    if value is None:
        return None
    canonical = job_id_text(value)
    if canonical is not None:
        return canonical
    text = value.strip().lower()
    tail = text.startswith(ELLIPSES)
    digits = text.removeprefix("…").removeprefix("...").replace("-", "")
    if len(digits) < SHORTEST_ID or len(digits) > 32 or digits.strip(_HEX):
        raise typer.BadParameter(
            f"{value!r} is not a job id (a UUID such as 0b0e3c5e-2f4a-4c1e-9d3b-6a1f2e3d4c5b, "
            f"or at least {SHORTEST_ID} of its first or last characters)"
        )
    return f"…{digits}" if tail else digits


_HEX = "0123456789abcdef"


def parse_json(text: str, what: str) -> Any:
    """`text` as JSON, or a one-line error naming `what` and where the JSON breaks."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise UsageError(f"{what} is not valid JSON: {exc.msg} at position {exc.pos}") from None


JobId = Annotated[
    str,
    typer.Argument(
        help="The job's id: a UUID, or its first or last characters (at least 4, as "
        "`worker jobs` prints them) when they name one job.",
        callback=parse_job_id,
    ),
]
AsJson = Annotated[bool, typer.Option("--json", help="Print JSON for scripts.")]
