"""Who may reach the API: the rule about tokens.

Without `WORKER_API_TOKEN`, anyone who reaches the API could enqueue or cancel jobs, so it
then serves on a loopback address only (127.0.0.1, ::1, localhost), and a request naming
another host is refused (`worker.api.app`).
"""

from __future__ import annotations

import ipaddress

from worker.settings import SettingsError


def is_loopback(host: str) -> bool:
    """True for an address only this machine can reach.

    >>> is_loopback("127.0.0.1"), is_loopback("::1"), is_loopback("0.0.0.0")
    (True, True, False)
    """
    if host.strip().lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip().strip("[]")).is_loopback
    except ValueError:
        return False  # a host name: it may resolve to anything


def check_bind(host: str, token: str | None) -> None:
    """Refuse to serve a non-loopback address without a token (raises `SettingsError`)."""
    if not token and not is_loopback(host):
        raise SettingsError(
            f"WORKER_API_TOKEN is not set: refusing to serve the API on {host}, where others "
            "could change jobs without a token; set WORKER_API_TOKEN or use --host 127.0.0.1"
        )
