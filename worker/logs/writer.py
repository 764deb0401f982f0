"""Log lines out to a file descriptor, whole, and in as few writes as the lines allow.

Each write is of whole lines and at most `PIPE_BUF` bytes, the size up to which the system
writes a pipe's or an appended file's bytes in one piece: the lines of several worker processes
sharing one stderr never interleave. Lines written on an event loop's thread wait for the loop's
next turn and go out together, one write for all of them; lines written on any other thread go
out at once, after those waiting. `flush` sends what waits, and the worker's handler is flushed
at exit by `logging`'s own exit hook.

What this does not do: a line longer than `PIPE_BUF` is written alone, but the system may then
split it; a line that cannot be written (stderr closed) is dropped, as the jobs matter more.
"""

from __future__ import annotations

import asyncio
import os
import select
import threading
from typing import IO

# The POSIX minimum where the system does not say.
PIPE_BUF = getattr(select, "PIPE_BUF", 512)
_ERRORS = "backslashreplace"  # as Python's own stderr: a line is never refused for a character


class LineWriter:
    """Lines to `stream`'s file descriptor, or to `stream` itself when it has none (a
    `StringIO`: each line at once)."""

    def __init__(self, stream: IO[str]) -> None:
        self._stream = stream
        try:
            self._fd: int | None = stream.fileno()
        except (AttributeError, OSError, ValueError):
            self._fd = None
        self._encoding = getattr(stream, "encoding", None) or "utf-8"
        self._waiting: list[str] = []
        self._size = 0
        # Reentrant, as `logging`'s own locks: a signal handler that logs may interrupt a write.
        self._lock = threading.RLock()
        self._flush_on: asyncio.AbstractEventLoop | None = None  # where a flush is due

    def write(self, line: str) -> None:
        """Send `line` (without its newline) now, or at the running loop's next turn."""
        line += "\n"
        if self._fd is None:
            with self._lock:
                self._stream.write(line)
                self._stream.flush()
            return
        # Counted in bytes: an ASCII line is as long in bytes as in characters.
        size = len(line) if line.isascii() else len(line.encode(self._encoding, _ERRORS))
        loop = asyncio._get_running_loop()
        with self._lock:
            if self._size + size > PIPE_BUF:
                self._send()
            self._waiting.append(line)
            self._size += size
            if loop is None:
                self._send()
            elif self._flush_on is not loop:
                # A flush due on another loop (one stopped before its turn came) may never run.
                self._flush_on = loop
                loop.call_soon(self.flush)

    def flush(self) -> None:
        """Send the lines waiting for their loop's turn."""
        with self._lock:
            self._flush_on = None
            self._send()

    def _send(self) -> None:
        if not self._waiting:
            return
        data = "".join(self._waiting).encode(self._encoding, _ERRORS)
        self._waiting, self._size = [], 0
        assert self._fd is not None
        try:
            self._stream.flush()  # what Python code printed to the stream before these lines
            while data:
                data = data[os.write(self._fd, data) :]
        except (OSError, ValueError):
            pass
