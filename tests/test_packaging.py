"""The wheel: what `pip install durable-worker` installs runs `worker migrate` on its own,
with no source tree beside it."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

from support import query

ROOT = Path(__file__).resolve().parents[1]


def test_wheel_ships_every_module_and_the_migrations(tmp_path, empty_database_url):
    dist = tmp_path / "dist"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(dist), str(ROOT)],
        check=True,
        timeout=300,
    )
    (wheel,) = dist.glob("durable_worker-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    modules = {p.relative_to(ROOT).as_posix() for p in (ROOT / "worker").rglob("*.py")}
    assert modules <= names, f"modules missing from the wheel: {sorted(modules - names)}"
    migrations = {
        "worker/_migrations/" + p.relative_to(ROOT / "migrations").as_posix()
        for p in (ROOT / "migrations").rglob("*")
        if p.is_file() and "__pycache__" not in p.parts
    }
    assert migrations <= names, f"migrations missing: {sorted(migrations - names)}"

    # Installed alone and run from elsewhere, it finds its migrations inside the package.
    site = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(site), wheel],
        check=True,
        timeout=300,
    )
    env = {**os.environ, "PYTHONPATH": str(site), "DATABASE_URL": empty_database_url}
    run = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys, worker; from worker.cli import main; "
            "print(worker.__file__, file=sys.stderr); sys.argv = ['worker', 'migrate']; main()",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr
    assert str(site) in run.stderr, "the installed wheel, not the source tree, was imported"
    assert query(empty_database_url, "SELECT to_regclass('worker.jobs') IS NOT NULL") == [(True,)]
