"""The stage bookkeeping a pipeline job's runner reads and writes, on the worker's driver.

`DaemonStageStore` is the daemon's `worker.stages.StageStore`: reads go straight to the driver,
writes through `StageWrites` (concurrent jobs' writes share one commit), each under the
worker's `Patience`. A write for a job this worker no longer holds (it was rescued after a
lost heartbeat) writes nothing and raises `JobLost`: that attempt stops there.

What this does not do: it does not decide what a pipeline runs next (`worker.stages` does).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any
from uuid import UUID

from worker.daemon.db import Patience
from worker.daemon.stage_writes import StageWrites
from worker.db.driver import Driver, StageWrite
from worker.db.errors import Refused
from worker.encoding import NotStorable
from worker.models import ClaimedJob, StageHistory, StageKind, StageStatus


def storable_text(text: str) -> str:
    """`text` as PostgreSQL's `text` accepts it: NUL shown as \\0, lone surrogates escaped."""
    if "\x00" in text:
        text = text.replace("\x00", "\\0")
    try:
        text.encode()
    except UnicodeEncodeError:
        text = text.encode("utf-8", "backslashreplace").decode()
    return text


class DaemonStageStore:
    """Stage bookkeeping on the worker's driver (see `stages.StageStore`)."""

    def __init__(self, driver: Driver, patience: Patience, worker_id: UUID) -> None:
        self._driver = driver
        self._patience = patience
        self._worker_id = worker_id
        self._writes = StageWrites(driver, worker_id)  # concurrent jobs' writes share one commit

    async def run(self) -> None:
        """The stage writes' flushers, until cancelled."""
        await self._writes.run()

    async def load(self, job_id: str) -> StageHistory:
        return await self._patience.run("reading stages", lambda: self._driver.load_stages(job_id))

    async def _run(self, doing: str, write: StageWrite) -> float:
        try:
            age = await self._patience.run(doing, lambda: self._writes.write(write))
        except Refused as exc:
            raise NotStorable(f"PostgreSQL refused to store ({exc})") from exc
        if age is None:
            raise JobLost(
                f"this worker no longer holds job {write.job_id} (it was rescued after a lost "
                "heartbeat); the attempt stops here"
            )
        return age

    async def started(
        self, job: ClaimedJob, stage: str, kind: str, attempt: int, waiting: Sequence[str] = ()
    ) -> float:
        write = StageWrite(
            job.id,
            job.retry_count,
            started=stage,
            kind=StageKind(kind),
            attempt=attempt,
            waiting=(*waiting,),
        )
        return await self._run("recording a stage start", write)

    async def finished(
        self,
        job: ClaimedJob,
        stage: str,
        status: str,
        output: Any = None,
        error: str | None = None,
    ) -> None:
        error = storable_text(error) if error is not None else None
        write = StageWrite(
            job.id,
            job.retry_count,
            ended=stage,
            status=StageStatus(status),
            output=output,
            error=error,
        )
        await self._run("recording a stage end", write)

    async def advance(
        self,
        job: ClaimedJob,
        done: str,
        output: Any,
        stage: str,
        kind: str,
        attempt: int,
        waiting: Sequence[str] = (),
    ) -> float:
        write = StageWrite(
            job.id,
            job.retry_count,
            ended=done,
            output=output,
            started=stage,
            kind=StageKind(kind),
            attempt=attempt,
            waiting=(*waiting,),
        )
        return await self._run("recording a stage end and the next start", write)

    async def failed_for_good(self, job: ClaimedJob, error: str) -> None:
        error = storable_text(error)
        held = await self._patience.run(
            "recording a failure",
            lambda: self._driver.record_final_error(
                self._worker_id, job.id, job.retry_count, error
            ),
        )
        if not held:
            raise JobLost(f"this worker no longer holds job {job.id}; the attempt stops here")


class JobLost(Exception):
    """The job was taken from this worker (rescued) while it ran; its attempt stops."""
