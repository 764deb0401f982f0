"""Pipelines: jobs made of named stages whose outputs are kept across attempts.

`Pipeline` declares the stages (`worker.stages.pipeline`), `StageStore` is where their state
lives (`worker.stages.store`), and the runner runs one attempt (`worker.stages.runner`).
"""

from worker.stages.pipeline import ALL_DONE, ALL_SUCCESS, Pipeline, Stage, TriggerRule
from worker.stages.runner import StageDeadlineExceeded
from worker.stages.store import StageRow, StageStore

__all__ = [
    "ALL_DONE",
    "ALL_SUCCESS",
    "Pipeline",
    "Stage",
    "StageDeadlineExceeded",
    "StageRow",
    "StageStore",
    "TriggerRule",
]
