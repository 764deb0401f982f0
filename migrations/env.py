"""Alembic environment: migrations run against DATABASE_URL, or the embedded default.

A caller may pass an open connection in `config.attributes["connection"]` (the tests and
`worker migrate` do). The version table lives in the `worker` schema beside the jobs.
"""

from alembic import context
from sqlalchemy import create_engine, pool, text

from worker.db.embedded import database_url
from worker.schema import SCHEMA, metadata
from worker.urls import sqlalchemy_url

config = context.config


def include_name(name, type_, parent_names):  # type: ignore[no-untyped-def]
    if type_ == "schema":
        return name == SCHEMA
    return True


def run_with(connection) -> None:  # type: ignore[no-untyped-def]
    connection.execute(text(f"CREATE SCHEMA IF NOT EXISTS {SCHEMA}"))
    context.configure(
        connection=connection,
        target_metadata=metadata,
        version_table_schema=SCHEMA,
        include_schemas=True,
        include_name=include_name,
        transaction_per_migration=False,
    )
    with context.begin_transaction():
        context.run_migrations()


def run_online() -> None:
    given = config.attributes.get("connection")
    if given is not None:
        run_with(given)
        return
    url = config.attributes.get("url") or database_url()
    # Nothing prepared: the version table's update runs once per revision, and a statement
    # psycopg prepares after a few runs would stay on a pooler's shared session.
    engine = create_engine(
        sqlalchemy_url(url), poolclass=pool.NullPool, connect_args={"prepare_threshold": None}
    )
    with engine.begin() as connection:
        run_with(connection)


def run_offline() -> None:
    context.configure(
        url="postgresql+psycopg://",
        target_metadata=metadata,
        literal_binds=True,
        version_table_schema=SCHEMA,
        dialect_opts={"paramstyle": "named"},
    )
    with context.begin_transaction():
        context.execute(f"CREATE SCHEMA IF NOT EXISTS {SCHEMA}")
        context.run_migrations()


if context.is_offline_mode():
    run_offline()
else:
    run_online()
