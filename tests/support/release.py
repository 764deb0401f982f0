"""The release's files, made once per test run and shared by its test processes: the sdist and
the wheel built from a copy of the source with `python -m build` (the wheel from the sdist, so a
file the sdist leaves out fails the build), in a build environment of their own that has
`twine` too, and a wheelhouse holding the wheel and everything a clean install of it with the
`embedded` extra and pytest takes, so each new virtualenv installs with `--no-index`.
"""

from __future__ import annotations

import fcntl
import os
import re
import shutil
import subprocess
import sys
import venv
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DISTRIBUTION = "durable-worker-pg"
# Left out of the copy the release is built from: nothing the release ships.
NOT_SOURCE = shutil.ignore_patterns(
    ".git",
    ".venv",
    ".worker-data",
    "build",
    "dist",
    "*.egg-info",
    "__pycache__",
    ".*_cache",
    "node_modules",
)
_RELEASE_HEADING = re.compile(r"^## \[(\d+\.\d+\.\d+)\]", re.MULTILINE)


@dataclass(frozen=True)
class Release:
    source: Path  # the copy of the source the files were built from
    wheel: Path
    sdist: Path
    wheelhouse: Path  # for `pip install --no-index --find-links`
    tools: Path  # the build environment's bin folder (`python -m build`, `twine`)


def changelog_version() -> str:
    """The version of the top release in CHANGELOG.md."""
    found = _RELEASE_HEADING.search((ROOT / "CHANGELOG.md").read_text(encoding="utf-8"))
    assert found, "CHANGELOG.md has no '## [X.Y.Z]' release heading"
    return found.group(1)


def clean_env(**settings: str) -> dict[str, str]:
    """This process's environment without the settings, paths and virtualenv of the suite."""
    drop = ("WORKER_", "PYTHON", "VIRTUAL_ENV", "DATABASE_", "TEST_DATABASE_URL")
    return {k: v for k, v in os.environ.items() if not k.startswith(drop)} | settings


def built_release(tmp_path_factory: pytest.TempPathFactory) -> Release:
    """The release's files, built by the first test process to ask; the others wait for it."""
    shared = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        shared = shared.parent  # the run's folder, above each test process's own
    folder = shared / f"release-py{sys.version_info.major}{sys.version_info.minor}"
    with open(shared / f"{folder.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (folder / "built").exists():
            shutil.rmtree(folder, ignore_errors=True)
            _build(folder)
            (folder / "built").touch()
    (wheel,) = (folder / "dist").glob("durable_worker_pg-*.whl")
    (sdist,) = (folder / "dist").glob("durable_worker_pg-*.tar.gz")
    return Release(
        folder / "source" / DISTRIBUTION,
        wheel,
        sdist,
        folder / "wheelhouse",
        folder / "tools" / "bin",
    )


def _build(folder: Path) -> None:
    source = folder / "source" / DISTRIBUTION
    shutil.copytree(ROOT, source, ignore=NOT_SOURCE)
    venv.EnvBuilder(with_pip=True).create(folder / "tools")
    tools = folder / "tools" / "bin"
    _run(tools / "pip", "install", "-q", "setuptools>=77", "build", "twine")
    # No isolation: the build environment above is this build's only one, made once.
    _run(tools / "python", "-m", "build", "-q", "--no-isolation", "-o", folder / "dist", source)
    (wheel,) = (folder / "dist").glob("*.whl")
    house = folder / "wheelhouse"
    _run(sys.executable, "-m", "pip", "download", "-q", "-d", house, f"{wheel}[embedded]", "pytest")
    if not (house / wheel.name).exists():
        shutil.copy(wheel, house)


def _run(*args: object) -> None:
    done = subprocess.run(
        [str(a) for a in args], capture_output=True, text=True, timeout=600, env=clean_env()
    )
    assert done.returncode == 0, f"{args}: {done.stdout[-3000:]}{done.stderr[-3000:]}"
