"""Which job an id argument names: a whole id, or the part of one that `worker jobs` prints.

Every command taking a job id resolves it here, as git resolves a short commit id: a whole id
is used as given; `…` and hex digits (what a narrow `worker jobs` prints) is the end of an id;
bare hex digits are the beginning of one, or, when no id begins with them, the end. Exactly
one job must match; several are a usage error naming them (exit code 2), none an error (exit
code 1). A beginning is found on the primary key's index; an end reads the whole jobs table,
so its cost grows with the table. What this does not do: it does not check the job's status.
"""

from __future__ import annotations

from worker.cli.errors import fail
from worker.cli.session import ask
from worker.db import admin
from worker.ids import job_id_text

SHOWN = 5  # candidates an ambiguous id names


def resolve_job_id(given: str) -> str:
    """The whole id of the one job `given` (as `options.parse_job_id` read it) names."""
    if job_id_text(given) is not None:
        return given
    digits = given.removeprefix("…")
    tail = digits != given

    async def matches(conn: admin.Conn) -> tuple[str, list[str]]:
        if not tail:
            found = await admin.ids_beginning(conn, digits, SHOWN + 1)
            if found:
                return "begin", found
        return "end", await admin.ids_ending(conn, digits, SHOWN + 1)

    how, found = ask(matches)
    if len(found) == 1:
        return found[0]
    if not found:
        where = "ends" if tail else "begins or ends"
        raise fail(f"no job id {where} with {digits!r}")
    count = str(len(found)) if len(found) <= SHOWN else f"more than {SHOWN}"
    named = ", ".join(found[:SHOWN]) + (", ..." if len(found) > SHOWN else "")
    raise fail(
        f"job id {digits!r} is ambiguous: {count} job ids {how} with it ({named}); "
        "give more characters",
        2,
    )
