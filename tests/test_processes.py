"""`worker run --processes N`: a supervisor keeps N worker processes running and stops them."""

from __future__ import annotations

import doctest
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from support import Processes, counts, query, wait_for

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
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return not Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].startswith(" Z")


def registered(database_url: str) -> set[int]:
    return {pid for (pid,) in query(database_url, "SELECT pid FROM worker.workers")}


def test_each_process_registers_its_own_worker_and_the_supervisor_holds_no_connection(
    env, database_url, processes: Processes
):
    proc = processes.worker(env, "testtasks", args=("--processes", "3"))
    pids = wait_for(
        lambda: (found := registered(database_url)) and len(found) == 3 and found,
        message="3 workers registered",
    )
    assert isinstance(pids, set)
    assert proc.pid not in pids
    assert {parent_of(pid) for pid in pids} == {proc.pid}
    assert sockets_of(proc.pid) == []
    jobs = [Client(database_url).enqueue("add", {"a": i, "b": 1}) for i in range(30)]
    assert [j.wait_sync(timeout=30) for j in jobs] == [i + 1 for i in range(30)]
    log = processes.log(proc)
    for slot in (1, 2, 3):
        assert re.search(rf"worker process {slot} of 3 started \(pid \d+\)", log)


def test_one_process_is_the_worker_itself_with_no_supervisor(env, database_url, processes):
    proc = processes.worker(env, "testtasks", args=("--processes", "1"))
    wait_for(lambda: registered(database_url), message="the worker registered")
    assert registered(database_url) == {proc.pid}
    assert "supervisor" not in processes.log(proc)


def test_a_killed_process_is_started_again_and_every_job_completes_once(
    env, database_url, processes
):
    client = Client(database_url)
    jobs = [client.enqueue("effect", {"key": str(i), "sleep": 2}) for i in range(8)]
    proc = processes.worker(
        env, "testtasks", args=("--processes", "2"), extra={"WORKER_CONCURRENCY": "2"}
    )
    wait_for(lambda: counts(database_url).get("processing") == 4, message="4 jobs running")
    (victim,) = query(
        database_url,
        "SELECT w.pid FROM worker.workers w JOIN worker.jobs j ON j.worker_id = w.id "
        "WHERE j.status = 'processing' GROUP BY w.pid LIMIT 1",
    )[0:1]
    os.kill(victim[0], signal.SIGKILL)
    wait_for(
        lambda: len(registered(database_url) - {victim[0]}) == 2,
        message="a new process in the killed one's place",
    )
    wait_for(lambda: counts(database_url) == {"completed": 8}, timeout=60, message="all done")
    runs = query(database_url, "SELECT job, count(*) FROM effects GROUP BY job")
    assert sorted(runs) == sorted((str(i), 1) for i in range(8))
    # The killed process's two jobs ran again elsewhere: a rescue counts an attempt.
    assert sorted(j.refresh().retry_count for j in jobs) == [0] * 6 + [1] * 2
    log = processes.log(proc)
    assert f"(pid {victim[0]}) was killed by SIGKILL; starting again in 0.5 s" in log
    assert len(re.findall(r"worker process \d of 2 started", log)) == 3


def test_sigterm_to_the_supervisor_stops_every_process_gracefully(env, database_url, processes):
    client = Client(database_url)
    jobs = [client.enqueue("effect", {"key": str(i), "sleep": 1.5}) for i in range(4)]
    proc = processes.worker(
        env, "testtasks", args=("--processes", "2"), extra={"WORKER_CONCURRENCY": "2"}
    )
    wait_for(lambda: counts(database_url).get("processing") == 4, message="4 jobs running")
    children = registered(database_url)
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
    proc = processes.worker(env, "testtasks", args=("--processes", "2"))
    children = wait_for(
        lambda: (found := registered(database_url)) and len(found) == 2 and found,
        message="2 workers registered",
    )
    assert isinstance(children, set)
    os.kill(proc.pid, signal.SIGKILL)
    wait_for(lambda: not registered(database_url), timeout=20, message="both deregistered")
    wait_for(lambda: not [pid for pid in children if alive(pid)], message="both exited")
    assert processes.log(proc).count(f"the supervisor (pid {proc.pid}) is gone: stopping") == 2


def test_a_process_that_dies_at_every_start_is_started_again_ever_more_slowly(
    env, database_url, processes, tmp_path
):
    # Imports in the supervisor (which checks the modules), exits in every child it starts.
    (tmp_path / "dies_in_children.py").write_text(
        "import sys\nif '--supervisor-pid' in sys.argv:\n    sys.exit(3)\n"
    )
    proc = processes.worker(env, "dies_in_children", args=("--processes", "2"))
    exits = r"worker process 1 \(pid \d+\) exited with code 3; starting again in (\S+) s"
    delays = wait_for(
        lambda: len(found := re.findall(exits, processes.log(proc))) >= 2 and found,
        timeout=30,
        message="process 1 started a third time",
    )
    assert isinstance(delays, list)
    assert delays[:2] == ["0.5", "1"]
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) in (0, 1)


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
