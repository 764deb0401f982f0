"""Serving the HTTP edge with uvicorn (`worker api`), after the token rule
(`worker.api.access`) allows the address. What this does not do: it handles no request
itself; that is `worker.api.app`'s.
"""

from __future__ import annotations

from worker.api.access import check_bind


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
