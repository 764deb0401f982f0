"""Settings of the Django example: one app (`shop`), the database from `DATABASE_URL`."""

from __future__ import annotations

import os
from urllib.parse import unquote, urlsplit

from worker.db.embedded import database_url


def _database(url: str) -> dict[str, object]:
    """Django's DATABASES entry for a libpq URL (postgresql://user:password@host:port/name)."""
    parts = urlsplit(url)
    return {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": parts.path.lstrip("/"),
        "USER": unquote(parts.username or ""),
        "PASSWORD": unquote(parts.password or ""),
        "HOST": parts.hostname or "",
        "PORT": str(parts.port or ""),
    }


SECRET_KEY = os.environ.get("DJANGO_SECRET_KEY", "example-only-not-secret")
DEBUG = False
ALLOWED_HOSTS = ["localhost", "127.0.0.1", "testserver"]
ROOT_URLCONF = "examples.django_app.urls"
INSTALLED_APPS = ["examples.django_app.shop"]
MIDDLEWARE: list[str] = []
DATABASES = {"default": _database(os.environ.get("DATABASE_URL") or database_url())}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
USE_TZ = True
