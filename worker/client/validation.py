"""Every check a job passes before anything is written, and the rows a batch is sent as.

`validated` turns one `JobSpec` into the parameters of `sql.ENQUEUE`, or refuses it with
`InvalidJob` naming the problem; `prepared_many` does so for a whole batch (naming the bad
job's index) and gives it its ids; `Batch` writes the batch as the JSON of `sql.ENQUEUE_MANY`
or the COPY text of `sql.ENQUEUE_MANY_COPY`. The bounds are those of the columns, so that
what passes here is what PostgreSQL stores and Python reads back. Nothing here does I/O.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Container, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import UUID

from worker.client.errors import InvalidJob, JobNotFound
from worker.encoding import NotStorable, dumps
from worker.ids import job_id_text, new_job_ids
from worker.models import JSON, TERMINAL_STATUSES, JobStatus
from worker.schema import MAX_TASK_NAME, PRIORITY_RANGE

# What the columns hold: `max_retries` is a 4-byte integer, and a time a job is due must be
# one Python can read back (years 1 to 9999), or every listing that shows the job fails.
MAX_RETRIES_LIMIT = 2**31 - 1
MAX_DELAY = timedelta(days=365 * 100)
RUN_AT_YEARS = (2, 9998)  # in UTC


@dataclass
class JobSpec:
    """One job to enqueue (used by `enqueue_many`).

    >>> JobSpec("send_email", {"to": "ada@example.com"}, queue="emails", delay=60)
    JobSpec(task='send_email', payload={'to': 'ada@example.com'}, queue='emails', priority=0, \
delay=60, run_at=None, max_retries=None, unique_key=None, concurrency_key=None)
    """

    task: str
    payload: dict[str, JSON] = field(default_factory=dict)
    queue: str = "default"
    priority: int = 0
    delay: float | timedelta = 0.0
    run_at: datetime | None = None
    max_retries: int | None = None
    # While a pending, processing or paused job holds this key, enqueueing another returns it.
    unique_key: str | None = None
    # Jobs sharing this key run at most their task's `concurrency` at once, across workers.
    concurrency_key: str | None = None


# Tries of an enqueue with a unique key: each finds the job holding the key, unless that job
# committed too late to be seen, or ended, meanwhile.
UNIQUE_TRIES = 5


def unsettled_key(key: str) -> RuntimeError:
    """The error of an enqueue whose unique key's holder kept changing under it."""
    return RuntimeError(f"the job holding unique key {key!r} kept changing; try the enqueue again")


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def text_problem(value: str) -> str | None:
    """Why PostgreSQL would not store `value` as given (text holds neither NUL nor half a
    surrogate pair), or None. The API's request checks call it too."""
    if "\x00" in value:
        return "must not contain a NUL character (\\u0000)"
    try:
        value.encode()
    except UnicodeEncodeError:
        return "must not contain half of a UTF-16 surrogate pair"
    return None


def run_at_problem(run_at: datetime) -> str | None:
    """Why a due time could not be read back (outside `RUN_AT_YEARS` in UTC), or None."""
    low, high = RUN_AT_YEARS
    try:
        year = run_at.astimezone(UTC).year
    except OverflowError:  # year 1 east of UTC, or 9999 west of it, is outside Python's range
        year = 0
    return None if low <= year <= high else f"must fall between the years {low} and {high}"


def _bad_name(value: object, longest: int) -> bool:
    if not isinstance(value, str) or not 1 <= len(value) <= longest:
        return True
    return text_problem(value) is not None


# Task and queue names that passed `_bad_name`: a process enqueues a few of them over and over,
# so each is checked once. Bounded, for a process that makes up names as it goes.
_GOOD_NAMES: set[str] = set()
_GOOD_NAMES_KEPT = 1024

# Rows per message of a batch sent by COPY: the server writes one message's rows while the
# client makes the next, instead of waiting for the whole batch's text.
COPY_CHUNK = 200


def _bad_task_or_queue(value: object, longest: int) -> bool:
    if type(value) is str and value in _GOOD_NAMES and len(value) <= longest:
        return False
    if _bad_name(value, longest):
        return True
    if len(_GOOD_NAMES) < _GOOD_NAMES_KEPT:
        _GOOD_NAMES.add(value)  # type: ignore[arg-type]  # a str: _bad_name checked it
    return False


def job_id_of(value: str | UUID) -> str:
    """The id as text; a malformed one names no job (`JobNotFound`), as an unknown one does."""
    text_ = job_id_text(value)
    if text_ is None:
        raise JobNotFound(f"no job {value!r}: not a job id")
    return text_


def stored_json(value: JSON, what: str, max_bytes: int, hint: str = "") -> str:
    """`value` as the JSON text stored, or `InvalidJob` naming `what` is wrong with it: not
    storable, or over `max_bytes` (WORKER_MAX_PAYLOAD_BYTES)."""
    try:
        text_ = dumps(value)
    except NotStorable as exc:
        raise InvalidJob(f"{what} {exc}") from None
    size = len(text_) if text_.isascii() else len(text_.encode())
    if size > max_bytes:
        raise InvalidJob(
            f"{what} is {size} bytes; the limit is {max_bytes} (WORKER_MAX_PAYLOAD_BYTES){hint}"
        )
    return text_


_PAYLOAD_HINT = ": store large data elsewhere and pass a reference"
_MAX_DELAY_SECONDS = MAX_DELAY.total_seconds()


def validated(spec: JobSpec, max_bytes: int) -> dict[str, Any]:
    """The parameters of `sql.ENQUEUE` for `spec`, less its id; `InvalidJob` if it is bad."""
    # Each check tries the common case first (a known name, a plain int or float): this runs
    # once per job of every batch.
    if _bad_task_or_queue(spec.task, MAX_TASK_NAME):
        raise InvalidJob(
            f"task name must be a string of 1 to {MAX_TASK_NAME} characters, with no NUL"
        )
    if not isinstance(spec.payload, dict):
        raise InvalidJob(
            f"payload must be a JSON object (a dict), not {type(spec.payload).__name__}"
        )
    text_ = stored_json(spec.payload, "payload", max_bytes, _PAYLOAD_HINT)
    if _bad_task_or_queue(spec.queue, 255):
        raise InvalidJob("queue name must be a string of 1 to 255 characters, with no NUL")
    low, high = PRIORITY_RANGE
    priority = spec.priority
    if (type(priority) is not int and not _is_int(priority)) or not low <= priority <= high:
        raise InvalidJob(f"priority must be an integer from {low} to {high}")
    if spec.max_retries is not None and (
        not _is_int(spec.max_retries) or not 0 <= spec.max_retries <= MAX_RETRIES_LIMIT
    ):
        raise InvalidJob(f"max_retries must be an integer from 0 to {MAX_RETRIES_LIMIT}")
    if spec.unique_key is not None and _bad_name(spec.unique_key, 255):
        raise InvalidJob("unique_key must be a string of 1 to 255 characters, with no NUL")
    if spec.concurrency_key is not None and _bad_name(spec.concurrency_key, 255):
        raise InvalidJob("concurrency_key must be a string of 1 to 255 characters, with no NUL")
    delay = spec.delay
    if type(delay) is not float or not 0.0 <= delay <= _MAX_DELAY_SECONDS:
        delay = _checked_delay(delay)
    if spec.run_at is not None:
        if not isinstance(spec.run_at, datetime) or spec.run_at.tzinfo is None:
            raise InvalidJob("run_at must be a timezone-aware datetime (e.g. datetime.now(UTC))")
        problem = run_at_problem(spec.run_at)
        if problem is not None:
            raise InvalidJob(f"run_at {problem}")
    return {
        "task": spec.task,
        "payload": text_,
        "queue": spec.queue,
        "priority": priority,
        "run_at": spec.run_at,
        "delay": delay,
        "max_retries": spec.max_retries,
        "unique_key": spec.unique_key,
        "concurrency_key": spec.concurrency_key,
    }


def _checked_delay(value: object) -> float:
    """A delay other than a float in range, as seconds; `InvalidJob` if it is not one."""
    delay = value.total_seconds() if isinstance(value, timedelta) else value
    if (
        not isinstance(delay, int | float)
        or isinstance(delay, bool)
        or not math.isfinite(delay)
        or not 0 <= delay <= _MAX_DELAY_SECONDS
    ):
        raise InvalidJob("delay must be a number of seconds or a timedelta, from 0 to 100 years")
    return float(delay)


def _as_spec(item: object) -> JobSpec:
    if isinstance(item, JobSpec):
        return item
    if isinstance(item, tuple) and 1 <= len(item) <= 2:
        return JobSpec(*item)
    raise InvalidJob(f"expected a JobSpec or a (task, payload) tuple, not {type(item).__name__}")


@dataclass
class Batch:
    """Jobs for `enqueue_many`, every one validated, with their new ids."""

    specs: list[JobSpec]
    ids: list[str]
    rows: list[dict[str, Any]]  # each job's parameters of `sql.ENQUEUE`, less its id
    # For each job sharing a unique key with an earlier one of the batch, that one's index: it
    # is not sent, and its handle is the earlier job's.
    same_as: dict[int, int] = field(default_factory=dict)

    @property
    def unique(self) -> bool:
        """Whether a job of the batch has a unique key (`sql.ENQUEUE_MANY_UNIQUE` then)."""
        return any(r["unique_key"] is not None for r in self.rows)

    def sent(self) -> Batch:
        """The batch less the jobs that share a unique key with an earlier one."""
        return self._only([i for i in range(len(self.rows)) if i not in self.same_as])

    def without(self, found: Container[str]) -> Batch:
        """The batch less the jobs whose ids are in `found`."""
        return self._only([i for i, id_ in enumerate(self.ids) if id_ not in found])

    def _only(self, keep: list[int]) -> Batch:
        return Batch(
            [self.specs[i] for i in keep], [self.ids[i] for i in keep], [self.rows[i] for i in keep]
        )

    def params(self) -> dict[str, Any]:
        """The parameters of `sql.ENQUEUE_MANY`."""
        # The payloads are already JSON text: they go in as they are, not encoded a second time.
        names = self._names(dumps)
        parts = []
        for id_, r in zip(self.ids, self.rows, strict=True):
            run_at, retries = r["run_at"], r["max_retries"]
            ra = "null" if run_at is None else f'"{run_at.isoformat()}"'
            mr = "null" if retries is None else str(retries)
            u, ck = (dumps(r[k]) for k in ("unique_key", "concurrency_key"))
            parts.append(
                f'{{"i":"{id_}","t":{names[r["task"]]},"p":{r["payload"]},'
                f'"q":{names[r["queue"]]},"pr":{r["priority"]},"ra":{ra},"d":{r["delay"]!r},'
                f'"mr":{mr},"u":{u},"ck":{ck}}}'
            )
        return {"jobs": f"[{','.join(parts)}]"}

    @property
    def copyable(self) -> bool:
        """Whether the batch can go by `sql.ENQUEUE_MANY_COPY`: not if a job waits (a delay or
        a run_at: its run_at must come from the server's clock, which COPY cannot read) or
        has a unique key (COPY cannot skip a conflicting row) or a concurrency key."""
        return not self.unique and not any(
            r["run_at"] is not None or r["delay"] or r["concurrency_key"] is not None
            for r in self.rows
        )

    def copy_chunks(self, trace: str | None) -> Iterator[str]:
        """The rows of `sql.ENQUEUE_MANY_COPY`, `COPY_CHUNK` at a time; with a `trace`, those
        of `sql.ENQUEUE_MANY_COPY_TRACED`, each row ending with it."""
        names = self._names(lambda name: name.translate(_COPY_ESCAPES))
        # JSON text holds no tab or newline, only escapes of them: only backslashes need one.
        end = "\n" if trace is None else "\t" + trace.replace("\\", "\\\\") + "\n"
        ids, rows = self.ids, self.rows
        for start in range(0, len(rows), COPY_CHUNK):
            end_ = start + COPY_CHUNK
            lines = []
            for id_, r in zip(ids[start:end_], rows[start:end_], strict=True):
                payload, retries = r["payload"], r["max_retries"]
                if "\\" in payload:
                    payload = payload.replace("\\", "\\\\")
                mr = "\\N" if retries is None else retries
                t, q = names[r["task"]], names[r["queue"]]
                lines.append(f"{id_}\t{t}\t{payload}\t{q}\t{r['priority']}\t{mr}{end}")
            yield "".join(lines)

    def _names(self, encode: Callable[[str], str]) -> dict[str, str]:
        """Every task and queue name of the batch, encoded once (a batch repeats a few)."""
        return {
            name: encode(name) for name in {n for r in self.rows for n in (r["task"], r["queue"])}
        }


# What COPY's text format escapes in a value (its delimiter, its row end, and the escape).
_COPY_ESCAPES = str.maketrans({"\\": "\\\\", "\t": "\\t", "\n": "\\n", "\r": "\\r"})


def traced(params: dict[str, Any], trace: str | None) -> dict[str, Any]:
    """A batch's parameters with the trace context it was enqueued in (`worker.tracing`)."""
    params["trace_context"] = trace
    return params


def prepared_many(jobs: Iterable[JobSpec | tuple[str, dict[str, JSON]]], max_bytes: int) -> Batch:
    """Every job validated before anything is written; the first bad one is named by index."""
    specs: list[JobSpec] = []
    rows: list[dict[str, Any]] = []
    for i, item in enumerate(jobs):
        try:
            spec = _as_spec(item)
            rows.append(validated(spec, max_bytes))
        except InvalidJob as exc:
            raise InvalidJob(f"job {i}: {exc}") from None
        specs.append(spec)
    first_with: dict[str, int] = {}
    same_as: dict[int, int] = {}
    for i, row in enumerate(rows):
        key = row["unique_key"]
        if key is not None:
            same_as_earlier = first_with.setdefault(key, i)
            if same_as_earlier != i:
                same_as[i] = same_as_earlier
    return Batch(specs, new_job_ids(len(rows)), rows, same_as)


def parse_duration(value: str | float | timedelta) -> timedelta:
    """A duration: "30s", "15m", "12h", "7d", "2w", a number of seconds or a timedelta, of
    at most 100 years (past that, a finished time cannot be older)."""
    try:
        if isinstance(value, timedelta):
            age = value
        elif isinstance(value, int | float) and not isinstance(value, bool):
            age = timedelta(seconds=value)
        elif isinstance(value, str):
            units = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
            match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhdw]?)\s*", value.lower())
            if match is None:
                raise ValueError(
                    f"older_than must look like 30s, 15m, 12h, 7d or 2w, not {value!r}"
                )
            age = timedelta(seconds=float(match[1]) * units.get(match[2] or "s", 1))
        else:
            raise ValueError(f"older_than must be a duration, not {type(value).__name__}")
    except OverflowError:
        age = MAX_DELAY * 2  # NaN and infinity raise ValueError above
    if age < timedelta(0) or age > MAX_DELAY:
        raise ValueError("older_than must be from 0 to 100 years")
    return age


def prune_params(
    older_than: str | float | timedelta, statuses: Iterable[JobStatus | str], batch_size: int
) -> dict[str, Any]:
    """The parameters of `sql.PRUNE_BATCH`; `ValueError` for a live status or a bad size."""
    names: list[str] = []
    for s in [statuses] if isinstance(statuses, str) else statuses:
        try:
            names.append(str(JobStatus(s)))
        except ValueError:
            raise ValueError(f"unknown job status {s!r}") from None
    bad = [s for s in names if s not in TERMINAL_STATUSES]
    if bad:
        raise ValueError(
            f"only finished jobs (completed, failed, cancelled) can be removed, "
            f"not {', '.join(bad)}"
        )
    if not _is_int(batch_size) or batch_size < 1:
        raise ValueError("batch_size must be a positive integer")
    return {
        "statuses": names,
        "before": datetime.now().astimezone() - parse_duration(older_than),
        "batch": batch_size,
    }
