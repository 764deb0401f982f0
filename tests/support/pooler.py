"""A real PgBouncer in transaction mode in front of the suite's PostgreSQL, for one test.

    with PgBouncer(database_url, tmp_path, pool_size=20) as bouncer:
        env = worker_env(bouncer.url, DATABASE_POOLER="transaction")

Every database name is passed through to the same name on the test server, so `bouncer.url`
is `database_url` with PgBouncer's port. `bouncer.stats()` reads PgBouncer's own counters
from its admin console; `bouncer.log()` is what it logged. `FLEET` starts many `worker run`
processes forked from one that imported the package once, as many hosts would run them,
without paying the imports once per process on a small machine.

What this does not do: it does not install PgBouncer; `PGBOUNCER` is None where the binary is
absent, and the tests that need it skip saying so (CI installs it).
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import sys
from pathlib import Path
from types import TracebackType
from typing import Any
from urllib.parse import urlsplit

import psycopg

from support.network import free_port
from support.waiting import wait_for

PGBOUNCER = shutil.which("pgbouncer") or next(
    (p for p in ("/usr/sbin/pgbouncer", "/usr/bin/pgbouncer") if os.access(p, os.X_OK)), None
)
MISSING = "pgbouncer is not installed (apt-get install pgbouncer; CI installs it)"


class PgBouncer:
    """One PgBouncer process: transaction pooling, `pool_size` server sessions per database."""

    def __init__(self, database_url: str, folder: Path, *, pool_size: int = 20) -> None:
        assert PGBOUNCER is not None, MISSING
        server = urlsplit(database_url)
        self.port = free_port()
        self.url = database_url.replace(f":{server.port}/", f":{self.port}/", 1)
        self.admin_url = f"postgresql://pgbouncer@127.0.0.1:{self.port}/pgbouncer"
        self.folder = folder
        self.log_path = folder / "pgbouncer.log"
        (folder / "users.txt").write_text('"postgres" ""\n"pgbouncer" ""\n')
        ini = folder / "pgbouncer.ini"
        ini.write_text(
            "\n".join(
                [
                    "[databases]",
                    f"* = host={server.hostname} port={server.port}",
                    "[pgbouncer]",
                    "listen_addr = 127.0.0.1",
                    f"listen_port = {self.port}",
                    "unix_socket_dir =",
                    "auth_type = trust",
                    f"auth_file = {folder / 'users.txt'}",
                    "admin_users = pgbouncer",
                    "stats_users = pgbouncer",
                    "pool_mode = transaction",
                    f"default_pool_size = {pool_size}",
                    "max_client_conn = 2000",
                    "server_check_delay = 0",
                    "log_connections = 0",
                    "log_disconnections = 0",
                    "",
                ]
            )
        )
        cmd = [PGBOUNCER, str(ini)]
        if os.geteuid() == 0:  # PgBouncer refuses to run as root
            cmd[1:1] = ["-u", _unprivileged()]
        self._log = open(self.log_path, "wb")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT)

    def __enter__(self) -> PgBouncer:
        try:
            wait_for(self._answers, timeout=15, message=f"pgbouncer on port {self.port}")
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def _answers(self) -> bool:
        if self.proc.poll() is not None:
            raise RuntimeError(f"pgbouncer exited: {self.log()}")
        try:
            with psycopg.connect(self.url, autocommit=True, connect_timeout=2) as conn:
                conn.execute("SELECT 1")
            return True
        except psycopg.OperationalError:
            return False

    def stats(self, command: str) -> list[dict[str, Any]]:
        """Rows of an admin console `SHOW` (`SHOW POOLS`, `SHOW SERVERS`), as dicts."""
        with psycopg.connect(self.admin_url, autocommit=True, connect_timeout=5) as conn:
            cur = conn.cursor()
            # The console speaks the simple protocol only.
            cur.execute(command.encode(), prepare=False)
            names = [c.name for c in cur.description or []]
            return [dict(zip(names, row, strict=True)) for row in cur.fetchall()]

    def log(self) -> str:
        self._log.flush()
        return self.log_path.read_text(errors="replace")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()


def _unprivileged() -> str:
    for name in ("postgres", "nobody"):
        try:
            return pwd.getpwnam(name).pw_name
        except KeyError:
            continue
    raise RuntimeError("no unprivileged account to run pgbouncer as")


# `python -c FLEET n module`: `n` processes of `worker run module`, each its own worker,
# forked after the imports; exits 0 once every one of them exited 0 (SIGTERM stops them all).
FLEET = """
import importlib, os, signal, sys
from worker.cli import main
count, module = int(sys.argv[1]), sys.argv[2]
importlib.import_module(module)
children = []
for _ in range(count):
    pid = os.fork()
    if pid == 0:
        sys.argv, code = ["worker", "run", module], 1
        try:
            main()
            code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else int(exc.code is not None)
        finally:
            sys.stdout.flush()
            os._exit(code)
    children.append(pid)
signal.signal(signal.SIGTERM, lambda *_: [os.kill(c, signal.SIGTERM) for c in children])
codes = [os.waitstatus_to_exitcode(os.waitpid(c, 0)[1]) for c in children]
sys.exit(1 if any(codes) else 0)
"""


def fleet_command(count: int, module: str) -> list[str]:
    """The command that runs `count` worker processes of `module` (see `FLEET`)."""
    return [sys.executable, "-c", FLEET, str(count), module]
