"""Changes to a test's own `LocalPostgres` that only a scenario needs: settings, and who may
connect. Both take effect at the server's next start (or reload, for `pg_hba.conf`)."""

from __future__ import annotations

from worker.db.embedded import LocalPostgres


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
