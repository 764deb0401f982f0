"""The operators' typed rows: statuses read as enums, filters sent as text."""

from __future__ import annotations

from datetime import UTC, datetime
from uuid import UUID

from worker.db.admin import JobFilter, JobRow, RetrySet, StatusCount
from worker.models import JobStatus

AT = datetime(2026, 11, 30, 8, 1, 2, tzinfo=UTC)


def test_a_rows_status_reads_as_a_job_status_equal_to_its_text() -> None:
    row = JobRow(
        id=UUID("0b0e3c5e-2f4a-4c1e-9d3b-6a1f2e3d4c5b"),
        queue="mail",
        task="send",
        status="failed",  # type: ignore[arg-type]  # as the database hands it over
        priority=0,
        retry_count=2,
        error="boom",
        created_at=AT,
        run_at=AT,
        started_at=None,
        finished_at=AT,
    )
    assert row.status is JobStatus.FAILED
    assert row.status == "failed"
    count = StatusCount("mail", "pending", 3, None)  # type: ignore[arg-type]
    assert count.status is JobStatus.PENDING


def test_a_bulk_retry_sends_its_filter_as_text_with_the_extra_parameters() -> None:
    wanted = RetrySet(JobStatus.CANCELLED, task=None, queue="mail")
    params = wanted.params(batch=1000)
    assert params == {"status": "cancelled", "task": None, "queue": "mail", "batch": 1000}
    assert type(params["status"]) is str


def test_an_empty_filter_skips_every_condition() -> None:
    where = JobFilter()
    assert all(value is None for value in vars(where).values())
