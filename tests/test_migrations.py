"""The migrations build exactly the tables in worker/schema.py, and round-trip."""

from __future__ import annotations

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import create_engine
from support import query

from worker.db import migrate
from worker.schema import SCHEMA, metadata
from worker.urls import sqlalchemy_url


def schema_diff(url: str) -> list[object]:
    engine = create_engine(sqlalchemy_url(url))
    try:
        with engine.connect() as conn:
            context = MigrationContext.configure(
                conn,
                opts={
                    "include_schemas": True,
                    "include_name": lambda name, type_, parents: (
                        type_ != "schema" or name == SCHEMA
                    ),
                    "version_table_schema": SCHEMA,
                },
            )
            return list(compare_metadata(context, metadata))
    finally:
        engine.dispose()


def test_migrations_match_the_table_definitions(empty_database_url):
    migrate.upgrade(empty_database_url)
    assert schema_diff(empty_database_url) == []


@pytest.mark.smoke
def test_upgrade_downgrade_upgrade_round_trips(empty_database_url):
    url = empty_database_url
    migrate.upgrade(url)
    query(url, "SELECT worker.enqueue('add', '{\"a\": 1}')")
    migrate.downgrade(url, "base")
    assert query(url, "SELECT to_regclass('worker.jobs')") == [(None,)]
    migrate.upgrade(url)
    assert query(url, "SELECT count(*) FROM worker.jobs") == [(0,)]
    assert schema_diff(url) == []


def test_0018_downgrade_puts_back_the_rule_0017_ran(empty_database_url):
    """0018's downgrade leaves 0016's `worker.parents_ended()`, as 0017 had it: a child's
    failed parents counted, no loop, no re-arm."""
    url = empty_database_url
    definition = "SELECT pg_get_functiondef('worker.parents_ended(uuid[], text[])'::regprocedure)"
    migrate.upgrade(url, "0017")
    at_0017 = query(url, definition)
    migrate.upgrade(url)
    (now,) = query(url, definition)[0]
    assert "failed_parents" in now and "worker.settling" in now and "not needed" in now
    migrate.downgrade(url, "0017")
    assert query(url, definition) == at_0017
    assert query(url, "SELECT to_regproc('worker.parents_retried')") == [(None,)]
    migrate.upgrade(url)
    assert schema_diff(url) == []


@pytest.mark.smoke
def test_plain_insert_is_a_complete_enqueue(database_url):
    (row,) = query(
        database_url,
        "INSERT INTO worker.jobs (task) VALUES ('add') RETURNING "
        "queue, payload, status, priority, retry_count, run_at <= now()",
    )
    assert row == ("default", {}, "pending", 0, 0, True)


def test_upgrade_sql_can_be_printed_for_a_dba():
    text = migrate.upgrade_sql()
    assert "CREATE TABLE worker.jobs" in text
    assert "CREATE TRIGGER jobs_notify" in text
