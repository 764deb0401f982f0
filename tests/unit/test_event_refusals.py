"""A refused progress event is dropped alone and counted, whatever its error says."""

from __future__ import annotations

from datetime import UTC, datetime

import psycopg

from worker.db.driver import EventWrite
from worker.events.postgres import PostgresBus


def test_an_event_refused_with_an_empty_message_is_counted_not_fatal() -> None:
    bus = PostgresBus("postgresql://localhost/unused")
    event = EventWrite(
        "00000000-0000-0000-0000-000000000001", "load", "progress", None, datetime.now(UTC)
    )
    bus._refused(event, psycopg.DataError(""))
    assert bus.dropped == 1
