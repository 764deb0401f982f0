"""What a pipeline is made of, as the runner sees it: a `Stage`, the rule for when it runs, and
the `StageList` protocol the runner reads a pipeline through (`worker.stages.pipeline.Pipeline`
declares one).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Protocol

from worker.models import JSON
from worker.retries import RetryRules


class TriggerRule(StrEnum):
    """When a stage runs. `ALL_SUCCESS`: only if every earlier stage succeeded.
    `ALL_DONE`: after the other stages, whatever happened to them (a cleanup)."""

    ALL_SUCCESS = "all_success"
    ALL_DONE = "all_done"


ALL_DONE = TriggerRule.ALL_DONE
ALL_SUCCESS = TriggerRule.ALL_SUCCESS


@dataclass
class Stage:
    """One stage of a pipeline: its function, when it runs, and its own deadline (seconds)."""

    name: str
    fn: Callable[..., Any]
    rule: TriggerRule
    deadline: float | None
    is_async: bool


class StageList(Protocol):
    """A pipeline as the runner reads it: its name, its stages and how its result is picked."""

    name: str
    result: Callable[[dict[str, JSON]], JSON] | None
    retries: RetryRules

    @property
    def main_stages(self) -> Sequence[Stage]: ...

    @property
    def cleanups(self) -> Sequence[Stage]: ...
