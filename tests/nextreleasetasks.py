"""A task only the next release has: `worker run testtasks nextreleasetasks` is a worker of
that release, `worker run testtasks` one of the release before it, in a rolling deploy."""

from __future__ import annotations

import os
from typing import Any

from worker import task


@task
def thumbnail(payload: dict[str, Any]) -> int:
    """The pid of the process that ran it, to tell which release did."""
    return os.getpid()
