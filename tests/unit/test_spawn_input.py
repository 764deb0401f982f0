"""A spawn with a bad key, option or payloads is refused with one line naming it, before any
database is reached (the runtime here has none)."""

from __future__ import annotations

import threading

import pytest

from worker.client import InvalidJob
from worker.client.spawn import child_id
from worker.models import ClaimedJob
from worker.stages import MemoryRuntime
from worker.tasks import Context


def _ctx() -> Context:
    job = ClaimedJob(
        id="0193a7c0-0000-7000-8000-000000000000",
        task="split",
        payload={},
        queue="default",
        priority=0,
        retry_count=0,
        max_retries=3,
        cancel_requested=False,
        answer=None,
        last_error=None,
        final_error=None,
    )
    return Context(job, MemoryRuntime(), threading.Event())


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda ctx: ctx.spawn("square", {}, key=""), "spawn key '': must be a string of 1 to 100"),
        (lambda ctx: ctx.spawn("square", {}, key="k" * 101), "must be a string of 1 to 100"),
        (lambda ctx: ctx.spawn("square", {}, key="a\x00b"), "with no NUL"),
        (
            lambda ctx: ctx.spawn("square", {}, key="k", unique_key="u"),
            "unique_key is not an option of a spawned job",
        ),
        (
            lambda ctx: ctx.spawn_many("square", [{"i": 1}]),
            "spawn_many takes payloads by key, a mapping, not list",
        ),
    ],
)
def test_a_bad_spawn_is_refused_naming_what_is_wrong(call, message):
    with pytest.raises(InvalidJob, match=message.replace("(", r"\(")):
        call(_ctx())


def test_a_child_s_id_depends_only_on_its_spawner_and_its_key():
    spawner = "0193a7c0-0000-7000-8000-000000000000"
    assert child_id(spawner, "part-1") == child_id(spawner, "part-1")
    assert child_id(spawner, "part-1") != child_id(spawner, "part-2")
    assert child_id(spawner, "part-1") != child_id("0193a7c0-0000-7000-8000-000000000001", "part-1")
