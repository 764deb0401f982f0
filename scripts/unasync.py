"""Write the blocking twins of the asyncio modules: `python scripts/unasync.py [--check]`.

The client and its kept-connection writes are written once, for asyncio; their blocking
versions are the same code with `async`/`await` removed and each asyncio name replaced by
its blocking counterpart, token by token. With `--check`, nothing is written: the exit
status is 1 if a generated file is not what this script would write now.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# (asyncio source, blocking twin, the twin's module docstring), paths from the root.
FILES = [
    (
        "worker/client/_async.py",
        "worker/client/_sync.py",
        "The blocking client.\n\n"
        "Generated from `worker.client._async`, the one implementation of both: see it for\n"
        "what they do, and edit it (then run `python scripts/unasync.py`), not this file.\n",
    ),
    (
        "worker/db/direct_async.py",
        "worker/db/direct_sync.py",
        "`DirectWrites`: the client's one-statement writes on kept connections, blocking.\n\n"
        "Generated from `worker.db.direct_async`, the one implementation: see it (and\n"
        "`worker.db.direct`) for what it does, and edit it (then run\n"
        "`python scripts/unasync.py`), not this file.\n",
    ),
    (
        "worker/client/wait_async.py",
        "worker/client/wait_sync.py",
        "`wait_done`, the loop behind `Job.wait_sync`.\n\n"
        "Generated from `worker.client.wait_async`, the one implementation: see it for what it\n"
        "does, and edit it (then run `python scripts/unasync.py`), not this file.\n",
    ),
    (
        "worker/db/client_async.py",
        "worker/db/client_sync.py",
        "`Database`: how the blocking client reaches PostgreSQL.\n\n"
        "Generated from `worker.db.client_async`, the one implementation: see it for what it\n"
        "does, and edit it (then run `python scripts/unasync.py`), not this file.\n",
    ),
]

# Applied in order, each to the whole text; names are matched as whole words.
SUBS = [
    (r"\basync def\b", "def"),
    (r"\basync with\b", "with"),
    (r"\basync for\b", "for"),
    (r"\bawait ", ""),
    (r"\basyncio\.sleep\b", "time.sleep"),
    (r"\bAsyncTarget\b", "SyncTarget"),
    (r"\bASYNC_TAKES\b", "SYNC_TAKES"),
    (
        r"\bAsync(Client|Connection|Cursor|Database|DirectWrites|Engine|First|Get|Session|Wake)\b",
        r"\1",
    ),
    (r"\basync_engine\b", "sync_engine"),
    (r"\baconnect\b", "connect"),
    (r"\bloop_owner\b", "no_owner"),
    (r"\b(client|direct|wait)_async\b", r"\1_sync"),
    (r"\bworker\.client\._async\b", "worker.client._sync"),
    (r"\bThe asyncio client\b", "The blocking client"),
    (r"\bfor asyncio, the event loop that opened it\b", "for a blocking one, any thread"),
]


def render(source: str, doc: str) -> str:
    """The blocking twin of the asyncio module at `source`, with `doc` as its docstring."""
    text = (ROOT / source).read_text()
    match = re.match(r'"""(.*?)"""\n', text, re.DOTALL)
    if match is None:
        raise SystemExit(f"{source} does not start with its docstring")
    body = text[match.end() :]
    for pattern, replacement in SUBS:
        body = re.sub(pattern, replacement, body)
    notice = f"# Generated from {source} by scripts/unasync.py: do not edit.\n"
    return f'{notice}"""{doc}"""\n{body}'


def stale() -> list[str]:
    """The generated files that differ from what `render` makes now."""
    return [
        target
        for source, target, doc in FILES
        if not (ROOT / target).exists() or (ROOT / target).read_text() != render(source, doc)
    ]


def main(argv: list[str]) -> int:
    if "--check" in argv:
        out_of_date = stale()
        for target in out_of_date:
            print(f"{target} is out of date: run python scripts/unasync.py", file=sys.stderr)
        return 1 if out_of_date else 0
    for source, target, doc in FILES:
        (ROOT / target).write_text(render(source, doc))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
