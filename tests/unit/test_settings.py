"""Bad settings stop the program at start: one line naming the variable, exit code 2."""

from __future__ import annotations

import subprocess
import sys

import pytest


def run_worker(env: dict[str, str], cwd: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "worker", "run", "testtasks"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        cwd=cwd,
    )


@pytest.mark.parametrize(
    ("variable", "value", "expected"),
    [
        ("WORKER_POLL_MIN", "-1", "WORKER_POLL_MIN"),
        ("WORKER_POLL_MAX", "abc", "WORKER_POLL_MAX"),
        ("WORKER_MAX_RETRIES", "-3", "WORKER_MAX_RETRIES"),
        ("WORKER_CONCURRENCY", "0", "WORKER_CONCURRENCY"),
        ("WORKER_LEASE_SECONDS", "0", "WORKER_LEASE_SECONDS"),
        ("WORKER_QUEUES", " , ", "WORKER_QUEUES"),
        ("DATABASE_URL", "mysql://root@localhost/app", "DATABASE_URL"),
        ("DATABASE_URL", "postgresql://u:secret@host:notaport/db", "DATABASE_URL"),
    ],
)
def test_invalid_setting_exits_2_naming_the_variable(tmp_path, variable, value, expected):
    env = {"PATH": "/usr/bin:/bin", variable: value, "WORKER_DATA_DIR": str(tmp_path)}
    proc = run_worker(env, tmp_path)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert expected in lines[0]
    assert "Traceback" not in proc.stderr
    assert "secret" not in proc.stderr


def test_poll_min_greater_than_max_is_refused(tmp_path):
    env = {"PATH": "/usr/bin:/bin", "WORKER_POLL_MIN": "5", "WORKER_POLL_MAX": "1"}
    proc = run_worker(env, tmp_path)
    assert proc.returncode == 2
    assert "WORKER_POLL_MIN must not be greater than WORKER_POLL_MAX" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_settings_are_read_from_dotenv(tmp_path):
    (tmp_path / ".env").write_text("WORKER_CONCURRENCY=-4\n")
    proc = subprocess.run(
        [sys.executable, "-m", "worker", "run", "testtasks"],
        env={"PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert proc.returncode == 2
    assert "WORKER_CONCURRENCY" in proc.stderr


def test_a_dotenv_that_is_not_utf8_is_one_line_naming_the_file(tmp_path):
    (tmp_path / ".env").write_bytes(b"WORKER_CONCURRENCY=\xff\xfe4\n")
    proc = run_worker({"PATH": "/usr/bin:/bin", "WORKER_DATA_DIR": str(tmp_path)}, tmp_path)
    assert proc.returncode == 2
    assert proc.stderr.strip() == "error: cannot read .env: it is not UTF-8 text"
