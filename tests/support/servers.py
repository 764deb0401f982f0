"""What a scenario with servers of its own needs: a folder for them, their settings, and who
may connect. Settings take effect at the server's next start (or reload, for `pg_hba.conf`)."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from worker.db.embedded import LocalPostgres


@contextmanager
def server_root(prefix: str) -> Iterator[Path]:
    """A folder the server's account can reach, removed afterwards. Not under pytest's
    temporary folder: every pytest run on the machine resets that one to mode 0700."""
    root = Path(tempfile.mkdtemp(prefix=prefix))
    root.chmod(0o755)
    try:
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


def set_conf(server: LocalPostgres, **settings: str) -> None:
    """Set lines of the server's `worker.conf`, replacing any of the same name."""
    conf = server.data_dir / "worker.conf"
    keep = [
        line
        for line in conf.read_text().splitlines()
        if line.split("=", 1)[0].strip() not in settings
    ]
    conf.write_text("\n".join([*keep, *(f"{k} = {v}" for k, v in settings.items())]) + "\n")


def trust_clients(server: LocalPostgres, subnet: str) -> None:
    """Let clients of `subnet` (a CIDR) connect as any user, as local ones may."""
    with open(server.data_dir / "pg_hba.conf", "a") as hba:
        hba.write(f"host all all {subnet} trust\n")


class ServerLog:
    """What a server of a test's own writes to its log from the moment this is made on.

    What this does not do: it reads only servers started by `LocalPostgres` (their log is
    `server.log` in the data folder), never one named by `TEST_DATABASE_URL`.
    """

    def __init__(self, server: LocalPostgres) -> None:
        self.path = server.data_dir / "server.log"
        self.start = self.path.stat().st_size

    def lines(self) -> list[str]:
        with open(self.path, "rb") as log:
            log.seek(self.start)
            return log.read().decode(errors="replace").splitlines()

    def errors(self) -> list[str]:
        """Lines reporting an error to a client (`ERROR:`), and the statement lines after them."""
        return [line for line in self.lines() if "ERROR:" in line or "STATEMENT:" in line]
