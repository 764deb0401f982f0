"""Chaos scenario: a rolling upgrade, migration first, while the previous release drains.

The previous release is the commit before the one that added the newest migration, found from
git history (so the scenario follows each new migration). Its `worker run` processes drain a
database at its own migration level; the current `worker migrate` then applies the newest
migration under them; they must keep draining with no error logged; then workers of the
current code join, and `verify` holds for every job.
"""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
import tarfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from support import ROOT, Processes, query
from support.servers import server_root

from chaos.harness import (
    enqueue_workload,
    finished_count,
    install_audit,
    verify,
    wait_all_finished,
    wait_until,
    worker_env,
)
from worker.db.embedded import LocalPostgres

pytestmark = pytest.mark.chaos

TASKS = "chaos.faulttasks"
VERSIONS = ROOT / "migrations" / "versions"


# The previous release's client, enqueueing argv[1] jobs on the database it is given.
ENQUEUE_WITH_CLIENT = """
import sys
from worker import Client
client = Client()
for _ in range(int(sys.argv[1])):
    client.enqueue("chaos_sync", {"sleep": 0.05})
"""


def git(*args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(ROOT), *args], capture_output=True, text=True, check=True
    ).stdout.strip()


def previous_release() -> tuple[str, str] | None:
    """The commit before the newest migration was added, and that migration's file name;
    None without git history (no git, not a checkout, or a shallow one that lacks it)."""
    newest = max(p.name for p in VERSIONS.glob("[0-9]*.py"))
    path = f"migrations/versions/{newest}"
    try:
        added = git("log", "--diff-filter=A", "--format=%H", "-1", "--", path)
        # A migration not committed yet is new against HEAD itself.
        before = git("rev-parse", "--verify", f"{added}^" if added else "HEAD")
    except (OSError, subprocess.CalledProcessError):
        return None
    return before, newest


@pytest.fixture
def old_release(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, str, str]]:
    """The previous release's tree (its code, migrations and test tasks), its commit and the
    migration it lacks."""
    found = previous_release()
    if found is None:
        pytest.skip("a rolling upgrade needs the previous release from git history")
    commit, newest = found
    root = Path(tmp_path_factory.mktemp("old-release"))
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", commit, "worker", "migrations", "tests"],
        capture_output=True,
        check=True,
    ).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(root, filter="data")
    yield root, commit, newest


@pytest.fixture
def server_of() -> Iterator[LocalPostgres]:
    """A server of this test's own, not migrated (each release migrates it its own way)."""
    with server_root("dw-upgrade-") as root:
        server = LocalPostgres(root / "pg", durable=False, prefer_system=True)
        try:
            server.start()
            yield server
        finally:
            server.destroy()


def code_env(url: str, tree: Path) -> dict[str, str]:
    """`worker` programs of the code in `tree`, with this venv's packages."""
    return worker_env(url, PYTHONPATH=os.pathsep.join([str(tree / "tests"), str(tree)]))


def migrate_with(env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "worker", "migrate"],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
    )


def version(url: str) -> str:
    return str(query(url, "SELECT version_num FROM worker.alembic_version")[0][0])


def test_workers_one_release_behind_keep_draining_through_the_migration(
    old_release, server_of, processes: Processes, tmp_path: Path
):
    old_tree, commit, newest = old_release
    url = server_of.url()
    old_env = code_env(url, old_tree)
    new_env = code_env(url, ROOT)

    # The code `worker` resolves to in each environment is the tree it was given.
    where = subprocess.run(
        [sys.executable, "-c", "import worker; print(worker.__file__)"],
        env=old_env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert where.startswith(str(old_tree)), where

    old_migrate = migrate_with(old_env, tmp_path)
    assert old_migrate.returncode == 0, old_migrate.stderr
    old_version = version(url)
    assert not newest.startswith(old_version.split("_")[0]), (old_version, newest)
    install_audit(url)

    first, by_old_client, last = 800, 100, 600
    enqueue_workload(url, first, sleep=0.1)
    old_workers = [
        processes.worker(old_env, TASKS, extra={"WORKER_CONCURRENCY": "8"}) for _ in range(2)
    ]
    started = time.monotonic()
    wait_until(lambda: finished_count(url) >= first // 4, 120, "a quarter of the jobs")

    migrating = time.monotonic()
    new_migrate = migrate_with(new_env, tmp_path)
    migrated_in = time.monotonic() - migrating
    assert new_migrate.returncode == 0, new_migrate.stderr
    assert newest.startswith(version(url).split("_")[0]), (version(url), newest)
    finished_by_then = finished_count(url)

    # On the migrated schema the old release alone drains what was left, and what its client
    # enqueues now.
    old_client = subprocess.run(
        [sys.executable, "-c", ENQUEUE_WITH_CLIENT, str(by_old_client)],
        env=old_env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert old_client.returncode == 0, old_client.stderr
    wait_all_finished(url, first + by_old_client, timeout=120)

    # The roll: the current release joins, then the old one stops as it would be told to.
    new_workers = [
        processes.worker(new_env, TASKS, extra={"WORKER_CONCURRENCY": "8"}) for _ in range(2)
    ]
    wait_until(
        lambda: query(
            url,
            "SELECT count(*) = %s FROM worker.workers WHERE pid = ANY(%s)",
            (len(new_workers), [p.pid for p in new_workers]),
        )[0][0],
        60,
        "the new workers to register",
    )
    enqueue_workload(url, last, sleep=0.1)
    for proc in old_workers:
        proc.send_signal(signal.SIGTERM)
    for proc in old_workers:
        assert proc.wait(timeout=30) == 0, processes.log(proc)[-3000:]
    jobs = first + by_old_client + last
    wait_all_finished(url, jobs, timeout=240)
    report = verify(url, "rolling_upgrade", time.monotonic() - started)
    (by_new,) = query(
        url,
        "SELECT count(DISTINCT job) FROM chaos_effects WHERE pid = ANY(%s)",
        ([p.pid for p in new_workers],),
    )[0]

    for proc in [*old_workers, *new_workers]:
        log = processes.log(proc)
        assert "Traceback" not in log and " ERROR " not in log, log[-3000:]
    for proc in new_workers:
        assert proc.poll() is None, f"a worker exited: {processes.log(proc)[-3000:]}"
    report.extra = {
        "old_release": commit[:10],
        "from_version": old_version,
        "to_version": version(url),
        "migrate_s": round(migrated_in, 2),
        "finished_before_migration_ended": finished_by_then,
        "jobs_run_by_new_workers": int(by_new),
    }
    report.emit()
    assert by_new > 0, "the new workers ran nothing"


def test_previous_release_is_found_in_history():
    """The scenario above runs against a real previous release, not the current code."""
    found = previous_release()
    if found is None:
        pytest.skip("no git history in this checkout")
    commit, newest = found
    older = git("ls-tree", "--name-only", commit, "migrations/versions/").split()
    assert f"migrations/versions/{newest}" not in older, (commit, newest)
    assert older, "the previous release has no migrations at all"
