"""The status machine under random sequences of operations (Hypothesis, stateful).

Every operation is one of the real statements of `worker/db/sql/` (enqueue, claim, record an
outcome, cancel, resume, retry, rescue, release, prune, stage write), run against the real
PostgreSQL, in any order, by two workers that may lose their lease at any time and may write
outcomes for jobs they no longer hold. After every step:

- every status change the audit trigger saw is one the design allows (`LEGAL_TRANSITIONS`);
- no job is lost: the rows present are exactly those enqueued minus those pruned, and only
  finished jobs were pruned;
- the columns agree with the status (finished_at set exactly for finished jobs, a processing
  job has a worker and a start time, a paused job has its question, a completed one a result).

At the end every worker dies and the rescuer runs: nothing may be left `processing`.
"""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
from chaos.harness import LEGAL_TRANSITIONS, TERMINAL, install_audit
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from worker.db import sql
from worker.db.records import json_records

LEASE = 30.0
OUTCOMES = ("completed", "paused", "retry", "failed", "cancelled", "snoozed", "waiting")


class JobLifecycle(RuleBasedStateMachine):
    conn: psycopg.Connection[Any]  # set by the test: one connection for all examples

    def __init__(self) -> None:
        super().__init__()
        self.conn.execute(
            "TRUNCATE worker.jobs, worker.workers, worker.job_stages, chaos_transitions CASCADE"
        )
        # Ids from a counter, not random: Hypothesis replays a failing sequence exactly.
        self.workers = [uuid.UUID(int=1), uuid.UUID(int=2)]
        for worker_id in self.workers:
            self.register(worker_id)
        self.enqueued: list[uuid.UUID] = []
        self.pruned: set[uuid.UUID] = set()

    # -- helpers ------------------------------------------------------------------------------

    def run(self, statement: str, **params: Any) -> list[tuple[Any, ...]]:
        cur = self.conn.execute(statement, params)
        return cur.fetchall() if cur.description else []

    def register(self, worker_id: uuid.UUID) -> None:
        self.run(
            sql.REGISTER_WORKER,
            id=worker_id,
            hostname="machine",
            pid=1,
            queues=["default"],
            concurrency=4,
            tasks=["work"],
            liveness_key=None,
            lease_seconds=15.0,
        )

    def row(self, job_id: uuid.UUID) -> tuple[Any, ...]:
        """What must stay as it is when an operation does not apply to the job."""
        return self.run(
            "SELECT status, worker_id, retry_count, result, error, finished_at, question, "
            "answer, cancel_requested FROM worker.jobs WHERE id = %(id)s",
            id=job_id,
        )[0]

    def job_ids(self) -> list[uuid.UUID]:
        return [job_id for job_id in self.enqueued if job_id not in self.pruned]

    # -- operations ---------------------------------------------------------------------------

    @rule(
        count=st.integers(1, 3),
        max_retries=st.one_of(st.none(), st.integers(0, 2)),
        delayed=st.sampled_from([False, False, False, True]),
    )
    def enqueue(self, count: int, max_retries: int | None, delayed: bool) -> None:
        ids = [uuid.UUID(int=1000 + len(self.enqueued) + i) for i in range(count)]
        rows = [
            {
                "i": str(i),
                "t": "work",
                "p": {"n": 1},
                "q": "default",
                "pr": 0,
                "d": 3600.0 if delayed else 0.0,
                "mr": max_retries,
            }
            for i in ids
        ]
        self.run(sql.ENQUEUE_MANY, jobs=json.dumps(rows), trace_context=None)
        self.enqueued.extend(ids)

    # Both forms of the claim: a worker of one queue, and one of several.
    @rule(worker=st.integers(0, 1), limit=st.integers(1, 3), one_queue=st.booleans())
    def claim_jobs(self, worker: int, limit: int, one_queue: bool) -> None:
        self.claim(worker, limit, one_queue)

    def claim(self, worker: int, limit: int, one_queue: bool = False) -> None:
        self.run(
            sql.CLAIM_ONE_QUEUE if one_queue else sql.CLAIM,
            queues=["default"] if one_queue else ["default", "other"],
            limit=limit,
            worker_id=self.workers[worker],
            tasks=["work"],
            default_max_retries=2,
            running=[],
            pipelines=["work"],  # as a pipeline, so the claim also starts its first stage
            first_stages=["load"],
            retry_tasks=[],
            retry_limits=[],
            key_tasks=[],
            key_limits=[],
        )

    def write_outcome(self, worker: int, job_id: uuid.UUID, retries: int, outcome: str) -> None:
        result = {"completed": '"ok"', "paused": '{"question": "go on?"}'}.get(outcome)
        error = "boom" if outcome in ("retry", "failed", "cancelled") else None
        row = {"id": str(job_id), "retries": retries, "outcome": outcome, "error": error}
        row["delay"] = 0.0
        # The attempt's retry limit, as its claim read it: the job's own, else the default.
        ((row["max_retries"],),) = self.run(
            "SELECT coalesce(max_retries, 2) FROM worker.jobs WHERE id = %(id)s", id=job_id
        ) or [(2,)]
        self.run(
            sql.RECORD_OUTCOMES,
            outcomes=json_records([(row, {"result": result})]),
            worker_id=self.workers[worker],
            default_max_retries=2,
            backoff_base=0.0,
            backoff_max=0.0,
        )

    @rule(worker=st.integers(0, 1), outcome=st.sampled_from(OUTCOMES), data=st.data())
    def run_one(self, worker: int, outcome: str, data: st.DataObject) -> None:
        """The daemon's cycle: claim if the worker holds nothing, then record an outcome."""
        held = self.held_by(worker)
        if not held:
            self.claim(worker, 1)
            held = self.held_by(worker)
        if held:
            job_id = data.draw(st.sampled_from(held))
            self.write_outcome(worker, job_id, self.row(job_id)[2], outcome)

    def held_by(self, worker: int) -> list[uuid.UUID]:
        rows = self.run(
            "SELECT id FROM worker.jobs WHERE status = 'processing' AND worker_id = %(w)s "
            "ORDER BY id",
            w=self.workers[worker],
        )
        return [r[0] for r in rows]

    @precondition(lambda self: self.job_ids())
    @rule(
        worker=st.integers(0, 1),
        retries=st.integers(0, 3),
        outcome=st.sampled_from(OUTCOMES),
        data=st.data(),
    )
    def stale_outcome(self, worker: int, retries: int, outcome: str, data: st.DataObject) -> None:
        # Any job, any attempt: unless this worker holds it in that attempt (a rescue counts
        # one), a late result must change nothing at all.
        job_id = data.draw(st.sampled_from(self.job_ids()))
        before = self.row(job_id)
        self.write_outcome(worker, job_id, retries, outcome)
        if before[:3] != ("processing", self.workers[worker], retries):
            assert self.row(job_id) == before, f"a stale {outcome} changed {job_id}"

    @precondition(lambda self: self.job_ids())
    @rule(worker=st.integers(0, 1), retries=st.integers(0, 3), data=st.data())
    def stage_write(self, worker: int, retries: int, data: st.DataObject) -> None:
        # Any job, any attempt: unless this worker holds it in that attempt, a late stage write
        # must change nothing at all.
        job_id = data.draw(st.sampled_from(self.job_ids()))
        stages = "SELECT stage, status, output FROM worker.job_stages WHERE job_id = %(id)s"
        before = self.row(job_id), self.run(stages, id=job_id)
        write = {"n": 0, "job": str(job_id), "retries": retries, "ended": "load"}
        write["status"] = "completed"
        write |= {"started": "store", "kind": "stage", "attempt": 1}
        self.run(
            sql.STAGE_WRITES,
            writes=json_records([(write, {"output": '{"rows": 1}'})]),
            worker_id=self.workers[worker],
        )
        if before[0][:3] != ("processing", self.workers[worker], retries):
            assert (self.row(job_id), self.run(stages, id=job_id)) == before

    @precondition(lambda self: self.job_ids())
    @rule(action=st.sampled_from(["cancel", "resume", "retry"]), data=st.data())
    def operator(self, action: str, data: st.DataObject) -> None:
        """What an operator (or the API) does to any job, whatever its status."""
        job_id = data.draw(st.sampled_from(self.job_ids()))
        before = self.row(job_id)
        if action == "cancel":
            self.run(sql.CANCEL, id=job_id)
            allowed: tuple[str, ...] = ("pending", "paused", "processing")
        elif action == "resume":
            self.run(sql.RESUME, id=job_id, answer='"yes"')
            allowed = ("paused",)
        else:
            self.run(sql.RETRY, id=job_id)
            allowed = ("failed", "cancelled")
        if before[0] not in allowed:
            assert self.row(job_id) == before, f"{action} changed a {before[0]} job"

    @rule(worker=st.integers(0, 1))
    def lose_lease_and_rescue(self, worker: int) -> None:
        # The worker stops heartbeating for longer than the lease; another one rescues.
        self.run(
            "UPDATE worker.workers SET heartbeat_at = now() - make_interval(secs => %(age)s) "
            "WHERE id = %(id)s",
            id=self.workers[worker],
            age=LEASE + 1,
        )
        self.run(sql.RESCUE, lease=LEASE, grace=1.0, starting=False)
        self.register(self.workers[worker])  # it comes back, as a stalled worker does

    @precondition(lambda self: self.job_ids())
    @rule(worker=st.integers(0, 1), data=st.data())
    def release_on_shutdown(self, worker: int, data: st.DataObject) -> None:
        job_id = data.draw(st.sampled_from(self.job_ids()))
        before = self.row(job_id)
        self.run(sql.RELEASE, worker_id=self.workers[worker], ids=[job_id])
        if before[:2] != ("processing", self.workers[worker]):
            assert self.row(job_id) == before, f"release changed a job {before[0]}"

    @rule()
    def prune(self) -> None:
        finished = {
            r[0]
            for r in self.run(
                "SELECT id FROM worker.jobs WHERE status = ANY(%(s)s)", s=list(TERMINAL)
            )
        }
        self.run(
            sql.PRUNE_BATCH,
            statuses=list(TERMINAL),
            before=datetime.now(UTC) + timedelta(days=1),
            batch=1000,
        )
        present = {r[0] for r in self.run("SELECT id FROM worker.jobs")}
        removed = set(self.job_ids()) - present
        assert removed <= finished, f"prune removed unfinished jobs: {removed - finished}"
        self.pruned |= removed

    # -- invariants ---------------------------------------------------------------------------

    @invariant()
    def only_legal_transitions(self) -> None:
        seen = self.run("SELECT DISTINCT old, new FROM chaos_transitions")
        illegal = [t for t in seen if t not in LEGAL_TRANSITIONS]
        assert not illegal, f"illegal status transitions: {illegal}"

    @invariant()
    def no_job_lost(self) -> None:
        present = {r[0] for r in self.run("SELECT id FROM worker.jobs")}
        assert present == set(self.job_ids())

    @invariant()
    def columns_agree_with_the_status(self) -> None:
        wrong = self.run(
            """
            SELECT id, status FROM worker.jobs
            WHERE (finished_at IS NOT NULL) <> (status IN ('completed', 'failed', 'cancelled'))
               OR (status = 'processing' AND (worker_id IS NULL OR started_at IS NULL))
               OR (status = 'paused' AND question IS NULL)
               OR (status = 'completed' AND result IS NULL)
            """
        )
        assert not wrong, wrong

    def teardown(self) -> None:
        # Every worker dies; the rescuer must leave nothing behind as `processing`.
        self.run(
            "UPDATE worker.workers SET heartbeat_at = now() - make_interval(secs => %(age)s)",
            age=LEASE + 1,
        )
        self.run(sql.RESCUE, lease=LEASE, grace=1.0, starting=False)
        left = self.run("SELECT count(*) FROM worker.jobs WHERE status = 'processing'")
        assert left == [(0,)], "jobs left processing after every worker died and was rescued"
        self.only_legal_transitions()


def test_random_operations_never_make_an_illegal_transition_or_lose_a_job(database_url):
    install_audit(database_url)
    with psycopg.connect(database_url, autocommit=True) as conn:
        JobLifecycle.conn = conn
        run_state_machine_as_test(
            JobLifecycle,
            settings=settings(
                max_examples=100,
                stateful_step_count=50,
                deadline=None,
                suppress_health_check=[HealthCheck.too_slow],
                database=None,
            ),
        )
