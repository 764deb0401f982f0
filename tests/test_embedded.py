"""The embedded default: no DATABASE_URL, nothing installed, several processes share one
local PostgreSQL."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from support import ROOT, Processes

from worker.db.embedded import LocalPostgres


@pytest.fixture
def embedded_env(tmp_path: Path) -> Iterator[dict[str, str]]:
    data = tmp_path / "data"
    env = {
        k: v for k, v in os.environ.items() if not k.startswith("WORKER_") and k != "DATABASE_URL"
    }
    env.update(
        {
            "WORKER_DATA_DIR": str(data),
            "WORKER_POLL_MAX": "0.5",
            "PYTHONPATH": os.pathsep.join([str(ROOT / "tests"), str(ROOT)]),
        }
    )
    yield env
    LocalPostgres(data / "pg").stop(mode="immediate")


def cli(env: dict[str, str], *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "worker", *args],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_worker_and_enqueuer_share_the_embedded_server(
    embedded_env, tmp_path, processes: Processes
):
    # DATABASE_URL is unset in both processes: the first one starts the server, the
    # second one finds it running and reuses it.
    processes.worker({**embedded_env, "DATABASE_URL": ""}, "testtasks")
    done = cli(
        embedded_env,
        "enqueue",
        "add",
        "--payload",
        '{"a": 20, "b": 22}',
        "--wait",
        "--timeout",
        "60",
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "42"
    server = LocalPostgres(tmp_path / "data" / "pg")
    assert server.is_running()
    stopped = cli(embedded_env, "db", "stop", cwd=tmp_path)
    assert stopped.returncode == 0
    assert not server.is_running()
