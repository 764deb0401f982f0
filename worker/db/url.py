"""Database URLs as text: the libpq form, SQLAlchemy's form, and the form safe to log."""

from __future__ import annotations

import re


def psycopg_url(url: str) -> str:
    """`postgresql+psycopg://...` or `postgres://...` as a plain libpq URL."""
    return re.sub(r"^postgres(ql)?(\+\w+)?://", "postgresql://", url)


def sqlalchemy_url(url: str) -> str:
    """The URL as SQLAlchemy names psycopg 3's dialect."""
    return re.sub(r"^postgresql://", "postgresql+psycopg://", psycopg_url(url))


def redact(url: str) -> str:
    """The URL with its password hidden, for logs and error messages."""
    return re.sub(r"(://[^:/@]+):[^@]*@", r"\1:***@", url)
