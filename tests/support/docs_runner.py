"""Runs the code blocks of one documentation page, in order, as a reader would paste them.

`python docs_runner.py blocks.json` in the folder the page's files go to, with `DATABASE_URL`
set. Python blocks: one whose first line is `# name.py` is a file the reader saves (a
`# test_*.py` one is run with pytest at the end, unless a console block of the page runs it);
every other block runs in one namespace shared by the page, and each `# prints: text` line
of a block must be in what the block printed. Console blocks (on the pages that ask for it):
each `$ command` runs in a shell and must succeed, printing the lines shown under it (but
ids, which differ each run); `$ worker run ... &` starts a worker in the background in place
of the one before, as a reader who stops one and starts another.

A page with no console block has no worker of its own: one drains the due jobs in this
process all along, with the page's saved modules imported and the suite's test tasks
(`add`, ...) registered, as such pages assume a worker that knows them. At the end, no due
job of a task registered here may be left unfinished.
"""

from __future__ import annotations

import contextlib
import importlib
import io
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

FILE_NAME = re.compile(r"^# ([\w/]+\.py)\s*$")
PRINTS = re.compile(r"#\s*prints:\s*(.+?)\s*$")
JOB_ID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def _drain_until(stop: threading.Event, errors: list[BaseException]) -> None:
    from worker.testing import drain

    while not stop.is_set():
        try:
            drain(timeout=60)
        except TimeoutError:
            continue
        except BaseException as exc:  # reported by the main thread, which fails the run
            errors.append(exc)
            return
        stop.wait(0.05)


class Reader:
    """The page's state: its namespace, its background worker, the test files it wrote."""

    def __init__(self, here: Path, import_saved: bool) -> None:
        self.here = here
        self.import_saved = import_saved
        self.namespace: dict[str, Any] = {"__name__": "__main__"}
        self.tests: list[str] = []
        self.commands: list[str] = []
        self.background: subprocess.Popen[bytes] | None = None

    def python(self, where: str, code: str) -> None:
        name = FILE_NAME.match(code.splitlines()[0])
        if name:
            saved = Path(name.group(1))
            (self.here / saved).write_text(code, encoding="utf-8")
            if saved.name.startswith("test_"):
                self.tests.append(saved.as_posix())
            elif self.import_saved:
                importlib.import_module(saved.with_suffix("").as_posix().replace("/", "."))
            return
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed):
            exec(compile(code, where, "exec"), self.namespace)
        shown = printed.getvalue()
        missing = [m.group(1) for m in PRINTS.finditer(code) if m.group(1) not in shown]
        if missing:
            raise AssertionError(f"{where}: printed {shown!r}, not {missing}")

    def console(self, where: str, code: str) -> None:
        lines = code.splitlines()
        for index, line in enumerate(lines):
            if not line.startswith("$ "):
                continue
            command = line[2:].split("  #", 1)[0].strip()
            self.commands.append(command)
            shown = []
            for after in lines[index + 1 :]:
                if after.startswith("$ "):
                    break
                shown.append(after.strip())
            if command.endswith("&"):
                self.stop_background()
                self.background = subprocess.Popen(
                    shlex.split(command[:-1]), cwd=self.here, start_new_session=True
                )
                continue
            done = subprocess.run(
                command, shell=True, cwd=self.here, capture_output=True, text=True, timeout=120
            )
            if done.returncode != 0:
                raise AssertionError(f"{where}: `{command}` failed: {done.stdout}{done.stderr}")
            expected = [s for s in shown if s and not JOB_ID.search(s)]
            missing = [s for s in expected if s not in done.stdout]
            if missing:
                raise AssertionError(f"{where}: `{command}` printed {done.stdout!r}, not {missing}")

    def stop_background(self) -> None:
        if self.background is not None and self.background.poll() is None:
            os.killpg(self.background.pid, signal.SIGTERM)
            self.background.wait(timeout=60)
        self.background = None


def _unfinished_jobs() -> list[tuple[str, str]]:
    from worker import JobStatus
    from worker.db.connect import connect
    from worker.db.embedded import database_url
    from worker.tasks import REGISTRY

    live = [JobStatus.PENDING.value, JobStatus.PROCESSING.value]
    with connect(database_url(), "durable-worker-docs") as conn:
        rows = conn.execute(
            "SELECT id::text, task FROM worker.jobs WHERE status = ANY(%s)"
            " AND task = ANY(%s) AND queue = 'default' AND run_at <= now()",
            (live, list(REGISTRY)),
        ).fetchall()
    return [(str(r[0]), str(r[1])) for r in rows]


def main(blocks_file: str) -> int:
    blocks = json.loads(Path(blocks_file).read_text(encoding="utf-8"))
    here = Path.cwd()
    sys.path.insert(0, str(here))
    import testtasks  # noqa: F401 - registers the suite's tasks

    own_worker = any(block["kind"] == "console" for block in blocks)
    reader = Reader(here, import_saved=not own_worker)
    stop, errors = threading.Event(), []
    drainer = threading.Thread(target=_drain_until, args=(stop, errors), daemon=True)
    if not own_worker:
        drainer.start()
    try:
        for block in blocks:
            print(f"--- {block['where']}", flush=True)
            getattr(reader, block["kind"])(block["where"], block["code"])
    finally:
        reader.stop_background()
        stop.set()
        if drainer.is_alive():
            drainer.join(timeout=30)
    if errors:
        raise errors[0]
    left = _unfinished_jobs()
    if left:
        raise AssertionError(f"jobs the page enqueued and no worker finished: {left}")
    tests = [t for t in reader.tests if not any(t in c for c in reader.commands)]
    if tests:
        pytest = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"]
        return subprocess.run([*pytest, *tests]).returncode
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
