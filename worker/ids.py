"""Job ids: made by the client as UUIDv7 text, and read back from whatever a caller passes."""

from __future__ import annotations

import os
import time
from uuid import UUID


def new_job_id() -> str:
    """A UUID version 7 (RFC 9562): 48 bits of Unix milliseconds, then 74 random bits.

    Ids made together sort together, so new rows share primary-key pages (the column default,
    `worker.uuid_v7()`, makes the same kind).

    >>> UUID(new_job_id()).version
    7
    """
    return new_job_ids(1)[0]


def new_job_ids(n: int) -> list[str]:
    """`n` UUIDv7 ids of this millisecond, as text (built as text: a batch makes many)."""
    stamp = f"{time.time_ns() // 1_000_000:012x}"
    head = f"{stamp[:8]}-{stamp[8:]}-7"
    noise = os.urandom(10 * n).hex()  # 20 random hex digits per id, 19 used
    return [
        f"{head}{r[:3]}-{_VARIANT[r[3]]}{r[4:7]}-{r[7:19]}"
        for r in (noise[k : k + 20] for k in range(0, 20 * n, 20))
    ]


# The RFC 9562 variant (binary 10xx) in the top bits of the 17th hex digit, two random below.
_VARIANT = {d: "89ab"[int(d, 16) & 3] for d in "0123456789abcdef"}


def job_id_text(value: str | UUID) -> str | None:
    """The id in its canonical text form, or None if `value` is not a job id at all.

    >>> job_id_text("0B0E3C5E2F4A4C1E9D3B6A1F2E3D4C5B")
    '0b0e3c5e-2f4a-4c1e-9d3b-6a1f2e3d4c5b'
    >>> job_id_text("42") is None
    True
    """
    if isinstance(value, UUID):
        return str(value)
    try:
        return str(UUID(str(value)))
    except ValueError:
        return None
