"""Logging: one line per job transition and per daemon event; text on a terminal, or JSON
lines with `WORKER_LOG_FORMAT=json`. Passwords in URLs never reach a log line.

Daemon log calls name their event and its fields with `fields()`; a JSON line carries them as
keys beside the message, so a log pipeline can filter on `event` without parsing text:

    {"ts": "2026-11-30T08:01:02.345678+00:00", "level": "info", "logger": "worker.jobs",
     "event": "job.completed", "message": "job 0b0e… (add) completed in 0.004 s ...",
     "job_id": "0b0e…", "task": "add", "queue": "default", "status": "completed",
     "duration": 0.004, "retry_count": 0}

A job's own lines, two a job, go through `log_info`: when the worker's handler (`configure`) is
the only one that would see them, they are written straight out, without a `LogRecord`; a
handler or filter of your own on the way turns that off, and it sees every record as usual.
"""

from __future__ import annotations

import logging
import sys
import time

from worker.logs.formats import JsonLines, Lines, TextLines, fields, first_line, scrub
from worker.logs.writer import LineWriter

__all__ = ["configure", "fields", "first_line", "flush", "log_info", "scrub"]

_INFO = logging.INFO


class _WorkerHandler(logging.Handler):
    """The handler `configure` installs: each record a line, through a `LineWriter`."""

    def __init__(self, writer: LineWriter, lines: Lines) -> None:
        super().__init__()
        self.writer = writer
        self.setFormatter(lines)

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.writer.write(self.format(record))
        except Exception:
            self.handleError(record)

    def flush(self) -> None:
        self.writer.flush()


_handler: _WorkerHandler | None = None


def configure(level: str = "INFO", fmt: str = "text") -> None:
    """Send the `worker.*` loggers to stderr, as text lines or (`fmt="json"`) JSON lines.

    >>> configure("INFO", "json")   # what `worker run` does with WORKER_LOG_FORMAT=json
    """
    global _handler
    flush()
    handler = _WorkerHandler(LineWriter(sys.stderr), JsonLines() if fmt == "json" else TextLines())
    # No line says where in the source, or in which thread or process, it was logged: not
    # collecting that makes each record cheaper (the logging HOWTO, under "Optimization").
    logging._srcfile = None
    logging.logThreads = logging.logProcesses = logging.logMultiprocessing = False
    root = logging.getLogger("worker")
    root.handlers[:] = [handler]
    root.setLevel(level)
    root.propagate = False
    # Libraries' warnings and errors (the connection pool, ...) in the same format, so a JSON
    # log stays JSON on every line.
    logging.getLogger().handlers[:] = [handler]
    _handler = handler


def log_info(
    logger: logging.Logger, event: str, message: str, /, *args: object, **values: object
) -> None:
    """Log `message % args` at INFO as `event` with its fields: what
    `logger.info(message, *args, extra=fields(event, **values))` logs, and the same line.

    >>> log_info(logging.getLogger("worker.jobs"), "job.cancel_requested",
    ...      "job %s cancel requested", "0b0e", job_id="0b0e")
    """
    if not logger.isEnabledFor(_INFO):
        return
    handler = _sole_handler(logger)
    if handler is None:
        logger.info(message, *args, extra=fields(event, **values))
        return
    lines: Lines = handler.formatter  # type: ignore[assignment]  # checked by _sole_handler
    text = message % args if args else message
    handler.writer.write(lines.line(time.time(), "INFO", logger.name, text, event, values))


def _sole_handler(logger: logging.Logger) -> _WorkerHandler | None:
    """The worker's handler, if it is the only one that would see `logger`'s records, as it
    was configured: no other handler, no filter, no record factory of someone else's."""
    own = _handler
    if (
        own is None
        or own.filters
        or own.level > _INFO
        or not isinstance(own.formatter, Lines)
        or logging.getLogRecordFactory() is not logging.LogRecord
    ):
        return None
    seen = False
    node: logging.Logger | None = logger
    while node is not None:
        if node.filters:
            return None
        for handler in node.handlers:
            if handler is not own:
                return None
            seen = True
        if not node.propagate:
            break
        node = node.parent
    return own if seen else None


def flush() -> None:
    """Write out the log lines still waiting for their event loop's next turn: before the
    process ends by a way that skips the exit hooks (`os._exit`)."""
    if _handler is not None:
        _handler.flush()
