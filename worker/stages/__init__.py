"""Pipelines: jobs made of named stages whose outputs are kept across attempts.

`Pipeline` declares the stages (`worker.stages.pipeline`), `StageStore` is where their state
lives (`worker.stages.store`), the runner runs one attempt (`worker.stages.runner`), and how
each run of a stage ended is decided in `worker.stages.endings`. `worker.stages.memory` runs
attempts over stage state in a dict, to test a pipeline without a database.
"""

from worker.db.memory_stages import MemoryStageStore
from worker.models import JobEnding, StageRow
from worker.stages.endings import StageDeadlineExceeded
from worker.stages.memory import MemoryRuntime, run_attempt
from worker.stages.pipeline import Pipeline
from worker.stages.stage import ALL_DONE, ALL_SUCCESS, Stage, TriggerRule
from worker.stages.store import StageStore

__all__ = [
    "ALL_DONE",
    "ALL_SUCCESS",
    "JobEnding",
    "MemoryRuntime",
    "MemoryStageStore",
    "Pipeline",
    "Stage",
    "StageDeadlineExceeded",
    "StageRow",
    "StageStore",
    "TriggerRule",
    "run_attempt",
]
