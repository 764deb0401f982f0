"""OpenTelemetry: a job enqueued inside a span runs as one trace, from that span to the attempt's
span to each stage's, whichever enqueue path wrote it; without OpenTelemetry nothing changes.

The worker runs in this process (`drain`), so its spans reach the same in-memory exporter as
the test's own; one test runs a real `worker run` process exporting to a file.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from datetime import UTC, datetime
from typing import Any

import psycopg
import pytest
from opentelemetry import trace
from opentelemetry.trace import StatusCode
from support import Processes, query, wait_for
from support.tracing import by_name, parent_of, recording

from worker import Client, JobSpec, Pipeline, task
from worker.testing import drain

order = Pipeline("traced_order")


@order.stage
def traced_reserve(ctx: Any) -> dict[str, int]:
    return {"reserved": 1}


@order.stage
def traced_charge(ctx: Any) -> str:
    if ctx.payload.get("fail"):
        raise ValueError("card declined")
    return "charged"


@order.cleanup
def traced_tidy(ctx: Any) -> None:
    return None


@task(name="traced_plain")
def traced_plain(payload: dict[str, Any]) -> int:
    # A span the task makes itself is a child of the attempt's.
    with trace.get_tracer("tests").start_as_current_span("inside the task"):
        return 1


@task(name="traced_async")
async def traced_async(payload: dict[str, Any]) -> int:
    with trace.get_tracer("tests").start_as_current_span("inside the task"):
        return 2


@pytest.fixture
def spans():
    with recording() as exporter:
        yield exporter


def stored_trace(url: str, job_id: str) -> Any:
    return query(url, "SELECT trace_context FROM worker.jobs WHERE id = %s", (job_id,))[0][0]


def test_job_enqueued_in_a_span_runs_as_one_trace_from_that_span_to_each_stage(database_url, spans):
    client = Client(database_url)
    with trace.get_tracer("tests").start_as_current_span("POST /orders") as request:
        job = client.enqueue("traced_order", {"order": 7}, queue="default")
    client.close()
    assert stored_trace(database_url, job.job_id)["traceparent"].startswith("00-")

    (done,) = drain(url=database_url)
    assert done.status == "completed"
    found = by_name(spans.get_finished_spans())
    assert set(found) == {
        "POST /orders",
        "run traced_order",
        "stage traced_reserve",
        "stage traced_charge",
        "stage traced_tidy",
    }
    assert {s.context.trace_id for s in found.values()} == {request.get_span_context().trace_id}
    attempt = found["run traced_order"]
    assert parent_of(attempt) == request.get_span_context().span_id
    for stage in ("traced_reserve", "traced_charge", "traced_tidy"):
        assert parent_of(found[f"stage {stage}"]) == attempt.context.span_id
        assert found[f"stage {stage}"].attributes["worker.stage"] == stage
    assert dict(attempt.attributes or {}) == {
        "worker.job.id": job.job_id,
        "worker.job.task": "traced_order",
        "worker.job.queue": "default",
        "worker.job.attempt": 1,
        "worker.job.outcome": "completed",
    }
    assert attempt.kind == trace.SpanKind.CONSUMER


def test_failing_stage_marks_its_span_and_the_attempt_as_errors(database_url, spans):
    client = Client(database_url)
    with trace.get_tracer("tests").start_as_current_span("request"):
        client.enqueue("traced_order", {"fail": True}, max_retries=0)
    client.close()
    (done,) = drain(url=database_url)
    assert done.status == "failed"
    found = by_name(spans.get_finished_spans())
    charge = found["stage traced_charge"]
    assert charge.status.status_code == StatusCode.ERROR
    assert charge.status.description == "ValueError: card declined"
    assert [e.name for e in charge.events] == ["exception"]
    assert found["stage traced_reserve"].status.status_code == StatusCode.UNSET
    assert found["run traced_order"].status.status_code == StatusCode.ERROR
    assert found["run traced_order"].attributes["worker.job.outcome"] == "failed"


def test_every_enqueue_path_stores_the_trace_its_jobs_continue(database_url, spans):
    client = Client(database_url)
    with trace.get_tracer("tests").start_as_current_span("batch") as batch:
        one = client.enqueue("traced_plain", {})
        unique = client.enqueue("traced_plain", {}, unique_key="u")
        copied = client.enqueue_many([("traced_plain", {}) for _ in range(2)])  # by COPY
        # A due time COPY cannot write, then unique keys: the batch INSERTs.
        inserted = client.enqueue_many([JobSpec("traced_plain", run_at=datetime.now(UTC))])
        keyed = client.enqueue_many([JobSpec("traced_plain", unique_key="b1")])
        coroutine = client.enqueue("traced_async", {})
        with psycopg.connect(database_url) as conn:  # in the caller's transaction
            joined = client.enqueue("traced_plain", {}, connection=conn)
            joined_many = client.enqueue_many([("traced_async", {})], connection=conn)
            conn.commit()
    client.close()
    jobs = [one, unique, *copied, *inserted, *keyed, coroutine, joined, *joined_many]
    trace_id = f"{batch.get_span_context().trace_id:032x}"
    for job in jobs:
        assert trace_id in stored_trace(database_url, job.job_id)["traceparent"]

    drain(url=database_url)
    finished = spans.get_finished_spans()
    attempts = [s for s in finished if s.name in ("run traced_plain", "run traced_async")]
    assert len(attempts) == len(jobs)
    assert {s.instrumentation_scope.name for s in attempts} == {"durable-worker"}
    assert {parent_of(s) for s in attempts} == {batch.get_span_context().span_id}
    inner = [s for s in finished if s.name == "inside the task"]
    assert {parent_of(s) for s in inner} == {s.context.span_id for s in attempts}


def test_sql_function_takes_the_trace_context_its_job_continues(database_url, spans):
    parent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    (row,) = query(
        database_url,
        "SELECT worker.enqueue('traced_plain', '{}', trace_context => %s)::text",
        (json.dumps({"traceparent": parent}),),
    )
    (done,) = drain(url=database_url)
    assert done.job_id == row[0]
    (attempt,) = [s for s in spans.get_finished_spans() if s.name == "run traced_plain"]
    assert attempt.context.trace_id == 0x0AF7651916CD43DD8448EB211C80319C
    assert parent_of(attempt) == 0xB7AD6B7169203331


def test_job_enqueued_outside_any_span_starts_a_trace_of_its_own(database_url, spans):
    client = Client(database_url)
    job = client.enqueue("traced_plain", {})
    client.close()
    assert stored_trace(database_url, job.job_id) is None
    drain(url=database_url)
    (attempt,) = [s for s in spans.get_finished_spans() if s.name == "run traced_plain"]
    assert attempt.parent is None


def test_without_opentelemetry_nothing_is_imported_and_no_trace_is_stored(database_url):
    """A process where `opentelemetry` cannot be imported enqueues and runs jobs as before."""
    program = textwrap.dedent(
        f"""
        import sys
        sys.modules["opentelemetry"] = None  # as if the otel extra were not installed
        from worker import Client, task, tracing
        from worker.testing import drain

        @task(name="untraced")
        def untraced(payload):
            return 2

        client = Client({database_url!r})
        client.enqueue("untraced", {{}})
        client.enqueue_many([("untraced", {{}})] * 2)
        jobs = drain(url={database_url!r})
        loaded = [m for m, v in sys.modules.items() if m.startswith("opentelemetry") and v]
        print(tracing.ENABLED, [str(j.status) for j in jobs], loaded)
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, timeout=120, check=True
    )
    assert out.stdout.split("\n")[0] == "False ['completed', 'completed', 'completed'] []"
    assert query(database_url, "SELECT count(*) FROM worker.jobs WHERE trace_context IS NULL") == [
        (3,)
    ]


def test_with_no_tracer_provider_only_jobs_enqueued_in_a_trace_get_a_span_and_pass_it_on(
    database_url,
):
    """OpenTelemetry installed, no provider set: an attempt at a job enqueued outside any trace
    makes no span (nothing would see it), and one enqueued inside a trace still runs in it, so
    the jobs it enqueues carry that trace on."""
    program = textwrap.dedent(
        f"""
        from opentelemetry import trace
        from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags
        from worker import Client, task, tracing
        from worker.models import ClaimedJob
        from worker.testing import drain

        client = Client({database_url!r})

        @task(name="relay")
        def relay(payload):
            if payload["relay"]:
                client.enqueue("relay", {{"relay": False}})
            return trace.get_current_span().get_span_context().is_valid

        parent = SpanContext(0xABC, 0xDEF, is_remote=False, trace_flags=TraceFlags(1))
        with trace.use_span(NonRecordingSpan(parent)):
            client.enqueue("relay", {{"relay": True}})
        client.enqueue("relay", {{"relay": False}})
        drain(url={database_url!r})
        plain = ClaimedJob("id", "relay", {{}}, "default", 0, 0, 3, False, None, None, None)
        print(tracing.attempt_span(plain) is tracing._NO_SPAN)
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, timeout=120, check=True
    )
    assert out.stdout.split("\n")[0] == "True"
    rows = query(
        database_url, "SELECT trace_context->>'traceparent', result FROM worker.jobs", None
    )
    traced = f"00-{0xABC:032x}-"
    assert sorted((bool(tp and tp.startswith(traced)), result) for tp, result in rows) == [
        (False, False),  # outside any trace: no span while it ran
        (True, True),  # enqueued in the trace: ran in it
        (True, True),  # enqueued by that run: carries the trace on
    ]


TRACED_TASKS = '''
"""A task module whose process exports its spans, as JSON lines, to $TRACE_FILE."""
import os

from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExportResult


class ToFile:
    def export(self, spans):
        with open(os.environ["TRACE_FILE"], "a") as out:
            for span in spans:
                out.write(span.to_json(indent=None) + "\\n")
        return SpanExportResult.SUCCESS

    def shutdown(self):
        pass

    def force_flush(self, timeout_millis=0):
        return True


provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(ToFile()))
trace.set_tracer_provider(provider)

from worker import Pipeline

ship = Pipeline("ship_traced")


@ship.stage
def pack(ctx):
    return 1


@ship.stage
def send(ctx):
    return 2
'''


def test_worker_process_continues_the_trace_of_a_job_enqueued_in_a_span(
    database_url, env, processes: Processes, tmp_path, spans
):
    (tmp_path / "shiptasks.py").write_text(TRACED_TASKS)
    trace_file = tmp_path / "spans.jsonl"
    env = {
        **env,
        "TRACE_FILE": str(trace_file),
        "PYTHONPATH": f"{tmp_path}:{env.get('PYTHONPATH', '')}",
    }
    processes.worker(env, "shiptasks")
    client = Client(database_url)
    with trace.get_tracer("tests").start_as_current_span("POST /ship") as request:
        job = client.enqueue("ship_traced", {})
    assert job.wait_sync(timeout=30) == 2
    client.close()

    def exported() -> dict[str, Any] | None:
        lines = trace_file.read_text().splitlines() if trace_file.exists() else []
        found = {s["name"]: s for s in map(json.loads, lines)}
        return found if len(found) == 3 else None

    found = wait_for(exported, timeout=10)
    assert set(found) == {"run ship_traced", "stage pack", "stage send"}
    request_ctx = request.get_span_context()
    attempt = found["run ship_traced"]
    assert attempt["parent_id"] == f"0x{request_ctx.span_id:016x}"
    assert {s["context"]["trace_id"] for s in found.values()} == {f"0x{request_ctx.trace_id:032x}"}
    for stage in ("pack", "send"):
        assert found[f"stage {stage}"]["parent_id"] == attempt["context"]["span_id"]
    assert attempt["attributes"]["worker.job.id"] == job.job_id
