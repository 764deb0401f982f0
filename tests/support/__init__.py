"""What the tests share, imported by name: `from support import query, wait_for, Processes`.

The fixtures that hand these out bound to a test's database (`db`, `processes`, `env`) live in
`tests/conftest.py`; this package holds the plain helpers and row factories behind them, so a
test module never imports from a conftest. It is importable as `support` because pytest puts
`tests/` on the path (its conftest sits there), and worker subprocesses get `tests/` on their
PYTHONPATH from the `env` fixture.
"""

from support.db import counts, effects, query, status_of, wait_for_status
from support.factories import (
    ago,
    dead_worker_with_orphans,
    insert_job,
    insert_stage,
    insert_worker,
)
from support.network import free_port
from support.processes import ROOT, Processes, kill_group, worker_env
from support.testdb import Db
from support.waiting import wait_for, wait_until

__all__ = [
    "ROOT",
    "Db",
    "Processes",
    "ago",
    "counts",
    "dead_worker_with_orphans",
    "effects",
    "free_port",
    "insert_job",
    "insert_stage",
    "insert_worker",
    "kill_group",
    "query",
    "status_of",
    "wait_for",
    "wait_for_status",
    "wait_until",
    "worker_env",
]
