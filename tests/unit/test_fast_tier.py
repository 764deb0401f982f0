"""The unit tier cannot reach a database by accident (see tests/unit/conftest.py)."""

from __future__ import annotations

import os

import psycopg
import pytest

from worker.db.embedded import LocalPostgres
from worker.settings import get_settings


def test_a_unit_test_connecting_by_accident_is_refused_at_once():
    with pytest.raises(psycopg.OperationalError):
        psycopg.connect(os.environ["DATABASE_URL"], connect_timeout=2)


def test_the_settings_point_at_the_closed_port_and_a_temporary_data_folder(tmp_path):
    settings = get_settings()
    assert settings.database_url == os.environ["DATABASE_URL"]
    assert settings.data_dir == str(tmp_path / "data")


def test_the_embedded_server_is_not_started(tmp_path):
    with pytest.raises(AssertionError, match="needs no database"):
        LocalPostgres(tmp_path / "pg").start()


def test_asking_for_the_test_database_fails_instead_of_starting_a_server(
    request: pytest.FixtureRequest,
) -> None:
    with pytest.raises(pytest.fail.Exception, match="needs no database"):
        request.getfixturevalue("database_url")
