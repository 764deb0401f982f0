"""Every named statement of `worker.db.sql` is whole, and PostgreSQL accepts it as written
against the migrated schema: a column renamed, a cast gone wrong or a function a migration
dropped fails here, whether or not some other test happens to run the statement."""

from __future__ import annotations

import ast
import importlib
import json
import pkgutil
import re
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from types import ModuleType
from typing import Any

import psycopg
import pytest

import worker.db.sql as sql_package
from worker.schema import LIVE

PARAMETER = re.compile(r"%\((\w+)\)s")


def _modules() -> list[ModuleType]:
    return [
        importlib.import_module(f"{sql_package.__name__}.{info.name}")
        for info in pkgutil.iter_modules(sql_package.__path__)
    ]


def _assigned(module: ModuleType) -> set[str]:
    """The names a module's own top-level statements bind (not the ones it imports)."""
    tree = ast.parse(Path(module.__file__ or "").read_text())
    return {
        target.id
        for node in tree.body
        if isinstance(node, ast.Assign)
        for target in node.targets
        if isinstance(target, ast.Name)
    }


def _statements() -> dict[str, str]:
    """Each module's upper-case string constants that read as SQL, by `module.NAME`."""
    found = {}
    for module in _modules():
        for name in sorted(_assigned(module)):
            value = getattr(module, name)
            if name.isupper() and isinstance(value, str) and re.match(r"\s*[A-Z]+\b", value):
                found[f"{module.__name__.rsplit('.', 1)[1]}.{name}"] = value
    return found


STATEMENTS = _statements()

NOW = datetime.now(UTC)
# A value of the Python type each parameter's callers pass, by name: the statement is planned
# for it as it would be for theirs.
SAMPLES: dict[str, Any] = {
    "after": 0,
    "answer": json.dumps({"approved": True}),
    "backoff_base": 1.0,
    "backoff_max": 60.0,
    "batch": 100,
    "edges": "[]",
    "before": NOW,
    "before_at": None,
    "before_id": None,
    "bucket": 60,
    "burst": None,
    "children": "[]",
    "concurrency": 4,
    "concurrency_key": None,
    "cutoff": NOW,
    "default_max_retries": 3,
    "delay": 0.0,
    "error": "boom",
    "events": json.dumps(
        [
            {
                "job_id": str(uuid.uuid4()),
                "step": "s",
                "status": "ok",
                "message": None,
                "created_at": NOW.isoformat(),
            }
        ]
    ),
    "except_task": "noop",
    "first_stages": ["fetch"],
    "grace": 2.0,
    "hostname": "host",
    "id": uuid.uuid4(),
    "ids": [uuid.uuid4()],
    "job_id": uuid.uuid4(),
    "jobs": json.dumps(
        [
            {
                "i": str(uuid.uuid4()),
                "t": "add",
                "p": {},
                "q": "default",
                "pr": 0,
                "ra": None,
                "d": 0,
                "mr": None,
                "u": None,
                "ck": None,
            }
        ]
    ),
    "key": "every-minute",
    "key_limits": [2],
    "key_tasks": ["add"],
    "keys": ["every-minute"],
    "lease": 30.0,
    "lease_seconds": 30.0,
    "limit": 10,
    "limits": json.dumps({"add": 3}),
    "liveness_key": 1,
    "lower": uuid.UUID(int=0),
    "max_retries": None,
    "name": "default",
    "newer": None,
    "nodes": "[]",
    "offset": 0,
    "older": None,
    "outcomes": json.dumps(
        [
            {
                "id": str(uuid.uuid4()),
                "retries": 0,
                "max_retries": 3,
                "outcome": "completed",
                "result": 1,
                "error": None,
                "delay": None,
                "stage": None,
                "stage_status": None,
                "stage_output": None,
            }
        ]
    ),
    "pattern": "%ab",
    "payload": json.dumps({}),
    "pid": 1,
    "pipelines": ["pipeline"],
    "plans": json.dumps({"pipeline": {"stages": ["fetch"], "cleanups": []}}),
    "priority": 0,
    "q": "needle",
    "queue": "default",
    "queues": ["default"],
    "rate": None,
    "retries": 0,
    "retry_limits": [5],
    "retry_tasks": ["add"],
    "run_at": None,
    "running": [],
    "since": 3600.0,
    "spawner": uuid.uuid4(),
    "spec": "* * * * *",
    "start": NOW,
    "starting": False,
    "status": "failed",
    "statuses": ["completed", "failed"],
    "tab": "failed",
    "task": "add",
    "tasks": ["add"],
    "tick": NOW,
    "trace_context": None,
    "unique_key": "k",
    "upper": uuid.UUID(int=2**128 - 1),
    "verb": "retry",
    "worker_id": uuid.uuid4(),
    "writes": json.dumps(
        [
            {
                "n": 0,
                "job": str(uuid.uuid4()),
                "retries": 0,
                "ended": None,
                "status": None,
                "output": None,
                "error": None,
                "started": "fetch",
                "kind": "stage",
                "attempt": 1,
                "waiting": [],
            }
        ]
    ),
}
# Where one name means another type in one statement: the liveness lock's key is a number.
OVERRIDES: dict[str, dict[str, Any]] = {
    "liveness.HOLD_LIVENESS": {"key": 1},
    "console.LIST_JOBS": {"since": NOW},
    "console.COUNT_TABS": {"since": NOW},
    "console.BULK_IDS": {"since": NOW},
    "console.BULK_COUNT": {"since": NOW},
    "console.CHART": {"bucket": 60.0},
}


def _params(name: str, statement: str) -> dict[str, Any]:
    names = set(PARAMETER.findall(statement))
    unknown = names - SAMPLES.keys()
    assert not unknown, f"{name}: give {sorted(unknown)} a sample value in SAMPLES"
    given = {key: SAMPLES[key] for key in names}
    given.update({k: v for k, v in OVERRIDES.get(name, {}).items() if k in names})
    return given


def test_the_package_names_its_hot_statements() -> None:
    assert {"claim.CLAIM", "claim.CLAIM_ONE_QUEUE", "claim.RECORD_OUTCOMES"} <= set(STATEMENTS)


@pytest.fixture(scope="module")
def migrated_url(pg_server: str, template_db: str) -> Iterator[str]:
    """One migrated database for the module: nothing here writes to it."""
    name = f"s_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(pg_server, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}" TEMPLATE "{template_db}"')
    yield pg_server.rsplit("/", 1)[0] + f"/{name}"
    with psycopg.connect(pg_server, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.mark.parametrize("name", sorted(STATEMENTS))
def test_postgresql_plans_each_statement_against_the_migrated_schema(migrated_url, name):
    statement = STATEMENTS[name]
    params = _params(name, statement)
    with psycopg.connect(migrated_url) as conn:
        if statement.lstrip().startswith("COPY"):
            # No EXPLAIN for a COPY: it is run, with no rows, and rolled back.
            with conn.cursor().copy(statement):
                pass
        else:
            plan = conn.execute(f"EXPLAIN (FORMAT JSON) {statement}", params).fetchone()
            assert plan is not None and plan[0][0]["Plan"]
        conn.rollback()


def _whole(node: ast.expr) -> bool:
    """A string literal, or one passed whole to a function of one argument (`_compact`)."""
    if isinstance(node, ast.Constant):
        return True
    return (
        isinstance(node, ast.Call)
        and len(node.args) == 1
        and not node.keywords
        and isinstance(node.args[0], ast.Constant)
    )


@pytest.mark.parametrize("module", _modules(), ids=lambda m: m.__name__.rsplit(".", 1)[1])
def test_every_statement_is_written_whole(module):
    """No statement is glued from Python pieces: each constant is one literal, readable and
    runnable in psql as written; what statements share lives in the schema."""
    tree = ast.parse(Path(module.__file__ or "").read_text())
    glued = []
    for node in tree.body:
        if isinstance(node, ast.Assign | ast.AnnAssign) and node.value is not None:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names = [t.id for t in targets if isinstance(t, ast.Name)]
            if any(n.lstrip("_").isupper() for n in names) and not _whole(node.value):
                glued.extend(names)
        elif isinstance(node, ast.FunctionDef) and node.name != "_compact":
            glued.append(node.name)
    assert not glued, f"{module.__name__}: built from pieces: {glued}"


def test_who_holds_a_unique_key_is_asked_as_the_unique_index_reads_it():
    """A statement looking for a key's live holder repeats the unique index's predicate word
    for word, so the index serves it (a differently written one plans a scan)."""
    asking = {name: s for name, s in STATEMENTS.items() if "unique_key = " in s}
    assert {"enqueue.ENQUEUE_UNIQUE", "actions.RETRY", "admin.RETRY_BATCH"} <= set(asking)
    assert [name for name, s in asking.items() if LIVE not in s] == []


GUARD = re.compile(
    r"j\.status = 'processing' AND j\.worker_id = %\(worker_id\)s\s+AND j\.retry_count = "
    r"(r\.retries|b\.retries|%\(retries\)s)"
)


@pytest.mark.parametrize(
    ("name", "writes"),
    [("claim.RECORD_OUTCOMES", 2), ("stages.STAGE_WRITES", 2), ("stages.RECORD_FINAL_ERROR", 1)],
)
def test_every_write_of_an_attempt_carries_the_outcome_guard(name, writes):
    """An attempt writes only while it holds the job (`worker.db.sql`'s outcome guard): where it
    locks the rows it writes, and where it tells a row held elsewhere from one it lost."""
    assert len(GUARD.findall(STATEMENTS[name])) == writes


def _words(statement: str) -> str:
    return re.sub(r"\s+", " ", statement).strip()


def test_the_two_claims_differ_only_in_how_they_pick_their_jobs():
    """The claim of one queue and the claim of several are written out whole, each; their
    lease, their scan of a queue and their writes must stay the same text."""
    one, many = STATEMENTS["claim.CLAIM_ONE_QUEUE"], STATEMENTS["claim.CLAIM"]

    def lease(s: str) -> str:
        return s[: s.index("\n), ")]

    def scan(s: str) -> str:
        return _words(s[s.index("WITH RECURSIVE level") : s.index(") AS s")])

    def writes(s: str) -> str:
        return s[s.index("), claimed AS (") :]

    assert lease(one) == lease(many)
    assert writes(one) == writes(many)
    one_queue = scan(one).replace("(%(queues)s::text[])[1]", "q.name")
    assert one_queue.replace("(SELECT n FROM budget)", "budget.n") == scan(many)


@pytest.mark.parametrize(
    ("tab", "index"), [("failed", "jobs_failed_idx"), ("running", "jobs_processing_idx")]
)
def test_a_console_tab_given_as_a_parameter_reads_its_own_index(database_url, tab, index):
    """The tab is a parameter of one statement, folded away when it is planned: on a long
    history, the failed and running tabs read their partial indexes, not every row."""
    from support import query

    query(
        database_url,
        "INSERT INTO worker.jobs (task, status, finished_at, created_at) "
        "SELECT 'add', 'completed', now(), now() - g * interval '1 s' "
        "FROM generate_series(1, 100000) AS g",
    )
    query(
        database_url,
        "INSERT INTO worker.jobs (task, status, finished_at, worker_id) "
        "SELECT 'add', s, CASE WHEN s = 'failed' THEN now() END, "
        "CASE WHEN s = 'processing' THEN gen_random_uuid() END "
        "FROM unnest(ARRAY['failed', 'processing']) AS s, generate_series(1, 20)",
    )
    query(database_url, "ANALYZE worker.jobs")
    params = {**SAMPLES, "tab": tab, "q": None, "queue": None, "task": None, "since": None}
    with psycopg.connect(database_url) as conn:
        statement = STATEMENTS["console.LIST_JOBS"]
        (plan,) = conn.execute(f"EXPLAIN (FORMAT JSON) {statement}", params).fetchone() or ()
    nodes, scans = [plan[0]["Plan"]], []
    while nodes:
        node = nodes.pop()
        nodes.extend(node.get("Plans", []))
        if node.get("Relation Name") == "jobs" or "Index Name" in node:
            scans.append((node["Node Type"], node.get("Index Name")))
    assert any(name == index for _, name in scans), scans
    assert ("Seq Scan", None) not in scans, scans
