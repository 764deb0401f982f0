"""`worker run --processes N`: a supervisor keeps N worker processes running and stops them."""

from __future__ import annotations

import doctest
import logging
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from support import Processes, counts, free_port, query, wait_for

from worker import Client
from worker.daemon import supervisor


def parent_of(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[1])


def sockets_of(pid: int) -> list[str]:
    fds = Path(f"/proc/{pid}/fd")
    links = []
    for fd in fds.iterdir():
        try:
            links.append(os.readlink(fd))
        except OSError:  # closed since listed
            continue
    return [link for link in links if link.startswith("socket:")]


def alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie, exited but not yet reaped, does not)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


def cpus_of_threads(pid: int) -> set[frozenset[int]]:
    """The CPUs each live thread of `pid` may run on, as a set of the distinct answers."""
    found = set()
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            found.add(frozenset(os.sched_getaffinity(int(tid))))
        except ProcessLookupError:  # the thread ended since listed
            continue
    return found


def registered(database_url: str) -> set[int]:
    return {pid for (pid,) in query(database_url, "SELECT pid FROM worker.workers")}


def supervised(
    processes: Processes, env: dict[str, str], n: int, **settings: str
) -> tuple[subprocess.Popen[bytes], set[int]]:
    """`worker run testtasks --processes n`, once its n workers have registered; their pids."""
    proc = processes.worker(env, "testtasks", args=("--processes", str(n)), extra=settings)
    database_url = env["DATABASE_URL"]
    pids = wait_for(
        lambda: (found := registered(database_url)) and len(found) == n and found,
        timeout=60,
        message=f"{n} workers registered",
    )
    assert isinstance(pids, set)
    return proc, pids


def claimed_by_metrics(port: int) -> float:
    """The `durable_worker_jobs_claimed_total` the worker process on `port` serves."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as answer:
        text = answer.read().decode()
    (line,) = [
        ln for ln in text.splitlines() if ln.startswith("durable_worker_jobs_claimed_total ")
    ]
    return float(line.split()[1])


def consecutive_free_ports() -> int:
    """A port p such that p and p + 1 are both free right now."""
    while True:
        port = free_port()
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port + 1))
            except OSError:
                continue
        return port


def test_each_process_registers_its_own_worker_and_the_supervisor_holds_no_connection(
    env, database_url, processes: Processes
):
    port = consecutive_free_ports()
    proc, pids = supervised(processes, env, 2, WORKER_METRICS_PORT=str(port))
    assert proc.pid not in pids
    assert {parent_of(pid) for pid in pids} == {proc.pid}
    assert sockets_of(proc.pid) == []
    # Not pinned unless asked: each child may run on every CPU the supervisor may.
    assert all(cpus_of_threads(pid) == {frozenset(os.sched_getaffinity(0))} for pid in pids)
    jobs = [Client(database_url).enqueue("add", {"a": i, "b": 1}) for i in range(30)]
    assert [j.wait_sync(timeout=30) for j in jobs] == [i + 1 for i in range(30)]
    # Process k serves its own counters on WORKER_METRICS_PORT + k - 1.
    assert claimed_by_metrics(port) + claimed_by_metrics(port + 1) == 30
    log = processes.log(proc)
    for slot in (1, 2):
        assert re.search(rf"worker process {slot} of 2 started \(pid \d+\)", log)


def test_pinned_processes_run_every_thread_on_a_cpu_of_their_own(
    env, database_url, processes: Processes
):
    proc, pids = supervised(processes, env, 2, WORKER_PIN_CPUS="true")
    usable = sorted(os.sched_getaffinity(0))
    started = re.findall(
        r"worker process (\d) of 2 started \(pid (\d+)\) on CPU (\d+)", processes.log(proc)
    )
    assert {int(pid) for _, pid, _ in started} == pids
    assert len({cpu for _, _, cpu in started}) == min(2, len(usable))
    jobs = [Client(database_url).enqueue("add", {"a": i, "b": 1}) for i in range(20)]
    assert [j.wait_sync(timeout=30) for j in jobs] == [i + 1 for i in range(20)]
    # Every thread, those the jobs started included, stays on its process's CPU.
    for slot, pid, cpu in started:
        assert int(cpu) == usable[(int(slot) - 1) % len(usable)]
        assert cpus_of_threads(int(pid)) == {frozenset({int(cpu)})}
    # A process started again in place of a dead one is pinned as the first was.
    slot, pid, cpu = started[0]
    os.kill(int(pid), signal.SIGKILL)
    again = rf"worker process {slot} of 2 started \(pid (\d+)\) on CPU {cpu}\n"
    new_pid = wait_for(
        lambda: (
            (found := re.findall(again, processes.log(proc))) and found[-1] != pid and found[-1]
        ),
        timeout=30,
        message="the killed process started again",
    )
    assert cpus_of_threads(int(new_pid)) == {frozenset({int(cpu)})}


def test_one_pinned_process_runs_on_the_first_cpu_it_may_use(env, database_url, processes):
    proc = processes.worker(env, "testtasks", extra={"WORKER_PIN_CPUS": "true"})
    wait_for(lambda: registered(database_url), timeout=60, message="the worker registered")
    first = min(os.sched_getaffinity(0))
    job = Client(database_url).enqueue("add", {"a": 1, "b": 2})
    assert job.wait_sync(timeout=30) == 3
    # Its task threads, started after the pin, are on that CPU too.
    assert cpus_of_threads(proc.pid) == {frozenset({first})}
    assert f"pinned to CPU {first}" in processes.log(proc)


def test_one_process_is_the_worker_itself_with_no_supervisor(env, database_url, processes):
    proc = processes.worker(env, "testtasks", args=("--processes", "1"))
    wait_for(lambda: registered(database_url), timeout=60, message="the worker registered")
    assert registered(database_url) == {proc.pid}
    assert "supervisor" not in processes.log(proc)


def test_a_killed_process_is_started_again_and_every_job_completes_once(
    env, database_url, processes
):
    proc, _ = supervised(processes, env, 2, WORKER_CONCURRENCY="2")
    client = Client(database_url)
    jobs = [client.enqueue("effect", {"key": str(i), "sleep": 3}) for i in range(8)]
    wait_for(lambda: counts(database_url).get("processing") == 4, message="4 jobs running")
    victim = query(
        database_url,
        "SELECT w.pid FROM worker.workers w JOIN worker.jobs j ON j.worker_id = w.id "
        "WHERE j.status = 'processing' LIMIT 1",
    )[0][0]
    os.kill(victim, signal.SIGKILL)
    wait_for(
        lambda: len(registered(database_url) - {victim}) == 2,
        timeout=60,
        message="a new process in the killed one's place",
    )
    wait_for(lambda: counts(database_url) == {"completed": 8}, timeout=60, message="all done")
    runs = query(database_url, "SELECT job, count(*) FROM effects GROUP BY job")
    assert sorted(runs) == sorted((str(i), 1) for i in range(8))
    # The killed process's two jobs ran again elsewhere: a rescue counts an attempt.
    assert sorted(j.refresh().retry_count for j in jobs) == [0] * 6 + [1] * 2
    log = processes.log(proc)
    assert f"(pid {victim}) was killed by SIGKILL; starting again in 0.5 s" in log
    assert len(re.findall(r"worker process \d of 2 started", log)) == 3


def test_sigterm_to_the_supervisor_stops_every_process_gracefully(env, database_url, processes):
    proc, children = supervised(processes, env, 2, WORKER_CONCURRENCY="2")
    client = Client(database_url)
    jobs = [client.enqueue("effect", {"key": str(i), "sleep": 1.5}) for i in range(4)]
    wait_for(lambda: counts(database_url).get("processing") == 4, message="4 jobs running")
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 0
    assert counts(database_url) == {"completed": 4}
    assert all(j.refresh().retry_count == 0 for j in jobs)
    assert query(database_url, "SELECT count(*) FROM worker.workers") == [(0,)]
    assert not [pid for pid in children if alive(pid)]
    log = processes.log(proc)
    assert "SIGTERM to 2 worker processes" in log
    assert len(re.findall(r"\(pid \d+\) exited with code 0", log)) == 2


def test_processes_whose_supervisor_is_killed_stop_by_themselves(env, database_url, processes):
    proc, children = supervised(processes, env, 2)
    os.kill(proc.pid, signal.SIGKILL)
    wait_for(lambda: not registered(database_url), timeout=30, message="both deregistered")
    wait_for(lambda: not [pid for pid in children if alive(pid)], message="both exited")
    assert processes.log(proc).count(f"the supervisor (pid {proc.pid}) is gone: stopping") == 2


@pytest.mark.parametrize(
    ("args", "extra", "message"),
    [
        (
            ("--processes", "0"),
            {},
            "error: --processes: Input should be greater than or equal to 1",
        ),
        (
            (),
            {"WORKER_PROCESSES": "0"},
            "error: invalid setting WORKER_PROCESSES: Input should be greater than or equal to 1",
        ),
        (
            (),
            {"WORKER_PROCESSES": "two"},
            "error: invalid setting WORKER_PROCESSES: Input should be a valid integer, "
            "unable to parse string as an integer",
        ),
        (
            (),
            {"WORKER_PROCESSES": "2", "WORKER_METRICS_PORT": "65535"},
            "error: invalid setting WORKER_METRICS_PORT + WORKER_PROCESSES - 1 must be at most "
            "65535 (worker process k serves metrics on WORKER_METRICS_PORT + k - 1)",
        ),
    ],
)
def test_a_bad_number_of_processes_is_one_line_naming_it(env, tmp_path, args, extra, message):
    result = subprocess.run(
        [sys.executable, "-m", "worker", "run", "testtasks", *args],
        env={**env, **extra, "COLUMNS": "200"},
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [message]


def test_how_a_process_ended_reads_as_its_code_or_signal():
    assert doctest.testmod(supervisor).failed == 0


def test_a_dying_process_waits_from_half_a_second_doubling_up_to_half_a_minute():
    backoff = supervisor.Child(slot=1).backoff
    assert [backoff.next() for _ in range(9)] == [0.5, 1, 2, 4, 8, 16, 30, 30, 30]


class Lines(logging.Handler):
    """The supervisor's log lines, as text."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


@pytest.fixture
def supervisor_lines() -> Iterator[list[str]]:
    handler, logger = Lines(), logging.getLogger("worker.supervisor")
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    yield handler.lines
    logger.removeHandler(handler)
    logger.setLevel(level)


def python(code: str) -> list[str]:
    return [sys.executable, "-c", code]


def when(predicate: Callable[[], object], then: Callable[[], None]) -> None:
    """From another thread: `then()` once `predicate()` holds, or after 60 s anyway (so that a
    supervisor waiting for its stop in the test's thread always gets it)."""

    def watch() -> None:
        try:
            wait_for(predicate, timeout=60)
        finally:
            then()

    threading.Thread(target=watch, daemon=True).start()


def restart_delays(lines: list[str]) -> list[str]:
    return [line.rpartition(" in ")[2] for line in lines if "; starting again in " in line]


def ready_marker(path: Path) -> str:
    """Code for a child to run once its signal handler is set: it leaves a file in `path`."""
    return f"import os; open(os.path.join({str(path)!r}, str(os.getpid())), 'w').close()\n"


def test_a_process_that_dies_at_every_start_is_started_again_ever_more_slowly(supervisor_lines):
    sup = supervisor.Supervisor(
        python("import sys; sys.exit(3)"), 1, env_for=lambda slot: os.environ, stop_timeout=5
    )
    when(lambda: len(restart_delays(supervisor_lines)) >= 3, sup.request_stop)
    sup.run()  # 1 if the stop met a child exiting with 3 again, else 0
    assert restart_delays(supervisor_lines)[:3] == ["0.5 s", "1 s", "2 s"]
    assert all("exited with code 3" in line for line in supervisor_lines if "again in" in line)


def test_a_process_that_ran_steadily_before_it_died_waits_the_shortest_delay_again(
    monkeypatch, supervisor_lines
):
    monkeypatch.setattr(supervisor, "STEADY_SECONDS", 0.2)
    sup = supervisor.Supervisor(
        python("import time; time.sleep(0.3)"), 1, env_for=lambda slot: os.environ, stop_timeout=5
    )
    when(lambda: len(restart_delays(supervisor_lines)) >= 3, sup.request_stop)
    assert sup.run() == 0
    assert restart_delays(supervisor_lines)[:3] == ["0.5 s"] * 3


def test_ctrl_c_stops_every_process_with_sigterm_and_exits_0(supervisor_lines, tmp_path):
    stops_on_sigterm = python(
        "import signal, sys, time\n"
        "signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))\n"
        + ready_marker(tmp_path)
        + "time.sleep(60)\n"
    )
    sup = supervisor.Supervisor(
        stops_on_sigterm, 2, env_for=lambda slot: os.environ, stop_timeout=10
    )
    when(lambda: len(list(tmp_path.iterdir())) == 2, lambda: os.kill(os.getpid(), signal.SIGINT))
    assert sup.run() == 0
    assert "supervisor stopping: SIGTERM to 2 worker processes" in supervisor_lines
    assert sum(line.endswith("exited with code 0") for line in supervisor_lines) == 2


def test_a_process_that_ignores_sigterm_is_killed_after_the_stop_timeout(
    supervisor_lines, tmp_path
):
    ignores_sigterm = python(
        "import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        + ready_marker(tmp_path)
        + "time.sleep(60)\n"
    )
    sup = supervisor.Supervisor(ignores_sigterm, 1, env_for=lambda slot: os.environ, stop_timeout=1)
    when(lambda: any(tmp_path.iterdir()), sup.request_stop)
    assert sup.run() == 1
    assert any("still runs 1 s after SIGTERM: killing it" in line for line in supervisor_lines)
    assert any(line.endswith("was killed by SIGKILL") for line in supervisor_lines)


def test_burst_with_several_processes_exits_0_once_each_found_nothing(
    env, database_url, processes: Processes
):
    client = Client(database_url)
    jobs = [client.enqueue("add", {"a": n, "b": 1}) for n in range(40)]
    proc = processes.worker(env, "testtasks", args=("--burst", "--processes", "2"))
    assert proc.wait(timeout=180) == 0, processes.log(proc)
    assert {job.refresh().status for job in jobs} == {"completed"}
    log = processes.log(proc)
    assert log.count("no due job left in its queues (burst)") == 2, log
    assert "starting again" not in log
