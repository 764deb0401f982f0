"""Sentry (`worker.contrib.sentry`): a failed attempt is reported with its job's id, task,
attempt and queue, and what the job's code reports itself carries them too.

Sentry's client sends to a capturing transport (no network); the jobs run on the real
database with the daemon's own worker in this process (`drain`).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import pytest
import sentry_sdk
from sentry_sdk.envelope import Envelope
from sentry_sdk.transport import Transport

from worker import Backoff, Client, JobStatus, add_middleware, remove_middleware, task
from worker.contrib.sentry import SentryMiddleware
from worker.testing import drain


class Captured(Transport):
    """Keeps every event Sentry would send."""

    def __init__(self) -> None:
        super().__init__()
        self.events: list[dict[str, Any]] = []

    def capture_envelope(self, envelope: Envelope) -> None:
        event = envelope.get_event()
        if event is not None:
            self.events.append(event)


@task(max_retries=1, backoff=Backoff.constant(0, jitter=False))
def sentry_fails(payload: dict[str, Any]) -> None:
    raise LookupError(f"no customer {payload['customer']}")


@task
def sentry_logs_an_error(payload: dict[str, Any]) -> str:
    logging.getLogger("shop").error("customer %s has no address", payload["customer"])
    return "sent"


@pytest.fixture
def sentry() -> Iterator[Captured]:
    transport = Captured()
    middleware = add_middleware(SentryMiddleware())
    # Integrations that patch other libraries stay off: they would outlive this test.
    sentry_sdk.init(transport=transport, auto_enabling_integrations=False)
    try:
        yield transport
    finally:
        remove_middleware(middleware)
        sentry_sdk.get_client().close()
        sentry_sdk.get_global_scope().set_client(None)


def test_each_failed_attempt_is_reported_with_its_job_id_task_attempt_and_queue(
    database_url, sentry: Captured
):
    job = Client(database_url).enqueue("sentry_fails", {"customer": 7}, queue="billing")
    drain(url=database_url, queues=["billing"])
    assert job.refresh().status == JobStatus.FAILED
    assert len(sentry.events) == 2  # the first attempt and its one retry
    for attempt, event in enumerate(sentry.events, start=1):
        (exception,) = event["exception"]["values"]
        assert (exception["type"], exception["value"]) == ("LookupError", "no customer 7")
        assert {k: v for k, v in event["tags"].items() if k.startswith("job.")} == {
            "job.id": job.id,
            "job.task": "sentry_fails",
            "job.attempt": str(attempt),
            "job.queue": "billing",
        }
        context = event["contexts"]["job"]
        assert (context["id"], context["attempt"], context["retry_count"]) == (
            job.id,
            attempt,
            attempt - 1,
        )


def test_a_completed_job_reports_nothing_but_what_its_code_reports_carries_its_tags(
    database_url, sentry: Captured
):
    job = Client(database_url).enqueue("sentry_logs_an_error", {"customer": 9})
    drain(url=database_url)
    assert job.refresh().result == "sent"
    # The one event is the task's own error log line, sent from its thread, in its scope.
    (event,) = sentry.events
    assert "exception" not in event
    assert event["logentry"]["formatted"] == "customer 9 has no address"
    assert event["tags"]["job.id"] == job.id
    assert event["tags"]["job.task"] == "sentry_logs_an_error"


def test_scopes_do_not_leak_between_jobs(database_url, sentry: Captured):
    client = Client(database_url)
    first = client.enqueue("sentry_logs_an_error", {"customer": 1})
    drain(url=database_url)
    sentry_sdk.capture_message("outside any job")
    second = client.enqueue("sentry_logs_an_error", {"customer": 2})
    drain(url=database_url)
    tags = [event.get("tags", {}).get("job.id") for event in sentry.events]
    assert tags == [first.id, None, second.id]
