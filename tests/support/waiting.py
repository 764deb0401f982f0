"""Waiting for something a worker process does: polled, with a deadline that fails the test."""

from __future__ import annotations

import time
from collections.abc import Callable

import psycopg


def wait_for(
    predicate: Callable[[], object],
    timeout: float = 30.0,
    interval: float = 0.05,
    message: str = "condition",
) -> object:
    """Poll until `predicate()` is truthy and return its value; fail with `message` after
    `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {message}")
        time.sleep(interval)


def wait_until(
    predicate: Callable[[], object], timeout: float, message: str, interval: float = 0.1
) -> float:
    """Poll `predicate` (database errors count as 'not yet'); return the seconds it took.

    For tests that stop the server on purpose: a refused connection is the outage going on,
    not a failure."""
    started = time.monotonic()
    while True:
        try:
            if predicate():
                return time.monotonic() - started
        except psycopg.OperationalError:
            pass
        if time.monotonic() - started > timeout:
            raise AssertionError(f"timed out after {timeout} s waiting for {message}")
        time.sleep(interval)
