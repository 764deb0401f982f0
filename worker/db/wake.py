"""The wake tokens on PostgreSQL: session locks on the claim loop's own connection.

A token is held by the session that took it, so it lasts as long as that session: a worker
killed while it held one loses it with its connection, and no other worker waits for it to
come back. Behind a transaction pooler no session lasts, so there are no tokens there
(`PostgresDriver.wake_tokens` is None).

What this does not do: it does not notice a session replaced after an outage, which drops its
token without a word; the claim loop counts the token as lost after a failed claim.
"""

from __future__ import annotations

from typing import Any

from psycopg_pool import AsyncConnectionPool

from worker.db import sql


class SessionWakeTokens:
    """`worker.db.driver.WakeTokens` held by the sessions of `claims` (a pool of one)."""

    def __init__(self, claims: AsyncConnectionPool[Any]) -> None:
        self._claims = claims

    async def take(self, key: int) -> bool:
        async with self._claims.connection() as conn:
            cur = await conn.execute(sql.TAKE_WAKE_TOKEN, {"key": key})
            row = await cur.fetchone()
        return bool(row and row[0])

    async def give_back(self, key: int) -> None:
        async with self._claims.connection() as conn:
            await conn.execute(sql.GIVE_BACK_WAKE_TOKEN, {"key": key})
