"""A primary and a synchronous hot standby of a test's own, for failover scenarios.

The primary is a `LocalPostgres`; the standby is a `pg_basebackup -R` copy of it on another
port, streaming as `standby`, the one name in the primary's `synchronous_standby_names`: a
commit the primary acknowledged is flushed on the standby too. `kill_primary()` is the crash
(SIGKILL of the postmaster, no shutdown checkpoint), `promote()` the failover.

    pair = ReplicatedPair.start(root)
    url = pair.url                     # both hosts, target_session_attrs=read-write
    pair.kill_primary(); pair.promote()

What this does not do: no virtual IP or proxy sits in front of the two servers; clients find
the writable one themselves from the multi-host URL, as libpq does.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path

from support.db import query
from support.network import free_port
from support.servers import set_conf
from worker.db.embedded import DATABASE, LocalPostgres

STANDBY_NAME = "standby"


class ReplicatedPair:
    """A primary and its synchronous standby; see the module's docs."""

    def __init__(self, primary: LocalPostgres, standby: LocalPostgres) -> None:
        self.primary = primary
        self.standby = standby
        self.primary_url = primary.url()
        self.standby_url = standby.url()
        self.url = (
            f"postgresql://postgres@/{DATABASE}?host=127.0.0.1,127.0.0.1"
            f"&port={primary.port},{standby.port}&target_session_attrs=read-write"
        )

    @classmethod
    def start(cls, root: Path) -> ReplicatedPair:
        primary = LocalPostgres(root / "primary", durable=False, prefer_system=True)
        primary.start()
        # What the test checks rests on an acknowledged commit being on the standby too.
        set_conf(
            primary,
            synchronous_commit="on",
            synchronous_standby_names=f"'{STANDBY_NAME}'",
            wal_level="replica",
        )
        primary.stop()
        primary.start()

        standby_dir = root / "standby"
        standby_dir.mkdir(mode=0o700)
        if primary.account is not None:
            os.chown(standby_dir, primary.account.pw_uid, primary.account.pw_gid)
        primary._run(
            "pg_basebackup",
            "-D",
            str(standby_dir),
            "-R",
            "-X",
            "stream",
            "-h",
            "127.0.0.1",
            "-p",
            str(primary.port),
            "-U",
            "postgres",
        )
        standby = LocalPostgres(standby_dir, durable=False, prefer_system=True)
        # Once promoted it has no standby of its own: its commits must not wait for one.
        set_conf(
            standby,
            port=str(free_port()),
            cluster_name=f"'{STANDBY_NAME}'",
            synchronous_standby_names="''",
            hot_standby="on",
        )
        standby.start()
        pair = cls(primary, standby)
        pair.wait_streaming()
        return pair

    def wait_streaming(self, timeout: float = 30.0) -> None:
        """Until the primary reports the standby as its synchronous one."""
        deadline = time.monotonic() + timeout
        while True:
            rows = query(
                self.primary_url,
                "SELECT sync_state FROM pg_stat_replication WHERE application_name = %s",
                (STANDBY_NAME,),
            )
            if rows and rows[0][0] == "sync":
                return
            if time.monotonic() > deadline:
                raise AssertionError(f"the standby never became synchronous: {rows}")
            time.sleep(0.1)

    def kill_primary(self) -> None:
        """SIGKILL the primary's postmaster, as a crash of its host would end it."""
        pid = int((self.primary.data_dir / "postmaster.pid").read_text().split()[0])
        os.kill(pid, signal.SIGKILL)

    def promote(self) -> None:
        """Make the standby the primary, and wait until it takes writes."""
        self.standby._run("pg_ctl", "promote", "-D", str(self.standby.data_dir), "-w")

    def destroy(self) -> None:
        for server in (self.standby, self.primary):
            with contextlib.suppress(Exception):
                server.destroy()
