"""Settings, read once from the environment and `.env`.

Every setting is an environment variable listed in `.env.example`. A wrong value stops the
program at start with one line naming the variable and the rule (exit code 2): see
`load_settings`.
"""

from __future__ import annotations

import os
import sys
from enum import StrEnum
from functools import lru_cache
from typing import Annotated, Literal
from urllib.parse import urlsplit

from pydantic import Field, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict
from pydantic_settings import SettingsError as _SourceError

from worker.urls import bad_port, libpq_problem


class SettingsError(Exception):
    """A setting has a value the worker cannot run with; the message names the variable."""


class Pooler(StrEnum):
    """What stands between the worker and PostgreSQL (`DATABASE_POOLER`)."""

    NONE = "none"  # a direct connection, or a pooler in session mode: each session is ours
    # PgBouncer (or alike) in transaction mode: consecutive transactions of one connection may
    # run on different server sessions, so no prepared statement, session SET or LISTEN.
    TRANSACTION = "transaction"


class Settings(BaseSettings):
    """All tunables of durable-worker. Field names map to `WORKER_*` variables (see aliases)."""

    model_config = SettingsConfigDict(
        env_file=".env", env_file_encoding="utf-8", extra="ignore", populate_by_name=True
    )

    database_url: str | None = Field(default=None, alias="DATABASE_URL")
    database_pooler: Pooler = Field(default=Pooler.NONE, alias="DATABASE_POOLER")
    listen_url: str | None = Field(default=None, alias="WORKER_LISTEN_URL")
    data_dir: str = Field(default=".worker-data", alias="WORKER_DATA_DIR")

    poll_min: float = Field(default=0.05, gt=0, alias="WORKER_POLL_MIN")
    poll_max: float = Field(default=2.0, gt=0, alias="WORKER_POLL_MAX")
    max_retries: int = Field(default=3, ge=0, le=1000, alias="WORKER_MAX_RETRIES")
    retry_backoff_base: float = Field(default=1.0, ge=0, alias="WORKER_RETRY_BACKOFF_BASE")
    retry_backoff_max: float = Field(default=300.0, ge=0, alias="WORKER_RETRY_BACKOFF_MAX")
    concurrency: int = Field(default=10, ge=1, le=1000, alias="WORKER_CONCURRENCY")
    processes: int = Field(default=1, ge=1, le=256, alias="WORKER_PROCESSES")
    pin_cpus: bool = Field(default=False, alias="WORKER_PIN_CPUS")
    queues: Annotated[list[str], NoDecode] = Field(default=["default"], alias="WORKER_QUEUES")
    lease_seconds: float = Field(default=15.0, gt=0, alias="WORKER_LEASE_SECONDS")
    shutdown_grace: float = Field(default=10.0, ge=0, alias="WORKER_SHUTDOWN_GRACE")
    task_timeout: float | None = Field(default=None, gt=0, alias="WORKER_TASK_TIMEOUT")
    max_payload_bytes: int = Field(default=1_000_000, gt=0, alias="WORKER_MAX_PAYLOAD_BYTES")
    retention_enabled: bool = Field(default=True, alias="WORKER_RETENTION_ENABLED")
    retention_days: float = Field(default=7.0, gt=0, le=36500, alias="WORKER_RETENTION_DAYS")
    retention_interval: float = Field(default=300.0, gt=0, alias="WORKER_RETENTION_INTERVAL")
    log_format: Literal["text", "json"] = Field(default="text", alias="WORKER_LOG_FORMAT")
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = Field(
        default="INFO", alias="WORKER_LOG_LEVEL"
    )
    api_token: str | None = Field(default=None, alias="WORKER_API_TOKEN")
    metrics_port: int | None = Field(default=None, ge=1, le=65535, alias="WORKER_METRICS_PORT")

    @field_validator("queues", mode="before")
    @classmethod
    def _split_queues(cls, value: object) -> object:
        if isinstance(value, str):
            value = [q.strip() for q in value.split(",") if q.strip()]
        if isinstance(value, list) and not value:
            raise ValueError("must name at least one queue")
        return value

    @field_validator("database_url", "listen_url")
    @classmethod
    def _check_url(cls, value: str | None) -> str | None:
        if value is None or value == "":
            return None
        parts = urlsplit(value)
        scheme = parts.scheme.split("+", 1)[0]
        if scheme not in ("postgresql", "postgres"):
            raise ValueError("must look like postgresql://user:password@host:port/database")
        if bad_port(value) is not None:  # not quoted: a mistyped URL may hold a password there
            raise ValueError("has a port that is not a number")
        if not parts.path.strip("/") and "host=" not in parts.query:
            raise ValueError("must name a database: postgresql://user:password@host:port/database")
        what = libpq_problem(value)
        if what is not None:
            raise ValueError(
                f"is not a URL libpq accepts ({what}; percent-encode special characters in "
                "the user name and password)"
            )
        return value

    @model_validator(mode="after")
    def _check_ranges(self) -> Settings:
        if self.poll_min > self.poll_max:
            raise ValueError("WORKER_POLL_MIN must not be greater than WORKER_POLL_MAX")
        if self.retry_backoff_base > self.retry_backoff_max:
            raise ValueError(
                "WORKER_RETRY_BACKOFF_BASE must not be greater than WORKER_RETRY_BACKOFF_MAX"
            )
        if self.metrics_port is not None and self.metrics_port + self.processes - 1 > 65535:
            raise ValueError(
                "WORKER_METRICS_PORT + WORKER_PROCESSES - 1 must be at most 65535 "
                "(worker process k serves metrics on WORKER_METRICS_PORT + k - 1)"
            )
        if self.pin_cpus and not hasattr(os, "sched_setaffinity"):
            raise ValueError("WORKER_PIN_CPUS needs Linux (it pins with sched_setaffinity)")
        return self


def _describe(error: ValidationError) -> str:
    first = error.errors()[0]
    loc = first.get("loc") or ()
    name = str(loc[0]) if loc else ""
    field = Settings.model_fields.get(name)
    alias = field.alias if field is not None else name
    message = str(first.get("msg", "is invalid")).removeprefix("Value error, ")
    return f"{alias}: {message}" if alias else message


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """The process-wide settings; raises `SettingsError` naming the variable on a bad value."""
    try:
        return Settings()
    except ValidationError as exc:
        raise SettingsError(f"invalid setting {_describe(exc)}") from None
    except _SourceError as exc:
        raise SettingsError(f"invalid setting: {exc}") from None
    except UnicodeDecodeError:
        raise SettingsError("cannot read .env: it is not UTF-8 text") from None


def load_settings_or_exit() -> Settings:
    """For programs: the settings, or one line on stderr and exit code 2."""
    try:
        return get_settings()
    except SettingsError as exc:
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
