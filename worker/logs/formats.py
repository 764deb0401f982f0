"""The two forms of a log line, text for people and JSON for machines, and what a line may say:
no password of a URL, and an error in one line.

Each form builds its line from the parts of a record (`Lines.line`), so a record that goes
through `logging` and an event written straight out (`worker.logs.log_info`) come out the same.
"""

from __future__ import annotations

import json
import logging
import re
import time
from abc import ABC, abstractmethod

_SECRET = re.compile(r"(://[^:/@\s]+):[^@\s]*@")
# Keys a JSON line always has; an event's fields never overwrite them.
_RESERVED = frozenset({"ts", "level", "logger", "event", "message", "exception"})


def scrub(text: str) -> str:
    """Hide the password of every URL in `text`.

    >>> scrub("cannot reach postgresql://app:s3cret@db:5432/app")
    'cannot reach postgresql://app:***@db:5432/app'
    """
    return _SECRET.sub(r"\1:***@", text) if "://" in text else text


def first_line(error: BaseException | str) -> str:
    """What went wrong in one line: the database's own words, without the statement
    SQLAlchemy appends, and without any password. An exception with no words is named by
    its type; an empty text stays empty.

    >>> first_line(ValueError("bad value\\nLINE 1: SELECT ..."))
    'bad value'
    """
    if isinstance(error, str):
        text, fallback = error.strip(), ""
    else:
        text, fallback = str(getattr(error, "orig", None) or error).strip(), type(error).__name__
    return scrub(text.splitlines()[0]) if text else fallback


def fields(event: str, **values: object) -> dict[str, object]:
    """The `extra=` of a log call: an event name and its fields (JSON lines carry them).

    >>> log = logging.getLogger("worker.jobs")
    >>> log.info("job %s cancel requested", "0b0e", extra=fields("job.cancel_requested",
    ...                                                          job_id="0b0e"))
    """
    return {"event": event, "fields": values}


class Lines(logging.Formatter, ABC):
    """A form of line: `line` builds it from a record's parts, `format` from a record."""

    def __init__(self) -> None:
        super().__init__()
        self._second, self._stamp = -1, ""  # the time shown changes once a second: format it once

    @abstractmethod
    def line(
        self, created: float, levelname: str, name: str, message: str, event: str, values: object
    ) -> str: ...

    @abstractmethod
    def stamp(self, second: int) -> str:
        """The shown time of every line logged in `second` (since the epoch)."""

    def _stamp_of(self, second: int) -> str:
        if second != self._second:
            self._second, self._stamp = second, self.stamp(second)
        return self._stamp


class TextLines(Lines):
    """`08:16:12 INFO    worker.jobs: job … completed after 0.017 s …`: local time, to the
    second; an exception's traceback follows on the lines below."""

    def stamp(self, second: int) -> str:
        return time.strftime("%H:%M:%S", time.localtime(second))

    def line(
        self, created: float, levelname: str, name: str, message: str, event: str, values: object
    ) -> str:
        return scrub(f"{self._stamp_of(int(created))} {levelname:<7} {name}: {message}")

    def format(self, record: logging.LogRecord) -> str:
        text = self.line(
            record.created, record.levelname, record.name, record.getMessage(), "", None
        )
        if record.exc_info and not record.exc_text:
            record.exc_text = self.formatException(record.exc_info)
        # Each on the lines below, as `logging.Formatter` puts them.
        for more in (record.exc_text, record.stack_info and self.formatStack(record.stack_info)):
            if more:
                text += ("" if text.endswith("\n") else "\n") + scrub(more)
        return text


# One encoder for every line: `json.dumps` with options builds a new one per call.
_encode_line = json.JSONEncoder(default=str).encode


class JsonLines(Lines):
    """One JSON object a line: `ts` (UTC, always to the microsecond, as
    `2026-11-30T08:11:23.385001+00:00`), `level`, `logger`, `event`, `message`, then the
    event's fields, and `exception` with a traceback."""

    def stamp(self, second: int) -> str:
        return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second))

    def entry(
        self, created: float, levelname: str, name: str, message: str, event: object, values: object
    ) -> dict[str, object]:
        second, micro = divmod(int(created * 1_000_000), 1_000_000)
        entry: dict[str, object] = {
            "ts": f"{self._stamp_of(second)}.{micro:06d}+00:00",
            "level": levelname.lower(),
            "logger": name,
        }
        if event is not None:
            entry["event"] = event
        entry["message"] = message
        if isinstance(values, dict):
            entry.update((k, v) for k, v in values.items() if k not in _RESERVED)
        return entry

    def line(
        self, created: float, levelname: str, name: str, message: str, event: str, values: object
    ) -> str:
        # Scrubbed as a whole, so a URL in any field is covered too.
        return scrub(_encode_line(self.entry(created, levelname, name, message, event, values)))

    def format(self, record: logging.LogRecord) -> str:
        entry = self.entry(
            record.created,
            record.levelname,
            record.name,
            record.getMessage(),
            getattr(record, "event", None),
            getattr(record, "fields", None),
        )
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return scrub(_encode_line(entry))
