"""Children spawned by a running job: what `ctx.spawn` and `ctx.spawn_many` write.

    @pipeline.stage
    def split(ctx):
        ctx.spawn_many(resize, {path: {"path": path} for path in ctx.payload["paths"]})
        ctx.wait_for_children()

Each child's id is made from its spawner's id and its key (a UUID version 5 in the spawner's
id), so spawning a key again, as a stage retried after its worker was lost does, finds the child
spawned before: nothing is written, and the handle returned is that child's (`duplicate` true),
whatever payload was given the second time. The children join the spawner's workflow (one named
for the spawner is made if it has none), and the spawner waits on them as a held job waits on its
parents (`worker.spawn()`, migration 0017). All the children of one call are written by one
statement.

What it does not do: spawn again a child whose row retention has deleted (the key is free
then), or spawn from outside a running job.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any, Protocol
from uuid import UUID, uuid5

from worker import tracing
from worker.client import Client, InvalidJob, Job, JobSpec, default_client
from worker.client.job import new_job
from worker.client.validation import Batch, validated
from worker.db import sql
from worker.encoding import dumps

MAX_KEY = 100  # a child's node name is its spawner's and its key: both fit the node's bound


class Spec(Protocol):
    """A task's handle, as a spawn reads it (`worker.tasks.Task`): its payload checked and
    its options completed by `spec`."""

    def spec(self, payload: Any = None, **options: Any) -> JobSpec: ...


_clients: dict[str, Client] = {}
_clients_lock = threading.Lock()


def child_id(spawner: str, key: str) -> str:
    """The id of the child `spawner` spawns with `key`: the same on every attempt.

    >>> child_id("0193a7c0-0000-7000-8000-000000000000", "chunk-1")
    '3f804bd6-2e7a-51d0-85e7-ed6c42dcd587'
    """
    return str(uuid5(UUID(spawner), key))


def _client(url: str | None) -> Client:
    """The client of the database the job runs from: its worker's, else the default one."""
    if url is None:
        return default_client()
    with _clients_lock:
        if url not in _clients:
            _clients[url] = Client(url)
        return _clients[url]


def _key_problem(key: object) -> str | None:
    if not isinstance(key, str) or not 1 <= len(key) <= MAX_KEY or "\x00" in key:
        return (
            f"spawn key {str(key)[:40]!r}: must be a string of 1 to {MAX_KEY} characters, "
            "with no NUL"
        )
    return None


def spawn_many(
    url: str | None,
    spawner: str,
    task: Spec | str,
    payloads: Mapping[str, Any],
    options: dict[str, Any],
) -> list[Job]:
    """Spawn children of the job `spawner` on the database at `url` (None: the default
    client's): one of `task` per key of `payloads`, in one statement; each child's handle, in
    the order of `payloads`. `InvalidJob` before anything is written for a bad key, payload
    or option."""
    if "unique_key" in options or "connection" in options:
        given = "unique_key" if "unique_key" in options else "connection"
        raise InvalidJob(f"{given} is not an option of a spawned job: its key makes it unique")
    if not isinstance(payloads, Mapping):
        raise InvalidJob(
            f"spawn_many takes payloads by key, a mapping, not {type(payloads).__name__}"
        )
    specs: list[JobSpec] = []
    for key, payload in payloads.items():
        problem = _key_problem(key)
        if problem:
            raise InvalidJob(problem)
        if isinstance(task, str):
            specs.append(JobSpec(task, {} if payload is None else payload, **options))
        else:
            specs.append(task.spec(payload, **options))
    if not specs:
        return []
    client = _client(url)
    rows = [validated(spec, client.max_payload_bytes) for spec in specs]
    ids = [child_id(spawner, key) for key in payloads]
    params = {
        "spawner": spawner,
        "jobs": Batch(specs, ids, rows).params()["jobs"],
        "children": dumps(
            [{"i": i, "k": k, "o": n} for n, (i, k) in enumerate(zip(ids, payloads, strict=True))]
        ),
        "trace_context": tracing.carrier(),
    }
    statement = sql.SPAWN  # idempotent by each child's id: safe to run again
    created = {
        str(r[0]): bool(r[1]) for r in client._db.insert(statement, statement, params, None, True)
    }
    return [
        new_job(i, spec, client, duplicate=not created.get(i, False))
        for i, spec in zip(ids, specs, strict=True)
    ]
