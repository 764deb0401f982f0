"""The invoices example (examples/invoices/) end to end: `worker run examples.invoices` in real
processes against a real PostgreSQL, driven as its docstring and docs/scheduling.md show."""

from __future__ import annotations

import json
import subprocess
import sys
from itertools import pairwise

import pytest

from examples.invoices import Invoice, send_invoice
from worker import Client, InvalidJob, JobFailed


@pytest.fixture
def client(database_url):
    return Client(database_url)


@pytest.fixture
def workers(env, processes):
    for _ in range(2):
        processes.worker(env, "examples.invoices", args=("--queues", "invoices"))


def test_an_invoice_is_sent_once_however_often_it_is_enqueued(workers, client, db):
    invoice = Invoice(number=42, customer="acme", cents=1999)
    job = send_invoice.enqueue(invoice, client=client, queue="invoices", unique_key="invoice:42")
    again = send_invoice.enqueue(invoice, client=client, queue="invoices", unique_key="invoice:42")
    assert (again.job_id, again.duplicate) == (job.job_id, True)
    assert job.wait_sync(timeout=30) == {"receipt": "invoice 42 sent to acme", "attempt": 1}
    assert db.counts() == {"completed": 1}


def test_a_rejected_invoice_fails_at_once_and_a_busy_server_is_tried_again(workers, client):
    rejected = send_invoice.enqueue(
        Invoice(number=13, customer="acme", cents=1), client=client, queue="invoices"
    )
    busy = send_invoice.enqueue(
        Invoice(number=7, customer="busy", cents=1, retry_after=0.5),
        client=client,
        queue="invoices",
    )
    with pytest.raises(JobFailed, match="has no billing address"):
        rejected.wait_sync(timeout=30)
    assert rejected.retry_count == 0
    assert busy.wait_sync(timeout=30) == {"receipt": "invoice 7 sent to busy", "attempt": 2}


def test_a_bad_invoice_is_refused_before_anything_is_written(client, db):
    with pytest.raises(InvalidJob, match=r"^payload cents: Input should be greater than"):
        send_invoice.enqueue({"number": 1, "customer": "acme", "cents": -5}, client=client)
    assert db.counts() == {}


def test_one_customer_s_invoices_go_one_at_a_time(workers, client, db):
    jobs = [
        send_invoice.enqueue(Invoice(number=n, customer="acme", cents=n), client=client,
                             queue="invoices")
        for n in range(100, 104)
    ]  # fmt: skip
    for job in jobs:
        job.wait_sync(timeout=30)
    assert {job.concurrency_key for job in jobs} == {"customer:acme"}
    # Each started after the one before finished (the key allows one at a time).
    rows = db.query("SELECT started_at, finished_at FROM worker.jobs ORDER BY started_at")
    assert all(later[0] >= earlier[1] for earlier, later in pairwise(rows))


def test_the_monthly_chase_is_listed_with_its_next_run(env):
    listed = subprocess.run(
        [sys.executable, "-m", "worker", "schedule", "examples.invoices", "--json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    (entry,) = json.loads(listed.stdout)
    assert (entry["task"], entry["schedule"], entry["timezone"]) == (
        "chase_overdue",
        "0 9 1 * *",
        "Europe/Paris",
    )
    assert entry["next_run"].endswith(("09:00:00+01:00", "09:00:00+02:00"))
