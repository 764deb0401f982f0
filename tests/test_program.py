"""The `worker` program before any command: `--version` prints the release the changelog names,
and an application's own `worker.py` or `worker/` package, where task modules are imported
from, stops it with one line naming that file (exit code 2), as the getting-started guide
says; an application's module named `worker` inside its own package shadows nothing."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from support import ROOT
from support.release import DISTRIBUTION, changelog_version, clean_env

import worker

PROGRAM = Path(sys.executable).parent / "worker"


def _run(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = clean_env(PYTHONPATH=str(ROOT))  # this source tree's package, wherever the program runs
    return subprocess.run(
        [str(PROGRAM), *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=60
    )


def test_version_prints_the_changelog_s_top_release(tmp_path: Path) -> None:
    done = _run(tmp_path, "--version")
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"{DISTRIBUTION} {changelog_version()}\n"
    assert worker.__version__ == changelog_version()


@pytest.mark.parametrize(
    ("files", "shown"),
    [({"worker.py": "x = 1\n"}, "./worker.py"), ({"worker/__init__.py": ""}, "./worker/")],
    ids=["module", "package"],
)
def test_an_application_s_own_worker_module_stops_the_program_in_one_line(
    tmp_path: Path, files: dict[str, str], shown: str
) -> None:
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    (tmp_path / "tasks.py").write_text("from worker import task\n")
    done = _run(tmp_path, "run", "tasks")
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr.count("\n") == 1, done.stderr
    assert done.stderr.startswith(f"error: {shown} shadows the `worker` package of {DISTRIBUTION}")
    assert "rename your module" in done.stderr


def test_the_application_s_own_import_fails_naming_its_file(tmp_path: Path) -> None:
    # What the guide says an application meets: its `from worker import task` finds its file.
    (tmp_path / "worker.py").write_text("x = 1\n")
    done = subprocess.run(
        [sys.executable, "-c", "from worker import task"],
        cwd=tmp_path,
        env=clean_env(PYTHONPATH=str(ROOT)),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1
    assert f"ImportError: cannot import name 'task' from 'worker' ({tmp_path}/worker.py)" in (
        done.stderr
    )


@pytest.mark.parametrize(
    "files",
    [{"myapp/__init__.py": "", "myapp/worker.py": "x = 1\n"}, {"worker/notes.txt": ""}],
    ids=["inside-a-package", "folder-without-init"],
)
def test_a_worker_module_inside_a_package_or_a_bare_folder_shadows_nothing(
    tmp_path: Path, files: dict[str, str]
) -> None:
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    done = _run(tmp_path, "--version")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(DISTRIBUTION)
