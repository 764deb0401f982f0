"""The HTTP edge against its own published spec: schemathesis, every check, a real `worker api`.

Schemathesis reads `/openapi.json`, then sends generated requests (valid ones, invalid ones,
boundary values, and sequences that follow the links it infers from one answer to the next
request) and checks each answer: no 5xx, status codes, content types and bodies as the spec
says, a valid request accepted and an invalid one refused, `Allow` on a 405, the token
required where the spec says so, every SSE event as the spec describes it. The run is bounded
(a few examples per operation, a fixed seed) so it stays well under a minute.
"""

from __future__ import annotations

import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

from support import Processes, query
from support.api import start_api

from worker import Client

MAX_EXAMPLES = 6
SEED = 1
# An open stream (a job still pending) is read for this long, then schemathesis checks the
# events it got: the streams of live jobs never end on their own.
STREAM_SECONDS = 1.0
CONFIG = f"""
[[operations]]
include-path = "/jobs/{{id}}/events"
request-timeout = {STREAM_SECONDS}
"""


def test_schemathesis_with_every_check_finds_nothing_wrong_with_the_published_spec(
    env, database_url, processes: Processes, tmp_path: Path
):
    api = start_api(env, processes)
    # Jobs for the stateful phase and the stream checks to find: one pending, one finished.
    client = Client(database_url)
    client.enqueue("add", {"a": 1, "b": 2})
    client.cancel(client.enqueue("add", {"a": 2, "b": 3}).job_id)
    config = tmp_path / "schemathesis.toml"
    config.write_text(CONFIG)
    reports = tmp_path / "reports"
    run = subprocess.run(
        [
            sys.executable,
            "-c",
            "from schemathesis.cli import schemathesis; schemathesis()",
            "--config-file",
            str(config),
            "run",
            f"{api.base}/openapi.json",
            "--checks",
            "all",
            "--header",
            f"Authorization: Bearer {api.token}",
            "--max-examples",
            str(MAX_EXAMPLES),
            "--seed",
            str(SEED),
            "--workers",
            "1",
            "--request-timeout",
            "20",
            "--wait-for-schema",
            "30",
            "--report",
            "junit",
            "--report-dir",
            str(reports),
            "--no-color",
        ],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=tmp_path,
    )
    assert run.returncode == 0, f"{run.stdout}\n{run.stderr}\n--- api log ---\n{api.log()}"
    (report,) = reports.glob("junit-*.xml")
    cases = list(ET.parse(report).iter("testcase"))
    tested = {case.get("name") for case in cases}
    # Every operation of the spec was exercised, and the stateful sequences as well.
    assert {"POST /jobs", "GET /jobs/{id}/events", "Stateful tests"} <= tested, tested
    assert len(tested) == 16, tested  # the spec's 15 operations, and the stateful sequences
    assert not [c for c in cases if c.find("failure") is not None or c.find("error") is not None]
    # The generated jobs reached the database: the run tested the API, not only its refusals.
    assert query(database_url, "SELECT count(*) FROM worker.jobs")[0][0] > 2
