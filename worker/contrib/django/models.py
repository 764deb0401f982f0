# mypy: disallow-subclassing-any=False, disallow-untyped-decorators=False
# (Django ships no type hints: its classes are `Any` to mypy.)
"""Read-only Django models of the `worker` schema's tables, for the admin and for queries.

`managed = False`: Django creates, migrates and deletes none of them (`worker migrate` owns the
schema), and the admin allows no add, change or delete: a job changes only through the
client's transitions (retry, cancel), which keep its status machine whole.
"""

from __future__ import annotations

from django.contrib.postgres.fields import ArrayField
from django.db import models

from worker.models import JobStatus, StageKind, StageStatus


def _choices(enum: type[JobStatus] | type[StageStatus] | type[StageKind]) -> list[tuple[str, str]]:
    return [(member.value, member.value) for member in enum]


class Job(models.Model):
    """A row of `worker.jobs`."""

    id = models.UUIDField(primary_key=True)
    queue = models.TextField()
    task = models.TextField()
    payload = models.JSONField()
    status = models.TextField(choices=_choices(JobStatus))
    priority = models.SmallIntegerField()
    run_at = models.DateTimeField()
    retry_count = models.IntegerField()
    max_retries = models.IntegerField(null=True)
    result = models.JSONField(null=True)
    error = models.TextField(null=True)
    created_at = models.DateTimeField()
    started_at = models.DateTimeField(null=True)
    finished_at = models.DateTimeField(null=True)
    worker_id = models.UUIDField(null=True)
    cancel_requested = models.BooleanField()
    unique_key = models.TextField(null=True)
    concurrency_key = models.TextField(null=True)

    class Meta:
        managed = False
        db_table = 'worker"."jobs'  # Django quotes it whole: "worker"."jobs"
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.task} {self.id}"


class Stage(models.Model):
    """A row of `worker.job_stages`: one stage (or cleanup) of a pipeline job.

    The table's key is the pair (job, stage), which Django's admin cannot use; `job` stands as
    the primary key, so look stages up by their job (`job.stages.all()`), never by `pk`.
    """

    job = models.ForeignKey(
        Job,
        on_delete=models.DO_NOTHING,
        db_column="job_id",
        db_constraint=False,
        primary_key=True,
        related_name="stages",
    )
    stage = models.TextField()
    kind = models.TextField(choices=_choices(StageKind))
    status = models.TextField(choices=_choices(StageStatus))
    output = models.JSONField(null=True)
    error = models.TextField(null=True)
    attempt = models.IntegerField()
    started_at = models.DateTimeField()
    finished_at = models.DateTimeField(null=True)

    class Meta:
        managed = False
        db_table = 'worker"."job_stages'
        ordering = ["job", "started_at"]

    def __str__(self) -> str:
        return f"{self.stage} of {self.job_id}"


class WorkerProcess(models.Model):
    """A row of `worker.workers`: a live (or lately lost) worker and its heartbeat."""

    id = models.UUIDField(primary_key=True)
    hostname = models.TextField()
    pid = models.IntegerField()
    queues = ArrayField(models.TextField())
    concurrency = models.IntegerField()
    started_at = models.DateTimeField()
    heartbeat_at = models.DateTimeField()

    class Meta:
        managed = False
        db_table = 'worker"."workers'
        ordering = ["-heartbeat_at"]
        verbose_name = "worker"

    def __str__(self) -> str:
        return f"{self.hostname}:{self.pid}"
