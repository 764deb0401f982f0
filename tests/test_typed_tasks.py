"""Typed tasks: `@task` returns a handle that enqueues jobs of it, and a task whose payload is a
pydantic model gets the validated model; a payload that does not fit is refused unwritten."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import pytest
from flowtasks import Resize, resize

from worker import AsyncClient, Client, InvalidJob, JobSpec, Task, task


def test_a_typed_task_gets_its_validated_model_and_stays_callable(env, processes, database_url):
    processes.worker(env, "flowtasks")
    job = resize.enqueue(Resize(path="a.png", width=320), client=Client(database_url))
    assert job.wait_sync(timeout=20) == {"path": "a.png", "width": 640}
    assert job.payload == {"path": "a.png", "width": 320}
    assert resize(Resize(path="b.png", width=1)) == {"path": "b.png", "width": 2}


def test_a_bad_typed_payload_is_refused_naming_the_field_and_nothing_is_written(database_url, db):
    client = Client(database_url)
    with pytest.raises(InvalidJob, match=r"^payload width: Input should be a valid integer"):
        resize.enqueue({"path": "a.png", "width": "wide"}, client=client)
    with pytest.raises(InvalidJob, match=r"^payload path: Field required"):
        resize.spec({"width": 3})
    assert db.counts() == {}


def test_a_typed_payload_enqueued_by_name_that_does_not_fit_fails_without_a_retry(
    env, processes, database_url
):
    processes.worker(env, "flowtasks")
    job = Client(database_url).enqueue("resize", {"path": "a.png"})
    with pytest.raises(Exception, match="the payload does not fit Resize: width: Field required"):
        job.wait_sync(timeout=20)
    assert job.retry_count == 0


def test_enqueue_async_and_batches_of_specs_go_through_the_handle(env, processes, database_url):
    processes.worker(env, "flowtasks")

    async def enqueue() -> list[object]:
        client = AsyncClient(database_url)
        try:
            one = await resize.enqueue_async({"path": "x", "width": 1}, client=client)
            many = await client.enqueue_many(
                [resize.spec({"path": f"{i}", "width": i}) for i in (2, 3)]
            )
            return [await job.wait(timeout=20) for job in (one, *many)]
        finally:
            await client.close()

    assert [r["width"] for r in asyncio.run(enqueue())] == [2, 4, 6]  # type: ignore[index]


def test_the_handle_is_the_registered_task_and_untyped_payloads_pass_as_they_are():
    @task(name="typed_tasks_untyped_example")
    def untyped(payload):  # type: ignore[no-untyped-def]
        return payload

    assert isinstance(untyped, Task) and untyped.model is None
    assert untyped.spec({"k": 1}) == JobSpec("typed_tasks_untyped_example", {"k": 1})
    assert untyped({"k": 2}) == {"k": 2}


def test_mypy_checks_a_handle_s_payload_options_and_result_against_its_function():
    source = Path(__file__).parent / "typed_usage.py"
    checked = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--no-incremental", str(source)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    errors = [line for line in checked.stdout.splitlines() if ": error:" in line]
    flagged = {int(line.split(":")[1]) for line in errors}
    wrong = {
        n for n, line in enumerate(source.read_text().splitlines(), 1) if line.endswith("# wrong")
    }
    assert flagged == wrong, checked.stdout
