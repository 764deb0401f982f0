"""`statements_of`: every statement a client sends, recorded, for tests that count them."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import psycopg
from sqlalchemy import event

from worker import AsyncClient, Client

if TYPE_CHECKING:
    import pytest


def statements_of(client: Client | AsyncClient, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every statement the client sends: through its SQLAlchemy engine, or straight through
    psycopg (enqueues outside a caller's transaction), COPY included."""
    seen: list[str] = []

    def record(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        seen.append(statement)

    engine = client.engine if isinstance(client, Client) else client.engine.sync_engine
    event.listen(engine, "before_cursor_execute", record)
    for cls in (psycopg.Cursor, psycopg.AsyncCursor):
        for name in ("execute", "copy"):
            real = getattr(cls, name)

            def send(self: Any, query: Any, *args: Any, _real: Any = real, **kw: Any) -> Any:
                seen.append(str(query))
                return _real(self, query, *args, **kw)

            monkeypatch.setattr(cls, name, send)
    return seen
