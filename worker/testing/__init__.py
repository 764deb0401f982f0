"""Testing your own tasks: a pytest plugin with a fresh database per test, and `drain`.

Installed with durable-worker and registered through the `pytest11` entry point, so a test
suite gets the fixtures with no conftest:

- `worker_database`: a fresh, migrated database for the test, set as `DATABASE_URL`;
- `drain()` / `drain_async()`: run the due jobs in this process with the real worker until
  none is left, and return their final `Job` handles;
- `drain(crash_after="stage")`: lose the attempt that completes `stage` as a killed worker
  would, so the next `drain()` shows the cleanup it owed running again.

    from worker import enqueue
    from worker.testing import drain

    def test_resize(worker_database):
        job = enqueue("resize", {"image": "cat.png"})
        [done] = drain()
        assert done.result == {"thumbnail": "cat.png.thumb.webp"}

See docs/testing.md.
"""

from worker.testing.databases import Databases, worker_database, worker_database_server
from worker.testing.draining import NoCrash, drain, drain_async

__all__ = [
    "Databases",
    "NoCrash",
    "drain",
    "drain_async",
    "worker_database",
    "worker_database_server",
]
