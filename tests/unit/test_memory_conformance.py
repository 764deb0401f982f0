"""The driver conformance suite (`support.conformance`) against the in-memory driver.

The same tests run against `PostgresDriver` in `tests/test_driver_conformance.py`: PostgreSQL
is the reference, and a difference is fixed here, in `worker.db.memory`.
"""

from __future__ import annotations

import pytest
from support.conformance import *  # noqa: F403 (the suite's tests, collected here)
from support.conformance import MemoryHarness


@pytest.fixture
def harness() -> MemoryHarness:
    return MemoryHarness()
