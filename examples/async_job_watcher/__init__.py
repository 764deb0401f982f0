"""The async job watcher: spawn a background export, wait for it, verify it, always clean up.

Run a worker with it and enqueue one job (from the repository root):

    worker run examples.async_job_watcher
    worker enqueue async_job_watcher \\
        --payload '{"delay_seconds": 1.0, "status_file": "/tmp/export.status"}' --wait

Stages, in order (outputs are stored with the job under these names):

1. `spawn_background_job`: starts a detached process that writes the artifact and a status
   file (`PENDING` -> `READY`, with progress, rows and the artifact's SHA-256).
2. `await_job_completion`: reads the status file; until it is `READY` the stage snoozes for
   1.0 s, giving its worker slot back between polls. Deadline: 30 s from its first poll.
3. `verify_exported_artifact`: rows > 0 and the checksum matches the file on disk, or it raises.
4. `cleanup_job_status_file` (`ALL_DONE`): stops the background process if it still runs and
   removes the status file, its `.tmp` and the artifact, whatever happened before; it also runs
   (again) after a worker was lost mid-job, so it is idempotent.

The job's result holds the three stage outputs by stage name.
"""

from __future__ import annotations

import logging
from typing import Any

from examples.async_job_watcher import actions
from examples.async_job_watcher.background import ExportStatus
from worker import Context, Pipeline

POLL_SECONDS = 1.0
WAIT_DEADLINE_SECONDS = 30.0

log = logging.getLogger("examples.async_job_watcher")

watcher = Pipeline("async_job_watcher", result=lambda outputs: dict(outputs))


def _with_outputs(ctx: Context) -> dict[str, Any]:
    """What the actions take: the payload plus the earlier stages' outputs."""
    return {**ctx.payload, "outputs": dict(ctx.outputs)}


@watcher.stage
def spawn_background_job(ctx: Context) -> dict[str, Any]:
    out, msg = actions.spawn_background_job(_with_outputs(ctx))
    log.info("job %s: %s", ctx.job_id, msg)
    ctx.progress(0, rows=0)
    return out


@watcher.stage(deadline=WAIT_DEADLINE_SECONDS)
def await_job_completion(ctx: Context) -> dict[str, Any]:
    out, msg = actions.check_job_status_file(_with_outputs(ctx))
    ctx.progress(out["progress_pct"], rows=out["artifact_rows"])
    if out["job_status"] != ExportStatus.READY:
        ctx.snooze(POLL_SECONDS)  # not a sleep: the slot is free for other jobs meanwhile
    log.info("job %s: %s", ctx.job_id, msg)
    return out


@watcher.stage
def verify_exported_artifact(ctx: Context) -> dict[str, Any]:
    out, msg = actions.verify_exported_artifact(_with_outputs(ctx))
    log.info("job %s: %s", ctx.job_id, msg)
    return out


@watcher.cleanup
def cleanup_job_status_file(ctx: Context) -> dict[str, Any]:
    out, msg = actions.cleanup_job_status_file(_with_outputs(ctx))
    log.info("job %s: %s", ctx.job_id, msg)
    return out
