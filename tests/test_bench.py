"""`worker bench`: measures on the user's database, then leaves no job of its own behind."""

from __future__ import annotations

import subprocess
import sys

from support import query


def test_bench_reports_every_measurement_and_deletes_its_jobs(env, database_url):
    query(database_url, "INSERT INTO worker.jobs (task, payload) VALUES ('users_job', '{}')")
    proc = subprocess.run(
        [
            *(sys.executable, "-m", "worker", "bench"),
            *("--jobs", "300", "--single", "50", "--latency-jobs", "20"),
        ],
        env={**env, "COLUMNS": "200"},
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stderr
    for name in ("enqueue, 1 job per call", "enqueue_many", "drain, concurrency 10", "latency"):
        assert name in proc.stdout
    assert "jobs/s" in proc.stdout and "p99" in proc.stdout
    assert "removed the 370 jobs of queue bench-" in proc.stderr
    # Only the user's job is left, untouched; the bench's worker deregistered itself.
    assert query(database_url, "SELECT task, status FROM worker.jobs") == [("users_job", "pending")]
    assert query(database_url, "SELECT count(*) FROM worker.workers") == [(0,)]


def test_the_kill_benchmark_reports_the_time_to_restart_over_its_kills(env, database_url, tmp_path):
    proc = subprocess.run(
        [
            *(sys.executable, "-m", "bench", "--only", "kills", "--libs", "durable"),
            *("--runs", "1", "--kills", "2", "--out", str(tmp_path / "report.md")),
        ],
        env={**env, "BENCH_DATABASE_URL": database_url},
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stderr
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("Time to restart"))
    assert "over 2 kills" in line and "p90" in line, line
    assert "1 of 1 measurements passed" in proc.stdout, proc.stdout
    # The whole fleet's jobs start again within seconds, not a 15 s lease later.
    worst = float(line.rsplit("max ", 1)[1].split(" s")[0])
    assert worst < 3.0, line
