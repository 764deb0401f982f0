"""Stage histories and the attempt that owes its cleanups in each: one table, checked against
`worker.owed_cleanup_attempt` in PostgreSQL and against the in-memory stage store."""

from __future__ import annotations

# (stage, kind, status, attempt) rows, in the order they were written, and the owed attempt.
OWED_CLEANUP_CASES: list[tuple[str, list[tuple[str, str, str, int]], int | None]] = [
    ("no rows", [], None),
    ("a stage ran, no cleanup row yet", [("a", "stage", "completed", 1)], 1),
    (
        "one cleanup done, the next left waiting",
        [
            ("a", "stage", "completed", 1),
            ("t1", "cleanup", "completed", 1),
            ("t2", "cleanup", "waiting", 1),
        ],
        1,
    ),
    (
        "every cleanup done",
        [
            ("a", "stage", "completed", 1),
            ("t1", "cleanup", "completed", 1),
            ("t2", "cleanup", "completed", 1),
        ],
        None,
    ),
    (
        "a cleanup cut off while running",
        [("a", "stage", "failed", 2), ("t1", "cleanup", "running", 2)],
        2,
    ),
    (
        "attempt 1 cleaned up, attempt 2 ran a stage since",
        [
            ("t1", "cleanup", "completed", 1),
            ("a", "stage", "completed", 1),
            ("b", "stage", "failed", 2),
        ],
        2,
    ),
]
