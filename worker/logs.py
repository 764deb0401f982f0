"""Logging: one line per job transition and per daemon event; text on a terminal, or JSON
lines with `WORKER_LOG_FORMAT=json`. Passwords in URLs never reach a log line.

Daemon log calls name their event and its fields with `fields()`; a JSON line carries them as
keys beside the message, so a log pipeline can filter on `event` without parsing text:

    {"ts": "2026-11-30T08:01:02.345+00:00", "level": "info", "logger": "worker.jobs",
     "event": "job.completed", "message": "job 0b0e… (add) completed in 0.004 s ...",
     "job_id": "0b0e…", "task": "add", "queue": "default", "status": "completed",
     "duration": 0.004, "retry_count": 0}
"""

from __future__ import annotations

import json
import logging
import re
import sys
from datetime import UTC, datetime

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


class _TextFormatter(logging.Formatter):
    _second, _stamp = -1, ""  # the time shown changes once a second: format it once

    def format(self, record: logging.LogRecord) -> str:
        return scrub(super().format(record))

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:
        second = int(record.created)
        if second != self._second:
            self._second, self._stamp = second, super().formatTime(record, datefmt)
        return self._stamp


# One encoder for every line: `json.dumps` with options builds a new one per call.
_encode_line = json.JSONEncoder(default=str).encode


class _JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, object] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(),
            "level": record.levelname.lower(),
            "logger": record.name,
        }
        event = getattr(record, "event", None)
        if event is not None:
            entry["event"] = event
        entry["message"] = record.getMessage()
        values = getattr(record, "fields", None)
        if isinstance(values, dict):
            entry.update((k, v) for k, v in values.items() if k not in _RESERVED)
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        # Scrubbed as a whole, so a URL in any field is covered too.
        return scrub(_encode_line(entry))


def configure(level: str = "INFO", fmt: str = "text") -> None:
    """Send the `worker.*` loggers to stderr, as text lines or (`fmt="json"`) JSON lines.

    >>> configure("INFO", "json")   # what `worker run` does with WORKER_LOG_FORMAT=json
    """
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        handler.setFormatter(_JsonFormatter())
    else:
        handler.setFormatter(
            _TextFormatter("%(asctime)s %(levelname)-7s %(name)s: %(message)s", "%H:%M:%S")
        )
    # No line says where in the source, or in which thread or process, it was logged: not
    # collecting that makes each record about a fifth cheaper (the logging HOWTO, under
    # "Optimization"), and a busy worker logs two lines per job.
    logging._srcfile = None
    logging.logThreads = logging.logProcesses = logging.logMultiprocessing = False
    root = logging.getLogger("worker")
    root.handlers[:] = [handler]
    root.setLevel(level)
    root.propagate = False
    # Libraries' warnings and errors (the connection pool, ...) in the same format, so a JSON
    # log stays JSON on every line.
    logging.getLogger().handlers[:] = [handler]
