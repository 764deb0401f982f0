# mypy: disallow-subclassing-any=False, disallow-untyped-decorators=False
# (Django ships no type hints: its classes are `Any` to mypy.)
"""The admin pages: jobs (with their stages), stages and workers, all read-only; a job is
retried or cancelled by the admin actions, which call the client as `worker retry` and
`worker cancel` do."""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest

from worker.client import InvalidTransition, JobNotFound
from worker.contrib.django import client
from worker.contrib.django.models import Job, Stage, WorkerProcess


class ReadOnly(admin.ModelAdmin):
    """Shows rows; adds, changes and deletes none (the schema is the worker's)."""

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


class StageInline(admin.TabularInline):
    model = Stage
    fields = ("stage", "kind", "status", "attempt", "started_at", "finished_at", "error")
    readonly_fields = fields
    extra = 0
    can_delete = False

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(Job)
class JobAdmin(ReadOnly):
    list_display = ("id", "task", "queue", "status", "retry_count", "created_at", "finished_at")
    list_filter = ("status", "queue", "task")
    search_fields = ("=id", "task", "unique_key")
    date_hierarchy = "created_at"
    inlines = (StageInline,)
    actions = ("retry_jobs", "cancel_jobs")

    def has_operate_permission(self, request: HttpRequest) -> bool:
        """Who may retry and cancel: users with the `change_job` permission. The admin's own
        change form stays closed to them too; a job changes only through these transitions."""
        return bool(request.user.has_perm("durable_worker.change_job"))

    @admin.action(
        description="Retry the selected jobs (failed or cancelled ones)",
        permissions=["operate"],
    )
    def retry_jobs(self, request: HttpRequest, queryset: QuerySet[Job]) -> None:
        self._each(request, queryset, "retried", lambda job: client(queryset.db).retry(job.id))

    @admin.action(description="Cancel the selected jobs", permissions=["operate"])
    def cancel_jobs(self, request: HttpRequest, queryset: QuerySet[Job]) -> None:
        self._each(request, queryset, "cancelled", lambda job: client(queryset.db).cancel(job.id))

    def _each(self, request: HttpRequest, jobs: QuerySet[Job], done: str, act: Any) -> None:
        ok, refused = 0, []
        for job in jobs:
            try:
                act(job)
                ok += 1
            except (InvalidTransition, JobNotFound) as exc:
                refused.append(str(exc))
        if ok:
            self.message_user(request, f"{ok} job(s) {done}", messages.SUCCESS)
        for reason in refused:
            self.message_user(request, reason, messages.WARNING)


@admin.register(Stage)
class StageAdmin(ReadOnly):
    list_display = ("job", "stage", "kind", "status", "attempt", "started_at", "finished_at")
    list_display_links = None  # a stage has no page of its own: its job's page lists it
    list_filter = ("status", "kind")
    search_fields = ("=job__id", "stage")
    actions = None


@admin.register(WorkerProcess)
class WorkerAdmin(ReadOnly):
    list_display = ("id", "hostname", "pid", "queues", "concurrency", "started_at", "heartbeat_at")
    actions = None
