"""Row factories: the rows a test needs in place before it starts a worker.

Each writes a row the way the product would leave it: a job in a given status, a pipeline's
stage rows, a worker that stopped beating with jobs still claimed.

Values are query parameters. A text that starts with `sql:` is an SQL expression written into
the statement as it is, for times on the server's clock: `finished_at="sql:now() - interval
'2 hours'"`. Columns not given keep the table's defaults, so a factory row is as close to an
enqueued one as the test allows.

What this does not do: it does not enqueue through the product (tests of enqueueing use
`Client`), and it checks nothing; the tests assert.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping

from support.db import query

SQL = "sql:"


def _insert(url: str, table: str, columns: Mapping[str, object], returning: str) -> str:
    """One row of `table` with `columns`; the text of its `returning` column."""
    marks: list[str] = []
    params: list[object] = []
    for value in columns.values():
        if isinstance(value, str) and value.startswith(SQL):
            marks.append(value[len(SQL) :])
        else:
            marks.append("%s")
            params.append(value)
    names = ", ".join(columns)
    statement = (
        f"INSERT INTO {table} ({names}) VALUES ({', '.join(marks)}) RETURNING {returning}::text"
    )
    return str(query(url, statement, params or None)[0][0])


def ago(interval: str | None) -> str | None:
    """That long before the server's now (an interval such as '10 days'); None stays NULL."""
    return None if interval is None else f"{SQL}now() - interval '{interval}'"


def insert_job(url: str, task: str = "add", payload: str | None = None, **columns: object) -> str:
    """One job row of `task` with this JSON `payload` (the table's `{}` if None) and these
    columns; its id."""
    row = {"task": task, **({} if payload is None else {"payload": payload}), **columns}
    return _insert(url, "worker.jobs", row, "id")


def insert_stage(
    url: str,
    job_id: str,
    stage: str,
    status: str = "completed",
    attempt: int = 1,
    **columns: object,
) -> None:
    """One stage row of a pipeline job (`kind`, `output`, `error`... as given)."""
    row = {"job_id": job_id, "stage": stage, "status": status, "attempt": attempt, **columns}
    _insert(url, "worker.job_stages", row, "job_id")


def insert_worker(
    url: str,
    heartbeat_age: str = "0 seconds",
    hostname: str = "host",
    pid: int = 1,
    concurrency: int = 4,
    worker_id: str | None = None,
    queues: tuple[str, ...] = ("default",),
    tasks: tuple[str, ...] | None = None,
    lease_seconds: float = 15.0,
) -> str:
    """A worker registration that last beat `heartbeat_age` ago (an interval); its id. `tasks`
    None: a worker of a release that did not record them."""
    row = {
        "id": worker_id or str(uuid.uuid4()),
        "hostname": hostname,
        "pid": pid,
        "queues": list(queues),
        "concurrency": concurrency,
        "heartbeat_at": ago(heartbeat_age),
        "tasks": None if tasks is None else list(tasks),
        "lease_seconds": lease_seconds,
    }
    return _insert(url, "worker.workers", row, "id")


def dead_worker_with_orphans(
    url: str, *jobs: Mapping[str, object], heartbeat_age: str = "1 hour", **worker: object
) -> tuple[str, list[str]]:
    """A worker that stopped beating `heartbeat_age` ago, holding these jobs as `processing`
    (each a mapping of job columns); its id and the jobs' ids, for a rescue to find."""
    worker_id = insert_worker(url, heartbeat_age=heartbeat_age, **worker)  # type: ignore[arg-type]
    orphans = [
        insert_job(
            url,
            **{"status": "processing", "worker_id": worker_id, "started_at": "sql:now()", **job},
        )
        for job in jobs
    ]
    return worker_id, orphans


def claim_params(worker_id: object, tasks: list[str], **given: object) -> dict[str, object]:
    """The parameters of `sql.CLAIM` and `sql.CLAIM_ONE_QUEUE` for a worker of the default
    queue that registered `tasks`, with no pipeline, retry limit or concurrency key of its own;
    `given` overrides."""
    return {
        "worker_id": worker_id,
        "queues": ["default"],
        "tasks": tasks,
        "limit": 5,
        "default_max_retries": 3,
        "running": [],
        "pipelines": [],
        "first_stages": [],
        "retry_tasks": [],
        "retry_limits": [],
        "key_tasks": [],
        "key_limits": [],
        **given,
    }
