"""Retry rules without a database: backoffs, their bounds, and what an exception leads to."""

from __future__ import annotations

import pytest

from worker import Backoff, Retry
from worker.retries import RetryRules


def test_backoffs_grow_as_declared_and_stay_within_their_bounds():
    exponential = Backoff.exponential(base=2, max=600, jitter=False)
    assert [exponential.delay(n) for n in range(5)] == [2, 4, 8, 16, 32]
    assert exponential.delay(50) == 600
    assert Backoff.linear(step=5, max=12, jitter=False).delay(1) == 10
    assert Backoff.linear(step=5, max=12, jitter=False).delay(4) == 12
    jittered = Backoff.exponential(base=10, jitter=True)
    assert all(5 <= jittered.delay(0) <= 10 for _ in range(200))
    assert Backoff.exponential(base=1, max=60, jitter=False).delay(10**6) == 60


def test_bad_retry_options_are_refused_naming_the_option():
    with pytest.raises(ValueError, match="max_retries must be an integer"):
        RetryRules(max_retries=-1)
    with pytest.raises(ValueError, match="backoff base must be a number"):
        Backoff.exponential(base=-1)
    with pytest.raises(ValueError, match="give_up_on must be a tuple of exception classes"):
        RetryRules(give_up_on=("ValueError",))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"Retry\(after=...\) must be a number"):
        Retry(after=float("nan"))


def test_retry_asks_for_a_delay_and_counts_as_a_retry():
    rules = RetryRules(backoff=Backoff.constant(7, jitter=False), give_up_on=(KeyError,))
    assert rules.outcome(Retry(after=3), 0, "e").delay == 3
    assert rules.outcome(RuntimeError(), 2, "e").delay == 7
    assert rules.outcome(KeyError(), 0, "e").kind == "failed"
    assert rules.outcome(RuntimeError(), 0, "e").kind == "retry"
    assert RetryRules().outcome(RuntimeError(), 0, "e").delay is None  # the worker's backoff
