"""Fixtures of the chaos suite: audited databases, servers of a test's own, worker fleets."""

from __future__ import annotations

import subprocess
import uuid
from collections.abc import Callable, Iterator

import pytest
from support import Processes

from chaos.harness import OwnServer, install_audit, query, wait_until, worker_env

TASKS = "chaos.faulttasks"


@pytest.fixture
def audited_url(database_url: str) -> str:
    """This test's database on the shared server, with the status audit and effects table."""
    install_audit(database_url)
    return database_url


@pytest.fixture
def own_server() -> Iterator[Callable[..., OwnServer]]:
    """Start a PostgreSQL for this test alone (`own_server(max_connections=...)`); it is
    destroyed when the test ends, whatever state it was left in."""
    servers: list[OwnServer] = []

    def start(max_connections: int = 100) -> OwnServer:
        server = OwnServer(max_connections=max_connections)
        servers.append(server)
        install_audit(server.url)
        return server

    yield start
    for server in servers:
        server.destroy()


class Fleet:
    """The worker processes of one scenario, each with its own application_name, so a test can
    find (and terminate) exactly their database sessions."""

    def __init__(self, processes: Processes, url: str, **settings: str) -> None:
        self.processes = processes
        self.url = url
        self.tag = f"chaos-{uuid.uuid4().hex[:8]}"
        self.env = worker_env(url, **settings)
        self.started: list[subprocess.Popen[bytes]] = []

    def start(self, concurrency: int = 8, **extra: str) -> subprocess.Popen[bytes]:
        proc = self.processes.worker(
            self.env,
            TASKS,
            extra={
                "WORKER_CONCURRENCY": str(concurrency),
                "PGAPPNAME": f"{self.tag}-{len(self.started)}",
                **extra,
            },
        )
        self.started.append(proc)
        return proc

    def wait_registered(self, *procs: subprocess.Popen[bytes], timeout: float = 60) -> None:
        pids = [p.pid for p in procs]
        wait_until(
            lambda: (
                len(query(self.url, "SELECT 1 FROM worker.workers WHERE pid = ANY(%s)", (pids,)))
                == len(pids)
            ),
            timeout,
            f"workers {pids} to register",
        )

    def log(self, proc: subprocess.Popen[bytes]) -> str:
        return self.processes.log(proc)

    def logs(self) -> str:
        return "\n".join(self.log(p) for p in self.started)


@pytest.fixture
def fleet(processes: Processes) -> Callable[..., Fleet]:
    def make(url: str, **settings: str) -> Fleet:
        return Fleet(processes, url, **settings)

    return make
