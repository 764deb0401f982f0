# mypy: disallow-subclassing-any=False, disallow-untyped-decorators=False
# (Django ships no type hints: its classes are `Any` to mypy.)
"""The Django app of durable-worker (`INSTALLED_APPS += ["worker.contrib.django"]`)."""

from __future__ import annotations

from django.apps import AppConfig


class WorkerConfig(AppConfig):
    name = "worker.contrib.django"
    # Not `worker`, nor `django`: app labels must be unique, and these are likely taken.
    label = "durable_worker"
    verbose_name = "Durable worker"
    default_auto_field = "django.db.models.BigAutoField"
