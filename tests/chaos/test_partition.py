"""Chaos scenario: a worker cut off from PostgreSQL without a reset, for longer than the lease.

The worker runs in a network namespace of its own and reaches the server over a veth pair;
taking the link down drops its packets silently, as a partition does (a kill would send a
reset or close the sockets). Meanwhile a worker on the host goes on. The scenario checks that
the cut-off worker's jobs are rescued within the lease plus a margin, that it notices within
its own connection timeouts (TCP keepalives and `tcp_user_timeout`, given in its URL here so
the test is short), that nothing it sends after the link returns changes a job it no longer
holds, that it registers again, and that every job ends in one terminal status, once.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pytest
from support import Processes, query
from support.netns import Namespace, unavailable_reason
from support.processes import QUICK
from support.servers import server_root, set_conf, trust_clients

from chaos.harness import (
    enqueue_workload,
    finished_count,
    held_by,
    install_audit,
    verify,
    wait_all_finished,
    wait_until,
    worker_env,
    worker_id_of,
)
from worker.db import migrate
from worker.db.embedded import DATABASE, LocalPostgres

pytestmark = pytest.mark.chaos

TASKS = "chaos.faulttasks"

LEASE = float(QUICK["WORKER_LEASE_SECONDS"])
# The cut-off worker's own bounds on a silent connection: an idle one is probed after 1 s and
# given up after 3 unanswered probes; one with data unacknowledged is given up after 4 s.
TIMEOUTS = "keepalives_idle=1&keepalives_interval=1&keepalives_count=3&tcp_user_timeout=4000"
USER_TIMEOUT = 4.0
CONNECT_TIMEOUT = 3.0


@dataclass
class Partitionable:
    """A server on this host, and a namespace that reaches it over a link a test can cut."""

    ns: Namespace
    url: str  # from the host
    far_url: str  # from the namespace, with the short timeouts


@pytest.fixture
def partitionable() -> Iterator[Partitionable]:
    if reason := unavailable_reason():
        pytest.skip(f"a network partition needs a network namespace: {reason}")
    with server_root("dw-partition-") as root, Namespace.create() as ns:
        server = LocalPostgres(root / "pg", durable=False, prefer_system=True)
        try:
            server.start()
            set_conf(server, listen_addresses=f"'127.0.0.1,{ns.host_address}'")
            trust_clients(server, ns.subnet)
            server.stop()
            server.start()
            migrate.upgrade(server.url())
            install_audit(server.url())
            far_url = (
                f"postgresql://postgres@{ns.host_address}:{server.port}/{DATABASE}"
                f"?{TIMEOUTS}&connect_timeout={int(CONNECT_TIMEOUT)}"
            )
            yield Partitionable(ns, server.url(), far_url)
        finally:
            server.destroy()


def logged_at(
    processes: Processes, proc: subprocess.Popen[bytes], text: str, timeout: float
) -> float:
    """Seconds until `text` shows up in the process's log."""
    return wait_until(lambda: text in processes.log(proc), timeout, f"{text!r} in the log")


def seconds_until_each(
    checks: dict[str, Callable[[], object]], since: float, timeout: float
) -> dict[str, float]:
    """How long after `since` each check first held; waits until all have."""
    seen: dict[str, float] = {}

    def all_seen() -> bool:
        for name, check in checks.items():
            if name not in seen and check():
                seen[name] = time.monotonic() - since
        return len(seen) == len(checks)

    wait_until(all_seen, timeout, f"all of {list(checks)} (seen: {seen})")
    return seen


def test_a_partitioned_worker_loses_its_jobs_to_others_and_comes_back(partitionable, processes):
    net = partitionable
    url = net.url
    jobs = 300
    partition_for = 4 * LEASE
    enqueue_workload(url, jobs, sleep=0.5)
    started = time.monotonic()
    cut_off = processes.worker(
        worker_env(net.far_url),
        TASKS,
        extra={"WORKER_CONCURRENCY": "8"},
        prefix=net.ns.exec_prefix,
    )
    wait_until(lambda: worker_id_of(url, cut_off.pid), 60, "the worker to register")
    cut_off_id = str(worker_id_of(url, cut_off.pid))
    wait_until(lambda: held_by(url, cut_off_id) >= 4, 60, "the worker to hold jobs")
    outside = processes.worker(worker_env(url), TASKS, extra={"WORKER_CONCURRENCY": "8"})
    wait_until(lambda: worker_id_of(url, outside.pid), 60, "the outside worker to register")
    wait_until(lambda: finished_count(url) >= jobs // 5, 120, "a fifth of the jobs")

    net.ns.cut()
    cut_at = time.monotonic()
    time.sleep(0.5)  # what the worker sent before the cut has arrived or never will
    held = [
        str(r[0])
        for r in query(
            url,
            "SELECT id FROM worker.jobs WHERE status = 'processing' AND worker_id = %s",
            (cut_off_id,),
        )
    ]
    assert held, "the cut-off worker held no job when the link went down"
    seen = seconds_until_each(
        {
            "rescued": lambda: held_by(url, cut_off_id) == 0,
            "noticed": lambda: "database unreachable (" in processes.log(cut_off),
        },
        since=cut_at,
        timeout=60,
    )
    rescued_after, noticed_after = seen["rescued"], seen["noticed"]
    # The jobs it held are finished by the outside worker while the link is still down.
    wait_until(
        lambda: query(
            url,
            "SELECT count(*) = 0 FROM worker.jobs WHERE id = ANY(%s::uuid[]) "
            "AND status NOT IN ('completed', 'failed', 'cancelled')",
            (held,),
        )[0][0],
        60,
        "the rescued jobs to finish elsewhere",
    )
    time.sleep(max(0.0, partition_for - (time.monotonic() - cut_at)))
    ((healed_db_at,),) = query(url, "SELECT clock_timestamp()")
    net.ns.heal()
    healed_at = time.monotonic()
    partitioned_for = healed_at - cut_at

    back_after = logged_at(processes, cut_off, "registering again", 60)
    wait_until(lambda: worker_id_of(url, cut_off.pid), 30, "the worker to register again")
    wait_all_finished(url, jobs, timeout=180)
    report = verify(url, "partition", time.monotonic() - started)

    # Whatever the cut-off worker sent once the link was back, none of it touched the jobs
    # that had been taken from it and finished elsewhere.
    (late,) = query(
        url,
        "SELECT count(*) FROM chaos_transitions WHERE job = ANY(%s::uuid[]) AND at > %s",
        (held, healed_db_at),
    )[0]
    assert late == 0, f"{late} status changes of rescued jobs after the link came back"
    log = processes.log(cut_off)
    assert "Traceback" not in log, log[-3000:]
    assert cut_off.poll() is None and outside.poll() is None, "a worker exited"

    report.extra = {
        "lease_s": LEASE,
        "partitioned_s": round(partitioned_for, 2),
        "held_at_cut": len(held),
        "rescued_after_cut_s": round(rescued_after, 2),
        "noticed_after_cut_s": round(noticed_after, 2),
        "registered_again_after_heal_s": round(back_after, 2),
    }
    report.emit()
    assert partitioned_for > LEASE
    assert rescued_after <= LEASE + 5, f"rescued {rescued_after:.1f} s after the cut"
    assert noticed_after <= LEASE / 3 + USER_TIMEOUT + CONNECT_TIMEOUT + 3, (
        f"the cut-off worker noticed {noticed_after:.1f} s after the cut"
    )


def test_a_network_cut_shorter_than_the_default_lease_runs_no_job_twice(partitionable, processes):
    """At the default lease, a worker cut off for 10 s keeps its jobs: its process lives, so
    its sessions on the server do too and its lease has not run out, and nobody takes them
    from it. Its jobs run through the cut and touch the database only after it, so a second
    run of one can only be a rescue that should not have happened."""
    net = partitionable
    url = net.url
    lease = 15.0  # the default
    partition_for = 10.0
    held_jobs = 8
    defaults = {"WORKER_LEASE_SECONDS": str(lease), "WORKER_CONCURRENCY": str(held_jobs)}
    started = time.monotonic()
    outside = processes.worker(worker_env(url, **defaults), TASKS)
    wait_until(lambda: worker_id_of(url, outside.pid), 60, "the outside worker to register")
    # Jobs of a queue only the worker to be cut off serves, running past the cut's end.
    query(
        url,
        "INSERT INTO worker.jobs (task, queue, payload) SELECT 'chaos_sync', 'held', "
        "jsonb_build_object('n', i, 'sleep', %s) FROM generate_series(1, %s) AS i",
        (partition_for + 4, held_jobs),
    )
    cut_off = processes.worker(
        worker_env(net.far_url, WORKER_QUEUES="held,default", **defaults),
        TASKS,
        prefix=net.ns.exec_prefix,
    )
    wait_until(lambda: worker_id_of(url, cut_off.pid), 60, "the worker to register")
    cut_off_id = str(worker_id_of(url, cut_off.pid))
    wait_until(lambda: held_by(url, cut_off_id) == held_jobs, 60, "the worker to hold its jobs")

    net.ns.cut()
    cut_at = time.monotonic()
    # Work for the outside worker meanwhile.
    jobs = held_jobs + 100
    enqueue_workload(url, jobs - held_jobs, sleep=0.1)
    wait_until(lambda: finished_count(url) > 10, 30, "the outside worker to go on")
    time.sleep(max(0.0, partition_for - (time.monotonic() - cut_at)))
    net.ns.heal()
    partitioned_for = time.monotonic() - cut_at

    wait_all_finished(url, jobs, timeout=180)
    report = verify(url, "short_partition", time.monotonic() - started)
    report.extra = {"lease_s": lease, "partitioned_s": round(partitioned_for, 2)}
    report.emit()
    assert partitioned_for < lease
    assert report.duplicates == 0, f"{report.duplicates} effects ran again"
    # Every job it held was finished by it, in the attempt it had when the link went down.
    (taken,) = query(
        url,
        "SELECT count(*) FROM worker.jobs WHERE queue = 'held' "
        "AND (retry_count > 0 OR worker_id IS DISTINCT FROM %s)",
        (cut_off_id,),
    )[0]
    assert taken == 0, f"{taken} of the {held_jobs} jobs it held were taken from it"
    log = processes.log(cut_off)
    assert "Traceback" not in log, log[-3000:]
    assert cut_off.poll() is None and outside.poll() is None, "a worker exited"
