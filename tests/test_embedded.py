"""The embedded default: no DATABASE_URL, only the `embedded` extra installed, several
processes share one local PostgreSQL; without the extra, one line says what to install."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from support import ROOT, Processes, query

from worker.db.embedded import MISSING_SERVER, LocalPostgres, find_bin_dir

pytestmark = pytest.mark.smoke


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


def test_without_database_url_or_server_binaries_one_line_says_what_to_install(
    embedded_env, tmp_path
):
    # The real program, with every place it looks for server binaries pointed at nothing.
    hide = (
        "import sys; from pathlib import Path; import worker.db.embedded as e; "
        f"e.EMBEDDED_PACKAGE = 'no_such_package'; e.SYSTEM_INSTALLS = Path({str(tmp_path)!r}); "
        "from worker.cli import main; sys.argv = ['worker', 'jobs']; main()"
    )
    env = {k: v for k, v in embedded_env.items() if k != "WORKER_PG_BIN"}
    env["PATH"] = str(Path(sys.executable).parent)
    done = subprocess.run(
        [sys.executable, "-c", hide],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1
    assert done.stderr.strip().splitlines() == [f"error: {MISSING_SERVER}"]
    assert "pip install 'durable-worker-pg[embedded]'" in MISSING_SERVER
    assert not (tmp_path / "data" / "pg").exists()


def test_worker_pg_bin_names_the_server_binaries_before_any_other(tmp_path, monkeypatch):
    chosen = tmp_path / "pg" / "bin"
    chosen.mkdir(parents=True)
    for program in ("pg_ctl", "initdb"):
        (chosen / program).touch()
    monkeypatch.setenv("WORKER_PG_BIN", str(chosen))
    assert find_bin_dir() == chosen
    assert find_bin_dir(prefer_system=True) == chosen


def test_the_server_is_the_postgresql_version_ci_names(database_url):
    # CI runs the smoke subset once per PostgreSQL version it claims, naming it here.
    expected = os.environ.get("TEST_PG_MAJOR")
    if not expected:
        pytest.skip("TEST_PG_MAJOR is not set: no version to check")
    [(number,)] = query(database_url, "SELECT current_setting('server_version_num')::int")
    assert number // 10000 == int(expected)
