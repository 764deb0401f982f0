"""durable-worker: a durable background-job worker for Python, backed by PostgreSQL.

from worker import task, enqueue

@task
def add(payload):
    return payload["a"] + payload["b"]

job = enqueue("add", {"a": 1, "b": 2})   # run `worker run mymodule` to process it
assert job.wait_sync(timeout=10) == 3
"""

# The release, in this one place: the build reads it (pyproject's dynamic version) and
# `worker --version` prints it.
__version__ = "0.5.0"

from worker.client import (
    AsyncClient,
    BatchJobs,
    Client,
    InvalidJob,
    InvalidTransition,
    Job,
    JobCancelledError,
    JobError,
    JobFailed,
    JobNotFound,
    JobSpec,
    QueueState,
    cancel,
    cleanup_jobs,
    enqueue,
    enqueue_many,
    resume,
    retry,
)
from worker.middleware import Middleware, add_middleware, remove_middleware
from worker.models import JobEnding, JobStatus, Outcome, OutcomeKind, ProgressEvent
from worker.retries import Backoff, Retry
from worker.stages import ALL_DONE, ALL_SUCCESS, Pipeline, TriggerRule
from worker.tasks import Context, JobCancelled, PauseForResolution, Task, WaitForChildren, task
from worker.workflow import InvalidWorkflow, ParentFailure, Workflow, WorkflowHandle

__all__ = [
    "ALL_DONE",
    "ALL_SUCCESS",
    "AsyncClient",
    "Backoff",
    "BatchJobs",
    "Client",
    "Context",
    "InvalidJob",
    "InvalidTransition",
    "InvalidWorkflow",
    "Job",
    "JobCancelled",
    "JobCancelledError",
    "JobEnding",
    "JobError",
    "JobFailed",
    "JobNotFound",
    "JobSpec",
    "JobStatus",
    "Middleware",
    "Outcome",
    "OutcomeKind",
    "ParentFailure",
    "PauseForResolution",
    "Pipeline",
    "ProgressEvent",
    "QueueState",
    "Retry",
    "Task",
    "TriggerRule",
    "WaitForChildren",
    "Workflow",
    "WorkflowHandle",
    "add_middleware",
    "cancel",
    "cleanup_jobs",
    "enqueue",
    "enqueue_many",
    "remove_middleware",
    "resume",
    "retry",
    "task",
]
