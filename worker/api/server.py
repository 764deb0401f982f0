"""Serving the HTTP edge with uvicorn (`worker api`), and the rule about tokens.

Without `WORKER_API_TOKEN`, anyone who reaches the API could enqueue or cancel jobs, so it
then serves on a loopback address only (127.0.0.1, ::1, localhost). What this does not do:
it handles no request itself; that is `worker.api.app`'s.
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


def serve(
    url: str,
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    token: str | None = None,
    log_level: str = "INFO",
) -> None:
    """Run the API until SIGTERM or Ctrl-C; open event streams get 5 s to end."""
    import uvicorn

    from worker.api.app import create_app

    check_bind(host, token)
    uvicorn.run(
        create_app(url, token),
        host=host,
        port=port,
        log_level=log_level.lower(),
        timeout_graceful_shutdown=5,
        proxy_headers=False,
    )
