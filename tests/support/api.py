"""A running `worker api` process for a test, and a reader of its Server-Sent Events.

What this does not do: it starts no worker (see `support.processes`) and checks nothing; the
tests assert on what the API answered.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from support.network import free_port
from support.processes import Processes
from support.waiting import wait_for
from worker.events import PostgresBus
from worker.models import ProgressEvent

TOKEN = "test-token-3f9a"


@dataclass
class Api:
    """A running `worker api` process and an HTTP client for it."""

    base: str
    proc: subprocess.Popen[bytes]
    log_path: Path
    token: str | None = TOKEN

    def client(self, **kwargs: Any) -> httpx.Client:
        return httpx.Client(base_url=self.base, timeout=30, **kwargs)

    def auth(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"}

    def log(self) -> str:
        return self.log_path.read_text()


def start_api(
    env: dict[str, str],
    processes: Processes,
    *,
    token: str | None = TOKEN,
    host: str = "127.0.0.1",
    extra: dict[str, str] | None = None,
) -> Api:
    """Start `worker api` on a free port; it is killed with the test's other processes."""
    port = free_port()
    log_path = processes.tmp_path / f"api-{len(processes.procs)}.log"
    run_env = {**env, **(extra or {})}
    if token is not None:
        run_env["WORKER_API_TOKEN"] = token
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "worker", "api", "--host", host, "--port", str(port)],
            env=run_env,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=processes.tmp_path,
            start_new_session=True,
        )
    proc.log_path = str(log_path)  # type: ignore[attr-defined]
    processes.procs.append(proc)
    api = Api(f"http://127.0.0.1:{port}", proc, log_path, token)

    def answering() -> bool:
        if proc.poll() is not None:
            raise AssertionError(f"worker api exited with {proc.returncode}:\n{api.log()}")
        try:
            return httpx.get(api.base + "/openapi.json", timeout=2).status_code == 200
        except httpx.TransportError:
            return False

    wait_for(answering, timeout=60, interval=0.1, message="the API to answer")
    return api


@dataclass
class Sse:
    id: int | None
    event: str
    data: Any
    received: float = field(default_factory=time.monotonic)


def sse_messages(response: httpx.Response) -> Iterator[Sse]:
    """Parse a text/event-stream body as it arrives (comments and `retry:` are skipped)."""
    event_id: int | None = None
    event = "message"
    data: list[str] = []
    for line in response.iter_lines():
        if line == "":
            if data:
                yield Sse(event_id, event, json.loads("\n".join(data)))
            event_id, event, data = None, "message", []
        elif line.startswith(":"):
            continue
        else:
            name, _, value = line.partition(":")
            value = value.removeprefix(" ")
            if name == "id":
                event_id = int(value)
            elif name == "event":
                event = value
            elif name == "data":
                data.append(value)


def publish_progress(url: str, job_id: str, i: int) -> None:
    """One progress event of the job, written through the product's bus as a worker does."""

    async def write() -> None:
        bus = PostgresBus(url)
        await bus.start()
        try:
            bus.publish(
                ProgressEvent(job_id=job_id, step="load", status="progress", message={"i": i})
            )
            await bus.flush()
        finally:
            await bus.aclose()

    asyncio.run(write())
