"""Many rows as one parameter: a JSON array that `json_to_recordset` unpacks server-side.

Built by the C JSON encoder, a batch costs the client a fraction of what psycopg's array
parameters cost (each array is dumped element by element in Python), and the statement stays
one round trip with one parameter per batch. The statements unpack a jsonb value as a `json`
field and cast it: `json_to_recordset` fills a `jsonb` field several times more slowly than
the cast converts it.

    >>> json_records([({"id": 1, "step": "load"}, {"output": '{"rows": 3}'})])
    '[{"id":1,"step":"load","output":{"rows": 3}}]'

A list parameter a statement casts to an array (`%(ids)s::uuid[]`) goes as the array's text:
psycopg would pick and run a dumper for the list, and for each element, at every execution.

    >>> array_literal(["default", 'say "hi"'])
    '{"default","say \\\\"hi\\\\""}'
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

_encode = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode


def json_records(rows: Iterable[tuple[Mapping[str, Any], Mapping[str, str | None]]]) -> str:
    """A JSON array of objects, one per `(values, encoded)` pair. `values` (not empty) are
    encoded here; `encoded` holds values that already are JSON text (a stored result, an
    output), spliced in as they are; a None there leaves the key out (SQL NULL)."""
    # Pieces joined once at the end; a loop, not a generator per row, on the per-job path.
    parts = ["["]
    for values, encoded in rows:
        parts.append(_encode(values)[:-1])
        for key, value in encoded.items():
            if value is not None:
                parts.append(f',"{key}":{value}')
        parts.append("},")
    if len(parts) > 1:
        parts[-1] = "}"
    parts.append("]")
    return "".join(parts)


def array_literal(values: Iterable[str | int]) -> str:
    """A PostgreSQL array literal of `values`, for a parameter the statement casts to an array.
    Each text element is quoted, so commas, quotes, braces and backslashes in it stay as
    they are."""
    return "{" + ",".join(map(_element, values)) + "}"


def _element(value: str | int) -> str:
    if isinstance(value, int):
        return str(value)
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
