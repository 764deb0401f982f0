"""Databases made and dropped by name on one server: the testing fixtures' throwaway ones.

What this does not do: it does not migrate a database (`worker.db.migrate` does) nor decide
names; it connects to the server with a URL of any database the role may connect to.
"""

from __future__ import annotations

from psycopg import sql

from worker.db.connect import connect

APPLICATION_NAME = "durable-worker-tests"

# A database name is an identifier, which no parameter can carry: each statement is composed
# with the name quoted as one.
_CREATE = sql.SQL("CREATE DATABASE {name}")
_CREATE_FROM = sql.SQL("CREATE DATABASE {name} TEMPLATE {template}")
_DROP = sql.SQL("DROP DATABASE IF EXISTS {name} WITH (FORCE)")


def create_database(server_url: str, name: str, template: str | None = None) -> None:
    """Create database `name`, empty or a copy of database `template`."""
    if template is None:
        _execute(server_url, _CREATE.format(name=sql.Identifier(name)))
    else:
        statement = _CREATE_FROM.format(
            name=sql.Identifier(name), template=sql.Identifier(template)
        )
        _execute(server_url, statement)


def drop_database(server_url: str, name: str) -> None:
    """Drop database `name` if it exists, closing the sessions still on it."""
    _execute(server_url, _DROP.format(name=sql.Identifier(name)))


def _execute(server_url: str, statement: sql.Composed) -> None:
    with connect(server_url, APPLICATION_NAME) as conn:
        conn.execute(statement)
