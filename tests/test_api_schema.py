"""The HTTP edge against its own published spec: schemathesis, every check, a real `worker api`.

Schemathesis reads `/openapi.json`, then sends generated requests (valid ones, invalid ones,
boundary values, and sequences that follow the links it infers from one answer to the next
request) and checks each answer: no 5xx, status codes, content types and bodies as the spec
says, a valid request accepted and an invalid one refused, `Allow` on a 405, the token
required where the spec says so, every SSE event as the spec describes it. The run is bounded
(a few examples per operation, a fixed seed) so it stays well under a minute.
"""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import jsonschema_rs
import pytest
from support import Processes, query
from support.api import TOKEN, publish_progress, start_api

from worker import Client
from worker.api import create_app
from worker.api.params import CURSOR_PATTERN, MAX_EVENT_ID

MAX_EXAMPLES = 4
SEED = 1
# An open stream (a job still pending) is read for this long, then schemathesis checks the
# events it got: the streams of live jobs never end on their own.
STREAM_SECONDS = 0.5
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
    # A workflow for `/workflows/{id}` to find: a batch and its callback.
    client.enqueue_many([("add", {"a": 1, "b": 1})], on_complete="add")
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
            "1",  # with more, this schemathesis version can fail on its own (a KeyError)
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
    assert {"POST /jobs", "GET /jobs/{id}/events", "POST /console/bulk", "Stateful tests"} <= tested
    assert {"GET /workflows/{id}", "POST /workflows/{id}/cancel"} <= tested
    assert len(tested) == 26, tested  # the spec's 25 operations, and the stateful sequences
    assert not [c for c in cases if c.find("failure") is not None or c.find("error") is not None]
    # The generated jobs reached the database: the run tested the API, not only its refusals.
    assert query(database_url, "SELECT count(*) FROM worker.jobs")[0][0] > 2


# -- each finding of an earlier run, pinned (whatever the seed generates) ----------------------


@pytest.fixture
def edge(database_url: str) -> Iterator[Callable[..., httpx.Response]]:
    """The app in this process on this test's database: `edge(method, path, **request)`."""
    app = create_app(database_url, TOKEN)
    loop = asyncio.new_event_loop()
    lifespan = app.router.lifespan_context(app)
    loop.run_until_complete(lifespan.__aenter__())
    http = httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app),
        base_url="http://127.0.0.1",
        headers={"Authorization": f"Bearer {TOKEN}"},
        timeout=30,
    )

    def call(method: str, path: str, **request: Any) -> httpx.Response:
        return loop.run_until_complete(http.request(method, path, **request))

    yield call
    loop.run_until_complete(http.aclose())
    loop.run_until_complete(lifespan.__aexit__(None, None, None))
    loop.close()


def validator(spec: dict[str, Any], schema: dict[str, Any]) -> Any:
    """A JSON Schema validator of `schema`, its references read in the spec's components."""
    return jsonschema_rs.validator_for({**schema, "components": spec["components"]})


def test_an_integral_float_is_an_integer_as_json_schema_says(edge, database_url):
    created = edge("POST", "/jobs", json={"task": "add", "max_retries": 3.0, "priority": 2.0})
    assert created.status_code == 201, created.text
    assert (created.json()["max_retries"], created.json()["priority"]) == (3, 2)
    stored = query(database_url, "SELECT max_retries, priority FROM worker.jobs")
    assert stored == [(3, 2)]
    for bad in (3.5, "3", True):
        refused = edge("POST", "/jobs", json={"task": "add", "max_retries": bad})
        assert refused.status_code == 422 and "max_retries" in refused.json()["error"], bad
    limited = edge("POST", "/queues/mail/limit", json={"concurrency": 2.0})
    assert limited.status_code == 200 and limited.json()["concurrency"] == 2


def test_a_405_lists_every_method_of_the_path(edge):
    for path in ("/jobs", "/console/bulk"):
        answer = edge("OPTIONS", path)
        assert answer.status_code == 405
        assert {m.strip() for m in answer.headers["allow"].split(",")} >= {"GET", "POST"}, path
        assert edge("DELETE", path).headers["allow"] == answer.headers["allow"]


def test_the_console_takes_a_since_of_the_spec_s_form_and_refuses_the_rest(edge, database_url):
    spec = edge("GET", "/openapi.json").json()
    (since,) = [
        p for p in spec["paths"]["/console/jobs"]["get"]["parameters"] if p["name"] == "since"
    ]
    assert since["schema"]["format"] == "date-time"
    failed = edge("POST", "/jobs", json={"task": "add"}).json()["id"]
    edge("POST", f"/jobs/{failed}/cancel")
    listed = edge("GET", "/console/jobs", params={"since": "2000-01-01T00:00:00Z"})
    assert listed.status_code == 200 and [j["id"] for j in listed.json()["jobs"]] == [failed]
    # Seconds since 1970 would parse as a time; the spec's date-time is not that.
    for bad in ("1700000000", "2026-12-02T12:00", ""):
        assert edge("GET", "/console/jobs", params={"since": bad}).status_code == 422, bad
    body = {"verb": "retry", "expected": 1, "filter": {"since": "2000-01-01T00:00:00Z"}}
    assert edge("POST", "/console/bulk", json=body).json()["changed"] == 1
    for bad_filter in ({"since": 1700000000}, {"since": "1700000000"}, {"q": "a\x00"}):
        refused = edge("POST", "/console/bulk", json={**body, "filter": bad_filter})
        assert refused.status_code == 422, bad_filter
    assert edge("POST", "/console/bulk", json={**body, "expected": "1"}).status_code == 422


def test_an_empty_console_choice_or_cursor_is_refused_not_read_as_the_default(edge):
    for path, params in (
        ("/console/jobs", {"tab": ""}),
        ("/console/jobs", {"cursor": ""}),
        ("/console/bulk", {"verb": ""}),
        ("/console/bulk", {}),
        ("/console/charts", {"window": ""}),
    ):
        assert edge("GET", path, params=params).status_code == 422, (path, params)
    assert edge("GET", "/console/charts").json()["window"] == "hour"
    assert edge("GET", "/console/jobs", params={"q": ""}).status_code == 200


def test_last_event_id_and_after_are_both_checked_and_bounded_as_the_spec_says(edge):
    job_id = edge("POST", "/jobs", json={"task": "add"}).json()["id"]
    events = f"/jobs/{job_id}/events"
    both = edge("GET", events, params={"after": "-1"}, headers={"Last-Event-ID": "0"})
    assert both.status_code == 422 and "after" in both.json()["error"]
    over = edge("GET", events, headers={"Last-Event-ID": str(MAX_EVENT_ID + 1)})
    assert over.status_code == 422 and "Last-Event-ID" in over.json()["error"]
    empty = edge("GET", events, params={"after": ""})
    assert empty.status_code == 422
    spec = edge("GET", "/openapi.json").json()
    (operation,) = spec["paths"]["/jobs/{id}/events"].values()
    bounds = {p["name"]: p["schema"] for p in operation["parameters"] if p["name"] != "id"}
    assert bounds["Last-Event-ID"]["maximum"] == bounds["after"]["maximum"] == MAX_EVENT_ID


def test_empty_parameters_and_cursors_not_of_the_declared_form_are_refused(edge, database_url):
    for params in ({"status": ""}, {"limit": ""}, {"cursor": ""}, {"cursor": "MjAyNg"}):
        assert edge("GET", "/jobs", params=params).status_code == 422, params
    first = edge("POST", "/jobs", json={"task": "add"}).json()
    edge("POST", "/jobs", json={"task": "add"})
    page = edge("GET", "/jobs", params={"limit": 1}).json()
    assert re.fullmatch(CURSOR_PATTERN, page["next_cursor"])
    rest = edge("GET", "/jobs", params={"cursor": page["next_cursor"]}).json()["jobs"]
    assert [job["id"] for job in rest] == [first["id"]]
    # Any cursor of the form is a place in the list: one from before any job lists none.
    early = edge("GET", "/jobs", params={"cursor": "0-" + "0" * 32})
    assert early.status_code == 200 and early.json()["jobs"] == []
    spec = edge("GET", "/openapi.json").json()
    (cursor,) = [p for p in spec["paths"]["/jobs"]["get"]["parameters"] if p["name"] == "cursor"]
    assert cursor["schema"]["pattern"] == CURSOR_PATTERN


def test_the_spec_states_what_the_database_refuses_and_the_api_refuses_it(edge):
    spec = edge("GET", "/openapi.json").json()
    schemas = spec["components"]["schemas"]
    no_nul = validator(spec, schemas["StorableJson"])
    assert not no_nul.is_valid({"a": ["ok", "n\x00l"]}) and no_nul.is_valid({"a": ["ok"]})
    assert schemas["EnqueueBody"]["properties"]["task"]["pattern"] == "^[^\x00]*$"
    job_id = edge("POST", "/jobs", json={"task": "add"}).json()["id"]
    null_body = {"content": b"null", "headers": {"Content-Type": "application/json"}}
    assert edge("POST", f"/jobs/{job_id}/resume", **null_body).status_code == 422
    assert edge("POST", "/queues/mail/limit", **null_body).status_code == 422
    nul = edge("POST", "/jobs", json={"task": "add", "payload": {"k": "a\x00b"}})
    assert nul.status_code == 422
    burst_alone = edge("POST", "/queues/mail/limit", json={"burst": 5})
    assert burst_alone.status_code == 422
    limit = schemas["LimitBody"]
    assert limit["if"]["required"] == ["burst"] and limit["then"]["required"] == ["rate"]
    assert limit["properties"]["rate"]["anyOf"][0]["minimum"] == 1e-6
    too_slow = edge("POST", "/queues/mail/limit", json={"rate": 1e-7})
    assert too_slow.status_code == 422 and "rate" in too_slow.json()["error"]
    (run_at, _) = schemas["EnqueueBody"]["properties"]["run_at"]["anyOf"]
    years = jsonschema_rs.validator_for(run_at)
    assert years.is_valid("0002-01-01T00:00:00Z") and years.is_valid("9998-12-31T00:00:00Z")
    assert not years.is_valid("0001-12-31T00:00:00Z") and not years.is_valid("9999-01-01T00:00:00Z")
    for year in ("0001", "9999"):
        late = edge("POST", "/jobs", json={"task": "add", "run_at": f"{year}-06-01T00:00:00Z"})
        assert late.status_code == 422 and "run_at" in late.json()["error"]


def test_every_event_of_a_real_stream_matches_the_event_schema_of_the_spec(edge, database_url):
    job_id = edge("POST", "/jobs", json={"task": "add"}).json()["id"]
    publish_progress(database_url, job_id, 1)
    assert edge("POST", f"/jobs/{job_id}/cancel").json()["status"] == "cancelled"
    answer = edge("GET", f"/jobs/{job_id}/events")
    assert answer.status_code == 200
    spec = edge("GET", "/openapi.json").json()
    (operation,) = spec["paths"]["/jobs/{id}/events"].values()
    event_schema = operation["responses"]["200"]["content"]["text/event-stream"]["schema"]
    stream = validator(spec, event_schema)
    kinds = []
    for block in answer.text.strip().split("\n\n")[1:]:  # after the `retry:` line
        event = dict(line.split(": ", 1) for line in block.splitlines())
        stream.validate(event)  # its id, its type, and its data as the contentSchema says
        for shape in event_schema["oneOf"]:
            if shape["properties"]["event"]["const"] == event.get("event", "message"):
                validator(spec, shape["properties"]["data"]["contentSchema"]).validate(
                    json.loads(event["data"])
                )
        kinds.append((event.get("event", "message"), json.loads(event["data"])["status"]))
    assert kinds == [("message", "progress"), ("end", "cancelled")]
