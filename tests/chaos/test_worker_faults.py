"""Chaos scenarios where worker processes die or are stopped: crash_recovery, repeated_kills,
graceful_shutdown. Each runs a few thousand audited jobs through real `worker run` processes
and ends with `verify`: one terminal status per job, every effect at least once, every cleanup
run, nothing left processing, duplicates counted and printed."""

from __future__ import annotations

import signal
import time

import pytest

from chaos.harness import (
    enqueue_workload,
    finished_count,
    held_by,
    kill,
    verify,
    wait_all_finished,
    wait_until,
    worker_id_of,
)

pytestmark = pytest.mark.chaos

LEASE = 3.0  # WORKER_LEASE_SECONDS of the fleets (see harness.worker_env)


def test_crash_recovery_sigkill_one_of_three_workers_loses_nothing(audited_url, fleet):
    url = audited_url
    jobs = 2500
    enqueue_workload(url, jobs, sleep=0.1)
    workers = fleet(url)
    procs = [workers.start(concurrency=8) for _ in range(3)]
    started = time.monotonic()
    workers.wait_registered(*procs)
    victim = procs[1]
    victim_id = worker_id_of(url, victim.pid)
    assert victim_id is not None
    wait_until(lambda: finished_count(url) >= jobs // 4, 120, "a quarter of the jobs")
    wait_until(lambda: held_by(url, victim_id) > 0, 30, "the victim to hold jobs")

    held = held_by(url, victim_id)
    kill(victim)
    killed_at = time.monotonic()
    victim.wait(timeout=10)
    rescue = wait_until(lambda: held_by(url, victim_id) == 0, 60, "the victim's jobs rescued")

    wait_all_finished(url, jobs, timeout=240)
    report = verify(url, "crash_recovery", time.monotonic() - started)
    report.extra = {
        "jobs_held_by_killed_worker": held,
        "rescued_after_s": round(rescue, 2),
        "lease_s": LEASE,
        "killed_after_s": round(killed_at - started, 2),
    }
    report.emit()
    # A dead worker's jobs are back within a lease plus one rescuer round (lease/4, jittered),
    # with slack for a loaded machine.
    assert rescue < LEASE * 3, f"rescue took {rescue:.1f} s"
    assert "Traceback" not in workers.log(procs[0]) + workers.log(procs[2])


def test_repeated_kills_every_few_seconds_lose_nothing(audited_url, fleet):
    url = audited_url
    jobs = 2500
    enqueue_workload(url, jobs, sleep=0.1)
    workers = fleet(url)
    steady = [workers.start(concurrency=6) for _ in range(2)]
    victim = workers.start(concurrency=6)
    started = time.monotonic()
    workers.wait_registered(*steady, victim)

    kills = 0
    held_at_kill: list[int] = []
    rescues: list[float] = []
    while finished_count(url) < jobs * 0.8 and time.monotonic() - started < 150:
        # Kill the victim a couple of seconds into its work, while it holds jobs.
        workers.wait_registered(victim)
        victim_id = worker_id_of(url, victim.pid)
        assert victim_id is not None
        wait_until(lambda w=victim_id: held_by(url, w) > 0, 30, "the victim to hold jobs")
        time.sleep(1.0)
        held_at_kill.append(held_by(url, victim_id))
        kill(victim)
        victim.wait(timeout=10)
        killed_at = time.monotonic()
        kills += 1
        victim = workers.start(concurrency=6)
        rescue = wait_until(
            lambda w=victim_id: held_by(url, w) == 0, 60, f"worker {victim_id}'s jobs rescued"
        )
        rescues.append(rescue)
        time.sleep(max(0.0, 3.0 - (time.monotonic() - killed_at)))

    wait_all_finished(url, jobs, timeout=240)
    report = verify(url, "repeated_kills", time.monotonic() - started)
    report.extra = {
        "kills": kills,
        "jobs_held_at_kills": sum(held_at_kill),
        "slowest_rescue_s": round(max(rescues), 2),
        "median_rescue_s": round(sorted(rescues)[len(rescues) // 2], 2),
        "lease_s": LEASE,
    }
    report.emit()
    assert kills >= 3, "the workload ended before the worker was killed a few times"
    assert max(rescues) < LEASE * 3


def test_graceful_shutdown_sigterm_with_jobs_in_flight_has_no_duplicates(audited_url, fleet):
    url = audited_url
    jobs = 800
    # Jobs of about half a second, well inside the 5 s grace: SIGTERM lets them finish.
    enqueue_workload(url, jobs, sleep=0.4)
    workers = fleet(url)
    stays = workers.start(concurrency=8)
    leaves = workers.start(concurrency=8, WORKER_LOG_LEVEL="INFO")
    started = time.monotonic()
    workers.wait_registered(stays, leaves)
    leaving_id = worker_id_of(url, leaves.pid)
    assert leaving_id is not None
    wait_until(lambda: finished_count(url) >= 100, 120, "the first jobs to finish")
    wait_until(lambda: held_by(url, leaving_id) > 0, 30, "the leaving worker to hold jobs")

    in_flight = held_by(url, leaving_id)
    kill(leaves, signal.SIGTERM)
    sigterm_at = time.monotonic()
    assert leaves.wait(timeout=30) == 0
    stop_seconds = time.monotonic() - sigterm_at
    assert held_by(url, leaving_id) == 0, "a stopped worker left jobs marked processing"

    wait_all_finished(url, jobs, timeout=240)
    report = verify(url, "graceful_shutdown", time.monotonic() - started)
    report.extra = {"in_flight_at_sigterm": in_flight, "stopped_after_s": round(stop_seconds, 2)}
    report.emit()
    assert report.duplicates == 0
    log = workers.log(leaves)
    assert "stopping" in log and "Traceback" not in log
