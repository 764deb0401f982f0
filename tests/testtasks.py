"""Tasks the test suite runs in real worker processes.

Side effects go to the `effects` table of the job's own database (created with every test
database, see conftest.py), so a test can count how many times each job really ran, across
processes and crashes.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any

import psycopg

from worker import PauseForResolution, Pipeline, task

_local = threading.local()


def _conn() -> psycopg.Connection[Any]:
    conn = getattr(_local, "conn", None)
    if conn is None or conn.closed:
        conn = psycopg.connect(os.environ["DATABASE_URL"], autocommit=True)
        _local.conn = conn
    return conn


def record(job: str, kind: str) -> None:
    _conn().execute("INSERT INTO effects (job, kind) VALUES (%s, %s)", (job, kind))


@task
def add(payload: dict[str, Any]) -> int:
    return int(payload["a"]) + int(payload["b"])


@task
async def async_double(payload: dict[str, Any]) -> int:
    return int(payload["n"]) * 2


@task
def effect(payload: dict[str, Any]) -> str:
    """Records that it ran, optionally sleeping first (to be caught mid-job)."""
    time.sleep(float(payload.get("sleep", 0)))
    record(str(payload["key"]), "effect")
    return "done"


@task
def always_fails(payload: dict[str, Any]) -> None:
    record(str(payload.get("key", "fail")), "attempt")
    raise RuntimeError("this task always fails")


@task
def fails_then_succeeds(payload: dict[str, Any], ctx: Any) -> str:
    record(str(payload["key"]), "attempt")
    if ctx.attempt <= int(payload.get("failures", 1)):
        raise RuntimeError(f"failing attempt {ctx.attempt} on purpose")
    return f"succeeded on attempt {ctx.attempt}"


@task
def not_json(payload: dict[str, Any]) -> object:
    return {"when": object()}


@task
def ask(payload: dict[str, Any], ctx: Any) -> Any:
    if ctx.answer is None:
        raise PauseForResolution({"question": payload.get("question", "go on?")})
    return {"answer": ctx.answer}


# A three-stage pipeline with a cleanup; every stage run leaves an effect row.
counted = Pipeline("counted")


@counted.stage
def first(ctx: Any) -> dict[str, int]:
    record(ctx.job_id, "first")
    return {"n": 1}


@counted.stage
def second(ctx: Any) -> dict[str, int]:
    record(ctx.job_id, "second")
    if ctx.payload.get("fail_second_until", 0) >= ctx.attempt:
        raise RuntimeError("second stage fails on purpose")
    time.sleep(float(ctx.payload.get("second_sleep", 0)))
    return {"n": ctx.outputs["first"]["n"] + 1}


@counted.stage
def third(ctx: Any) -> dict[str, int]:
    record(ctx.job_id, "third")
    return {"n": ctx.outputs["second"]["n"] + 1}


@counted.cleanup
def tidy(ctx: Any) -> str:
    record(ctx.job_id, "cleanup")
    return "tidied"
