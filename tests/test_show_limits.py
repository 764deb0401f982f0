"""`worker show` gives a job's retries against the limit that applies to it, as the claim
reads it: the job's own `max_retries`, else its task's or pipeline's, else the running
workers' `WORKER_MAX_RETRIES`; the CLI does not import the task's code, so the workers publish
their tasks' limits (`worker.task_limits`). Real worker processes, a real PostgreSQL."""

from __future__ import annotations

import json
import re
import subprocess
import sys

from support import query, wait_for, wait_for_status

from worker import Client


def show(env: dict[str, str], job_id: str, *args: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "worker", "show", job_id, *args],
        env={**env, "COLUMNS": "200"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def retries_line(text: str) -> str:
    return next(
        re.sub(r"\s+", " ", line.strip()) for line in text.splitlines() if "retries" in line
    )


def test_show_gives_retries_against_the_limit_the_claim_applies(env, database_url, processes):
    # The workers' default differs from the CLI's (3): `show` must give the workers' one.
    processes.worker({**env, "WORKER_MAX_RETRIES": "1"}, "testtasks", "flowtasks")
    client = Client(database_url)
    pipeline = client.enqueue("retried_twice", {})
    own = client.enqueue("retried_twice", {}, max_retries=0)
    plain = client.enqueue("always_fails", {"key": "plain"})
    for job in (pipeline, own, plain):
        wait_for_status(database_url, job.job_id, "failed")
    published = "SELECT task, max_retries FROM worker.task_limits WHERE task = ANY(%s) ORDER BY 1"
    wait_for(
        lambda: (
            query(database_url, published, (["always_fails", "retried_twice"],))
            == [("always_fails", 1), ("retried_twice", 2)]
        ),
        message="the workers' limits published",
    )

    assert retries_line(show(env, pipeline.job_id)) == "retries 2 of 2"
    assert retries_line(show(env, own.job_id)) == "retries 0 of 0"
    assert retries_line(show(env, plain.job_id)) == "retries 1 of 1"
    data = json.loads(show(env, pipeline.job_id, "--json"))
    assert (data["retry_count"], data["max_retries"], data["retry_limit"]) == (2, None, 2)


def test_show_falls_back_to_the_cli_s_default_for_a_task_no_worker_published(env, database_url):
    job = Client(database_url).enqueue("never_registered", {})
    assert retries_line(show(env, job.job_id)) == "retries 0 of 3"
    text = show({**env, "WORKER_MAX_RETRIES": "7"}, job.job_id)
    assert retries_line(text) == "retries 0 of 7"
