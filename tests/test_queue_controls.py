"""Queue controls across several `worker run` processes: a pause stops claims from that queue
on every worker until it is resumed, a concurrency limit caps the queue's jobs running at once,
a rate caps how fast they start; none keeps a cancel from settling."""

from __future__ import annotations

import time

import psycopg
import pytest
from flowtasks import per_customer
from support.waiting import wait_until

from worker import Client, InvalidJob, JobSpec


@pytest.fixture
def client(database_url):
    return Client(database_url)


def intervals(db, key: str | None = None) -> list[tuple[float, float]]:
    """Each job's (start, end), in seconds since the epoch, from its effects; only the jobs of
    concurrency key `key` if given."""
    rows = db.query(
        "SELECT extract(epoch FROM min(e.at) FILTER (WHERE e.kind = 'start')), "
        "extract(epoch FROM max(e.at) FILTER (WHERE e.kind = 'end')) "
        "FROM effects AS e JOIN worker.jobs AS j ON j.id::text = e.job "
        "WHERE %(key)s::text IS NULL OR j.concurrency_key = %(key)s GROUP BY e.job",
        {"key": key},
    )
    return [(float(s), float(e)) for s, e in rows if s is not None and e is not None]


def most_at_once(spans: list[tuple[float, float]]) -> int:
    edges = sorted([(s, 1) for s, _ in spans] + [(e, -1) for _, e in spans])
    running = peak = 0
    for _, step in edges:
        running += step
        peak = max(peak, running)
    return peak


def test_a_queue_limited_to_two_runs_two_at_once_across_three_workers(env, db, processes, client):
    client.limit_queue("images", concurrency=2)
    for _ in range(3):
        processes.worker(
            env, "flowtasks", extra={"WORKER_QUEUES": "images", "WORKER_CONCURRENCY": "4"}
        )
    jobs = client.enqueue_many([JobSpec("occupies", {"seconds": 0.4}, queue="images")] * 12)
    for job in jobs:
        job.wait_sync(timeout=60)
    assert all(job.status == "completed" for job in jobs)
    assert most_at_once(intervals(db)) == 2


def test_claim_ahead_never_holds_more_of_a_limited_queue_than_its_limit(
    env, database_url, processes, client
):
    client.limit_queue("fast", concurrency=3)
    for _ in range(2):
        processes.worker(
            env, "flowtasks", extra={"WORKER_QUEUES": "fast", "WORKER_CONCURRENCY": "10"}
        )
    jobs = client.enqueue_many([JobSpec("add", {"a": 1, "b": 1}, queue="fast")] * 300)
    held, done = [], 0
    with psycopg.connect(database_url, autocommit=True) as conn:
        deadline = time.monotonic() + 60
        while done < len(jobs) and time.monotonic() < deadline:
            ((processing, done),) = conn.execute(
                "SELECT count(*) FILTER (WHERE status = 'processing'), "
                "count(*) FILTER (WHERE status = 'completed') FROM worker.jobs"
            ).fetchall()
            held.append(processing)
    assert done == len(jobs)
    assert max(held) == 3  # jobs claimed ahead are processing too: never past the limit


def test_jobs_sharing_a_concurrency_key_run_at_most_their_task_s_limit_across_workers(
    env, db, processes, client
):
    for _ in range(3):
        processes.worker(env, "flowtasks", extra={"WORKER_CONCURRENCY": "4"})
    specs = [per_customer.spec({"customer": "a", "seconds": 0.4}) for _ in range(8)]
    specs += [per_customer.spec({"customer": "b", "seconds": 0.4}) for _ in range(4)]
    jobs = client.enqueue_many(specs)
    for job in jobs:
        job.wait_sync(timeout=60)
    assert all(job.status == "completed" for job in jobs)
    assert most_at_once(intervals(db, "customer:a")) == 2
    assert most_at_once(intervals(db, "customer:b")) == 2
    assert most_at_once(intervals(db)) > 2  # different keys do not wait for each other


def test_a_concurrency_key_given_at_enqueue_limits_to_one_by_default(env, db, processes, client):
    for _ in range(2):
        processes.worker(env, "flowtasks", extra={"WORKER_CONCURRENCY": "4"})
    jobs = [client.enqueue("occupies", {"seconds": 0.3}, concurrency_key="k") for _ in range(5)]
    for job in jobs:
        job.wait_sync(timeout=60)
    assert most_at_once(intervals(db, "k")) == 1


def test_a_paused_queue_starts_nothing_until_it_is_resumed(env, db, processes, client):
    client.pause_queue("mail")
    for _ in range(2):
        processes.worker(env, "flowtasks", extra={"WORKER_QUEUES": "mail,other"})
    paused = client.enqueue("occupies", {"seconds": 0}, queue="mail")
    other = client.enqueue("occupies", {"seconds": 0}, queue="other")
    assert other.wait_sync(timeout=20) is None  # the workers run, and claim from other queues
    time.sleep(1.5)
    assert client.get(paused.job_id).status == "pending"
    assert client.queue("mail").paused
    client.resume_queue("mail")
    started = time.monotonic()
    paused.wait_sync(timeout=20)
    assert paused.status == "completed"
    assert time.monotonic() - started < 1.0  # the resume woke the idle workers


def test_a_pause_lets_running_jobs_finish_and_holds_the_rest(env, db, processes, client):
    processes.worker(env, "flowtasks", extra={"WORKER_QUEUES": "q", "WORKER_CONCURRENCY": "1"})
    running = client.enqueue("occupies", {"seconds": 1.0}, queue="q")
    wait_until(lambda: client.get(running.job_id).status == "processing", 20, "the first job")
    client.pause_queue("q")
    held = client.enqueue("occupies", {"seconds": 0}, queue="q")
    assert running.wait_sync(timeout=20) is None
    time.sleep(1.0)
    assert client.get(held.job_id).status == "pending"


def test_a_paused_or_spent_queue_still_settles_cancel_requests(env, db, processes, client):
    client.pause_queue("p")
    job_id = db.insert_job(task="occupies", queue="p", cancel_requested=True)
    processes.worker(env, "flowtasks", extra={"WORKER_QUEUES": "p"})
    db.wait_for_status(job_id, "cancelled", timeout=20)


def test_a_key_at_its_limit_still_settles_a_cancel_request(env, db, processes, client):
    processes.worker(env, "flowtasks", extra={"WORKER_CONCURRENCY": "4"})
    running = client.enqueue("occupies", {"seconds": 3}, concurrency_key="k")
    wait_until(lambda: client.get(running.job_id).status == "processing", 20, "the first job")
    job_id = db.insert_job(task="occupies", concurrency_key="k", cancel_requested=True)
    db.wait_for_status(job_id, "cancelled", timeout=2.5)
    assert client.get(running.job_id).status == "processing"  # it settled while the key was full


def test_a_rate_limit_spaces_the_starts_of_a_queue(env, db, processes, client):
    client.limit_queue("slow", rate=4, burst=1)
    for _ in range(2):
        processes.worker(
            env, "flowtasks", extra={"WORKER_QUEUES": "slow", "WORKER_POLL_MAX": "0.05"}
        )
    jobs = client.enqueue_many([JobSpec("occupies", {"seconds": 0}, queue="slow")] * 9)
    for job in jobs:
        job.wait_sync(timeout=60)
    starts = sorted(start for start, _ in intervals(db))
    assert len(starts) == 9
    # A full bucket of one, then one start per quarter second: at least eight quarters.
    assert starts[-1] - starts[0] >= 8 / 4 * 0.9


def test_queues_list_each_queue_with_its_state_limits_and_depth(client):
    client.enqueue("add", {}, queue="listed")
    client.limit_queue("limited", concurrency=3, rate=2.5)
    client.pause_queue("limited")
    states = {q.name: q for q in client.queues()}
    assert (states["listed"].pending, states["listed"].paused, states["listed"].limited) == (
        1,
        False,
        False,
    )
    limited = states["limited"]
    assert (limited.paused, limited.concurrency, limited.rate, limited.burst) == (
        True,
        3,
        2.5,
        None,
    )
    lifted = client.limit_queue("limited")
    assert (lifted.concurrency, lifted.rate, lifted.paused) == (None, None, True)


def test_bad_limits_are_refused_naming_the_option(client):
    with pytest.raises(InvalidJob, match="concurrency must be an integer of at least 1"):
        client.limit_queue("q", concurrency=0)
    with pytest.raises(InvalidJob, match="rate must be a number"):
        client.limit_queue("q", rate=float("inf"))
    with pytest.raises(InvalidJob, match="burst needs a rate"):
        client.limit_queue("q", burst=3)
    with pytest.raises(InvalidJob, match="queue name must be a string"):
        client.pause_queue("")
