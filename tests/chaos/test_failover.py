"""Chaos scenario: the primary crashes mid-drain and its synchronous hot standby is promoted.

Three `worker run` processes and a producer use one multi-host URL
(`?host=a,b&port=p,q&target_session_attrs=read-write`), so each finds the writable server on its
own. Every enqueue the producer saw acknowledged (a job id returned) must complete on the new
primary; an enqueue that could not be acknowledged must reach the producer as an error, never
as a silent loss; and `verify` holds on the new primary (one terminal status per job, every
effect at least once). A workflow whose chain of jobs runs across the failover completes, each
job starting only after its parents' effects.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import psycopg
import pytest
from support import query
from support.replication import ReplicatedPair
from support.servers import server_root

from chaos.harness import (
    enqueue_workload,
    finished_count,
    install_audit,
    verify,
    wait_all_finished,
    wait_until,
)
from worker import Client, Job, Workflow, WorkflowHandle
from worker.db import migrate

pytestmark = pytest.mark.chaos


@pytest.fixture
def replicated() -> Iterator[ReplicatedPair]:
    """A migrated, audited primary with its synchronous standby; both destroyed at the end."""
    with server_root("dw-failover-") as root:
        pair = ReplicatedPair.start(root)
        try:
            migrate.upgrade(pair.primary_url)
            install_audit(pair.primary_url)
            yield pair
        finally:
            pair.destroy()


# The producer's jobs wait this long before they run, so that an enqueue retried after the
# failover still finds the job a failed call may have committed, and its unique key holds.
PRODUCED_DELAY = 8.0


class Producer:
    """Enqueues `chaos_sync` jobs in a loop through the client, each with a unique key of its
    own, keeping what each call said: the ids it was given, and the errors it raised."""

    def __init__(self, url: str) -> None:
        self.client = Client(url)
        self.acknowledged: list[tuple[float, str]] = []
        self.errors: list[tuple[float, BaseException]] = []
        self.failed_keys: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def enqueue(self, key: str) -> Job:
        return self.client.enqueue(
            "chaos_sync", {"sleep": 0.02}, unique_key=key, delay=PRODUCED_DELAY
        )

    def _run(self) -> None:
        n = 0
        while not self._stop.is_set():
            n += 1
            try:
                job = self.enqueue(f"produced-{n}")
                self.acknowledged.append((time.monotonic(), str(job.id)))
            except Exception as exc:  # every failure is what the test counts
                self.errors.append((time.monotonic(), exc))
                self.failed_keys.append(f"produced-{n}")
                self._stop.wait(0.05)
            self._stop.wait(0.01)

    def retry_failed(self) -> int:
        """Enqueue each failed key again; how many of them the first call had committed."""
        return sum(self.enqueue(key).duplicate for key in self.failed_keys)

    def __enter__(self) -> Producer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def close(self) -> None:
        self.client.close()

    def acknowledged_since(self, moment: float) -> int:
        return sum(1 for at, _ in self.acknowledged if at > moment)


# Links of a chain, claimed ahead of the workload, so that one is running when the primary
# dies and the rest run on the new primary.
CHAIN = 30


def enqueue_workflow(url: str) -> WorkflowHandle:
    wf = Workflow("across the failover")
    links = [wf.add("chaos_sync", {"sleep": 0.2, "n": 0}, priority=10)]
    for n in range(1, CHAIN):
        links.append(wf.add("chaos_sync", {"sleep": 0.2, "n": n}, after=[links[-1]], priority=10))
    fan_in = wf.add("chaos_sync", {}, name="fan_in", after=links, priority=10)
    wf.add("chaos_sync", {}, name="clean_up", after=[fan_in], on_parent_failure="run")
    client = Client(url)
    try:
        return wf.enqueue(client=client)
    finally:
        client.close()


def started_before_its_parents_ended(url: str, handle: WorkflowHandle) -> list[str]:
    """The workflow's jobs with an effect earlier than one of a parent's effects."""
    rows = query(
        url,
        "SELECT d.child_id::text FROM worker.job_dependencies AS d "
        "JOIN worker.jobs AS c ON c.id = d.child_id "
        "WHERE c.workflow_id = %s AND (SELECT min(e.at) FROM chaos_effects AS e "
        "WHERE e.job = d.child_id) < (SELECT max(e.at) FROM chaos_effects AS e "
        "WHERE e.job = d.parent_id)",
        (handle.id,),
    )
    return [r[0] for r in rows]


def test_primary_crash_and_promotion_lose_no_acknowledged_job(replicated, fleet):
    pair = replicated
    jobs = 1500
    read_only_for = 2.0
    enqueue_workload(pair.primary_url, jobs, sleep=0.05)
    workflow = enqueue_workflow(pair.primary_url)
    workers = fleet(pair.url)
    procs = [workers.start(concurrency=8) for _ in range(3)]
    started = time.monotonic()
    workers.wait_registered(*procs)

    with Producer(pair.url) as producer:
        wait_until(lambda: finished_count(pair.url) >= jobs // 5, 120, "a fifth of the jobs")
        pair.kill_primary()
        killed_at = time.monotonic()
        before = finished_count(pair.standby_url)  # the standby stays readable meanwhile
        (workflow_left,) = query(
            pair.standby_url,
            "SELECT count(*) FROM worker.jobs WHERE workflow_id = %s AND status <> 'completed'",
            (workflow.id,),
        )[0]
        time.sleep(read_only_for)
        pair.promote()
        promoted_at = time.monotonic()
        first_completion = wait_until(
            lambda: finished_count(pair.standby_url) > before,
            60,
            "the first job finished on the new primary",
        )
        wait_until(
            lambda: producer.acknowledged_since(promoted_at) >= 50,
            60,
            "the producer's enqueues to go through again",
        )

        # What a client does with an enqueue that failed in the failover: the same call again,
        # with the same unique key, at once.
        failed_yet_committed = producer.retry_failed()
    producer.close()
    # The workload (no unique key) is done with no wait of the producer's delay in the figure.
    wait_until(
        lambda: (
            query(
                pair.standby_url,
                "SELECT count(*) FROM worker.jobs "
                "WHERE unique_key IS NULL AND status = 'completed'",
            )[0][0]
            >= jobs
        ),
        240,
        "the workload to finish",
    )
    all_done_at = time.monotonic()
    acknowledged = [job_id for _, job_id in producer.acknowledged]
    total = int(query(pair.standby_url, "SELECT count(*) FROM worker.jobs")[0][0])
    wait_all_finished(pair.standby_url, total, timeout=240)
    report = verify(pair.standby_url, "failover", time.monotonic() - started)

    # The workflow's jobs are among those `verify` found completed, each after its parents.
    assert workflow_left > 0, "the workflow had ended before the primary died"
    assert len(workflow.jobs) == CHAIN + 2
    assert started_before_its_parents_ended(pair.standby_url, workflow) == []

    # Every acknowledged enqueue is a job on the new primary, and (by `verify`) completed.
    (missing,) = query(
        pair.standby_url,
        "SELECT count(*) FROM unnest(%s::uuid[]) AS a(id) "
        "WHERE NOT EXISTS (SELECT 1 FROM worker.jobs AS j WHERE j.id = a.id)",
        (acknowledged,),
    )[0]
    assert missing == 0, f"{missing} acknowledged jobs are missing on the new primary"

    # Each call the producer made, failed or not, is one job: a failed call retried with its
    # unique key was either inserted then or found as the job the failed call had committed.
    ((keys, rows),) = query(
        pair.standby_url,
        "SELECT count(DISTINCT unique_key), count(*) FROM worker.jobs WHERE unique_key IS NOT NULL",
    )
    calls = len(acknowledged) + len(producer.failed_keys)
    assert (keys, rows) == (calls, calls), (keys, rows, calls)

    # The enqueues made while no server took writes failed loudly, as connection errors.
    during = [exc for at, exc in producer.errors if killed_at <= at <= promoted_at + 5]
    assert during, "no enqueue failed while the standby was read-only"
    assert all(isinstance(exc, psycopg.OperationalError) for _, exc in producer.errors), [
        repr(exc) for _, exc in producer.errors[:5]
    ]

    report.extra = {
        "acknowledged_enqueues": len(acknowledged),
        "failed_enqueues": len(producer.errors),
        # A failed call whose commit reached the standby before the crash: why to retry with
        # a unique_key.
        "failed_yet_committed": failed_yet_committed,
        "read_only_s": round(promoted_at - killed_at, 2),
        "kill_to_first_completion_s": round(promoted_at - killed_at + first_completion, 2),
        "kill_to_all_done_s": round(all_done_at - killed_at, 2),
    }
    report.emit()
    for proc in procs:
        assert proc.poll() is None, "a worker exited during the failover"
        assert "Traceback" not in workers.log(proc), workers.log(proc)[-3000:]
