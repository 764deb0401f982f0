"""The OpenAPI 3.1 description of the HTTP edge, built from the pydantic shapes it uses.

One `Operation` per route says its answers and errors; `build_spec` turns them into the
document `GET /openapi.json` serves. What this does not do: it routes nothing and checks no
request; the routes are `worker.api.app`'s (a test checks the document names each one).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from pydantic import BaseModel

from worker.api.params import CURSOR_PATTERN, MAX_EVENT_ID, MAX_PAGE
from worker.api.schemas import (
    NO_NUL,
    STORABLE,
    STORABLE_JSON,
    STORABLE_REF,
    TIME_PATTERN,
    ActionOut,
    BulkBody,
    BulkCount,
    BulkOut,
    ChartOut,
    ConsolePage,
    EnqueueBody,
    ErrorOut,
    Health,
    JobOut,
    JobPage,
    JobViewOut,
    LimitBody,
    QueueList,
    QueueOut,
    ResumeBody,
    Stats,
    StreamEnd,
    UnservedList,
    Window,
    WorkerList,
)
from worker.api.workflows import WorkflowCancelOut, WorkflowList, WorkflowOut
from worker.db.console import BulkVerb, Tab
from worker.models import ProgressEvent
from worker.schema import STATUSES

_REF = "#/components/schemas/{model}"


@dataclass
class Operation:
    method: str
    path: str
    summary: str
    response: type[BaseModel] | str | None  # a model, or a media type for non-JSON answers
    status: int = 200
    also: dict[int, str] = field(default_factory=dict)  # other successes, with the same body
    body: type[BaseModel] | None = None
    body_required: bool = True
    parameters: list[dict[str, Any]] = field(default_factory=list)
    errors: dict[int, str] = field(default_factory=dict)
    mutates: bool = False


def _query(name: str, schema: dict[str, Any], **more: Any) -> dict[str, Any]:
    return {"name": name, "in": "query", "schema": schema, **more}


def _text(name: str) -> dict[str, Any]:
    """A text filter: an empty one filters nothing."""
    return _query(name, {"type": "string", "pattern": NO_NUL})


def _choice(name: str, kind: type[StrEnum], default: StrEnum | None = None) -> dict[str, Any]:
    """One of an enum's values; without a default, the parameter is required."""
    schema: dict[str, Any] = {"type": "string", "enum": [m.value for m in kind]}
    if default is None:
        return _query(name, schema, required=True)
    return _query(name, {**schema, "default": default.value})


_LIMIT = _query("limit", {"type": "integer", "minimum": 1, "maximum": MAX_PAGE, "default": 50})
_CURSOR = _query(
    "cursor",
    {"type": "string", "pattern": CURSOR_PATTERN},
    description="`next_cursor` of the previous page (any cursor of this form is a place in the "
    "list: the page holds the jobs created before it).",
)
# The console's filter, as `GET /console/jobs` and `GET /console/bulk` read it.
_FILTER = [
    _choice("tab", Tab, Tab.ALL),
    _query(
        "q",
        {"type": "string", "pattern": NO_NUL},
        description="Searched for in the job's id, task, payload and error, whatever the case.",
    ),
    _text("queue"),
    _text("task"),
    _query(
        "since",
        {"type": "string", "format": "date-time", "pattern": TIME_PATTERN},
        description="Jobs whose latest move (finished, else started, else created) is at or "
        "after this time.",
    ),
]


_JOB_ID = {
    "name": "id",
    "in": "path",
    "required": True,
    "schema": {"type": "string", "format": "uuid"},
}
_UNAVAILABLE = {503: "The database is unreachable (JSON error, retry later)."}


def _job_action(
    verb: str, summary: str, response: type[BaseModel], errors: dict[int, str], **more: Any
) -> Operation:
    """A `POST /jobs/{id}/<verb>`: it changes the job, and answers 503 while the database is
    unreachable."""
    return Operation(
        "post",
        f"/jobs/{{id}}/{verb}",
        summary,
        response,
        parameters=[_JOB_ID],
        errors={**errors, **_UNAVAILABLE},
        mutates=True,
        **more,
    )


_QUEUE_NAME = {
    "name": "name",
    "in": "path",
    "required": True,
    "schema": {"type": "string", "minLength": 1, "maxLength": 255, "pattern": NO_NUL},
}
_EVENT_ID = {"type": "integer", "minimum": 0, "maximum": MAX_EVENT_ID}


def _queue_action(verb: str, summary: str, **more: Any) -> Operation:
    """A `POST /queues/{name}/<verb>`: it changes the queue, answering its new state."""
    return Operation(
        "post",
        f"/queues/{{name}}/{verb}",
        summary,
        QueueOut,
        parameters=[_QUEUE_NAME],
        errors={422: "A bad queue name or limit.", **_UNAVAILABLE},
        mutates=True,
        **more,
    )


OPERATIONS = [
    Operation("get", "/", "The dashboard page", "text/html"),
    Operation(
        "get",
        "/healthz",
        "Liveness and database reachability",
        Health,
        errors={503: "The database is unreachable or has no worker schema."},
    ),
    Operation(
        "get",
        "/stats",
        "Jobs per queue and status, oldest pending age",
        Stats,
        errors=_UNAVAILABLE,
    ),
    Operation(
        "get",
        "/metrics",
        "Prometheus metrics: the queue's database series",
        "text/plain",
    ),
    Operation(
        "get",
        "/jobs",
        "List jobs, newest first (keyset-paginated)",
        JobPage,
        parameters=[
            {"name": "status", "in": "query", "schema": {"type": "string", "enum": list(STATUSES)}},
            _text("queue"),
            _text("task"),
            _LIMIT,
            _CURSOR,
        ],
        errors={422: "A bad filter, limit or cursor.", **_UNAVAILABLE},
    ),
    Operation(
        "post",
        "/jobs",
        "Enqueue a job",
        JobOut,
        status=201,
        also={200: "A live job holds the unique key: that job, with `duplicate` true."},
        body=EnqueueBody,
        errors={422: "The body is not a valid job (the reason is given).", **_UNAVAILABLE},
        mutates=True,
    ),
    Operation(
        "get",
        "/jobs/{id}",
        "One job with its stages, outputs, result and error",
        JobOut,
        parameters=[_JOB_ID],
        errors={404: "No such job.", **_UNAVAILABLE},
    ),
    Operation(
        "get",
        "/jobs/{id}/events",
        "The job's progress events as Server-Sent Events: past ones, then live, until it ends",
        "text/event-stream",
        parameters=[
            _JOB_ID,
            {
                "name": "Last-Event-ID",
                "in": "header",
                "description": "Resume after this event id (sent by EventSource on reconnect).",
                "schema": _EVENT_ID,
            },
            {
                "name": "after",
                "in": "query",
                "description": "Like Last-Event-ID, for clients that cannot set headers; when "
                "both are sent, both must be valid and Last-Event-ID counts.",
                "schema": _EVENT_ID,
            },
        ],
        errors={404: "No such job.", 422: "A bad Last-Event-ID or after.", **_UNAVAILABLE},
    ),
    _job_action(
        "cancel",
        "Cancel a job (at once if it has not started, else at its next stage boundary)",
        ActionOut,
        {404: "No such job.", 409: "The job already finished."},
    ),
    _job_action(
        "resume",
        "Answer a paused job's question; it runs again",
        JobOut,
        {404: "No such job.", 409: "The job is not paused.", 422: "A bad body."},
        body=ResumeBody,
        body_required=False,
    ),
    _job_action(
        "retry",
        "Run a failed or cancelled job again, from its first unfinished stage",
        JobOut,
        {404: "No such job.", 409: "The job is not failed or cancelled."},
    ),
    Operation(
        "get",
        "/queues",
        "Each queue with live jobs or controls: paused or not, its limits, its depth",
        QueueList,
        errors=_UNAVAILABLE,
    ),
    _queue_action("pause", "Stop claims from the queue on every worker; running jobs finish"),
    _queue_action("resume", "Let every worker claim from the queue again"),
    _queue_action(
        "limit",
        "Set the queue's concurrency (across workers) and rate limits; those left out are lifted",
        body=LimitBody,
        body_required=False,
    ),
    Operation(
        "get",
        "/workflows",
        "Workflows, newest first, each with its jobs counted by status",
        WorkflowList,
        parameters=[_LIMIT],
        errors={422: "A bad limit.", **_UNAVAILABLE},
    ),
    Operation(
        "get",
        "/workflows/{id}",
        "One workflow with its jobs and the edges between them",
        WorkflowOut,
        parameters=[_JOB_ID],
        errors={404: "No such workflow.", **_UNAVAILABLE},
    ),
    Operation(
        "post",
        "/workflows/{id}/cancel",
        "Cancel a workflow's jobs not ended, but those its parents' outcomes settle",
        WorkflowCancelOut,
        parameters=[_JOB_ID],
        errors={404: "No such workflow.", **_UNAVAILABLE},
        mutates=True,
    ),
    Operation(
        "get",
        "/console/jobs",
        "The console's list: a tab's jobs under a search, newest first, and each tab's count",
        ConsolePage,
        parameters=[*_FILTER, _LIMIT, _CURSOR],
        errors={422: "A bad tab, search, time, limit or cursor.", **_UNAVAILABLE},
    ),
    Operation(
        "get",
        "/console/jobs/{id}",
        "The worker holding a job, and its task's stages if a worker published them",
        JobViewOut,
        parameters=[_JOB_ID],
        errors={404: "No such job.", **_UNAVAILABLE},
    ),
    Operation(
        "get",
        "/console/bulk",
        "How many jobs of the filter a bulk verb would change",
        BulkCount,
        parameters=[_choice("verb", BulkVerb), *_FILTER],
        errors={422: "A bad verb or filter.", **_UNAVAILABLE},
    ),
    Operation(
        "post",
        "/console/bulk",
        "Retry or cancel each job of the filter, once the count matched is the one confirmed",
        BulkOut,
        body=BulkBody,
        errors={
            409: "The filter now matches more jobs than `expected`: nothing was changed.",
            422: "A bad verb, filter or count.",
            **_UNAVAILABLE,
        },
        mutates=True,
    ),
    Operation(
        "get",
        "/console/workers",
        "Each registered worker, its heartbeat's age and the jobs it holds",
        WorkerList,
        errors=_UNAVAILABLE,
    ),
    Operation(
        "get",
        "/console/unserved",
        "Pending jobs whose task no live worker of their queue registered, per queue and task",
        UnservedList,
        errors=_UNAVAILABLE,
    ),
    Operation(
        "get",
        "/console/charts",
        "Outcomes per bucket of the window, and each queue's depth, from the workers' rollup",
        ChartOut,
        parameters=[_choice("window", Window, Window.HOUR), _text("queue"), _text("task")],
        errors={422: "A bad window or filter.", **_UNAVAILABLE},
    ),
]


def _linked(schema: Any) -> Any:
    """`schema` with each `STORABLE` mark made a reference to the `StorableJson` component."""
    if schema == STORABLE:
        return {"$ref": STORABLE_REF}
    if isinstance(schema, dict):
        return {key: _linked(value) for key, value in schema.items()}
    if isinstance(schema, list):
        return [_linked(item) for item in schema]
    return schema


def _schema(model: type[BaseModel], components: dict[str, Any], mode: str) -> dict[str, Any]:
    schema = _linked(model.model_json_schema(ref_template=_REF, mode=mode))  # type: ignore[arg-type]
    components.update(schema.pop("$defs", {}))
    components[model.__name__] = schema
    return {"$ref": _REF.format(model=model.__name__)}


def _event_stream(components: dict[str, Any]) -> dict[str, Any]:
    """The SSE answer. OpenAPI 3.1 has no item schema for a stream, so `schema` describes one
    event (as OpenAPI 3.2 does for `text/event-stream` without `itemSchema`): its `id`, its
    `event` type and its `data`, whose JSON `contentSchema` gives."""
    progress = _schema(ProgressEvent, components, "serialization")
    end = _schema(StreamEnd, components, "serialization")

    def data(schema: dict[str, Any]) -> dict[str, Any]:
        return {"type": "string", "contentMediaType": "application/json", "contentSchema": schema}

    return {
        "schema": {
            "description": "One event of the stream (after a `retry:` line): each progress "
            "event with its bus id, oldest first; comment lines (`: keepalive`) while idle; "
            "last, once the job has ended, an `end` event without an id, after which the "
            "client should not reconnect.",
            "oneOf": [
                {
                    "type": "object",
                    "required": ["id", "data"],
                    "properties": {
                        "event": {"const": "message"},
                        "id": {"type": "string", "pattern": "^[0-9]{1,19}$"},
                        "data": data(progress),
                    },
                },
                {
                    "type": "object",
                    "required": ["event", "data"],
                    "properties": {"event": {"const": "end"}, "data": data(end)},
                },
            ],
        }
    }


def _operation_id(op: Operation) -> str:
    name = op.path.strip("/").replace("/", "_").replace("{", "").replace("}", "")
    return f"{op.method}_{name or 'dashboard'}"


def build_spec(version: str) -> dict[str, Any]:
    """The spec served at `/openapi.json`."""
    components: dict[str, Any] = {"StorableJson": STORABLE_JSON}
    error_ref = _schema(ErrorOut, components, "serialization")
    paths: dict[str, dict[str, Any]] = {}
    for op in OPERATIONS:
        if op.response is None:
            content: dict[str, Any] = {}
        elif op.response == "text/event-stream":
            content = {op.response: _event_stream(components)}
        elif isinstance(op.response, str):
            content = {op.response: {"schema": {"type": "string"}}}
        else:
            content = {
                "application/json": {"schema": _schema(op.response, components, "serialization")}
            }
        responses: dict[str, Any] = {str(op.status): {"description": "OK", "content": content}}
        for code, text in op.also.items():
            responses[str(code)] = {"description": text, "content": content}
        errors = dict(op.errors)
        if op.mutates:
            errors[401] = "No bearer token given (WORKER_API_TOKEN is set)."
            errors[403] = (
                "Wrong bearer token; without a token, a request not addressed to a loopback "
                "host or from another site's page; or a database role that may not change jobs."
            )
            errors[413] = "The body is over twice WORKER_MAX_PAYLOAD_BYTES."
            errors[415] = "A body that is not sent as application/json."
            errors.setdefault(422, "A value the database refuses.")
        for code, text in sorted(errors.items()):
            responses[str(code)] = {
                "description": text,
                "content": {"application/json": {"schema": error_ref}},
            }
        operation: dict[str, Any] = {
            "summary": op.summary,
            "operationId": _operation_id(op),
            "responses": responses,
        }
        if op.parameters:
            operation["parameters"] = op.parameters
        if op.body is not None:
            operation["requestBody"] = {
                "required": op.body_required,
                "content": {
                    "application/json": {"schema": _schema(op.body, components, "validation")}
                },
            }
        if op.mutates:
            operation["security"] = [{"bearer": []}]
        paths.setdefault(op.path, {})[op.method] = operation
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "durable-worker",
            "version": version,
            "description": "Jobs on a PostgreSQL queue: enqueue, inspect, cancel, resume, retry, "
            "and follow a job's progress live.",
        },
        "paths": paths,
        "components": {
            "schemas": components,
            "securitySchemes": {
                "bearer": {
                    "type": "http",
                    "scheme": "bearer",
                    "description": "The value of WORKER_API_TOKEN.",
                }
            },
        },
    }
