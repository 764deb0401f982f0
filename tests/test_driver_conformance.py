"""The driver conformance suite (`support.conformance`) against `PostgresDriver`, the
reference the in-memory driver is held to (it runs the same suite in
`tests/unit/test_memory_conformance.py`)."""

from __future__ import annotations

import pytest
from support.conformance import *  # noqa: F403 (the suite's tests, collected here)
from support.conformance import PostgresHarness


@pytest.fixture
def harness(database_url: str) -> PostgresHarness:
    return PostgresHarness(database_url)
