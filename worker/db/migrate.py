"""Running the Alembic migrations from code (`worker migrate`, the tests, the demo)."""

from __future__ import annotations

import io
from pathlib import Path

from alembic import command
from alembic.config import Config

# Installed from a wheel, the migrations ship inside the package (`worker/_migrations`, see
# pyproject.toml); in a source checkout (and an editable install) they are `migrations/`.
_PACKAGED = Path(__file__).resolve().parents[1] / "_migrations"
MIGRATIONS = _PACKAGED if _PACKAGED.is_dir() else Path(__file__).resolve().parents[2] / "migrations"


def alembic_config(url: str | None = None) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    cfg.set_main_option("path_separator", "os")
    if url is not None:
        cfg.attributes["url"] = url
    return cfg


def upgrade(url: str, revision: str = "head") -> None:
    command.upgrade(alembic_config(url), revision)


def revisions_after(revision: str | None) -> list[tuple[str, str]]:
    """The migrations `upgrade` applies to a schema at `revision` (None: none yet), oldest
    first, as (id, title)."""
    from alembic.script import ScriptDirectory

    scripts = ScriptDirectory.from_config(alembic_config())
    newer = scripts.iterate_revisions("heads", revision or "base")
    return [(s.revision, (s.doc or "").strip()) for s in reversed(list(newer))]


def head() -> str:
    """The newest migration's id."""
    from alembic.script import ScriptDirectory

    return str(ScriptDirectory.from_config(alembic_config()).get_current_head())


def downgrade(url: str, revision: str = "base") -> None:
    command.downgrade(alembic_config(url), revision)


def upgrade_sql(revision: str = "head") -> str:
    """The SQL `upgrade` would run, for a DBA to review or apply by hand."""
    out = io.StringIO()
    cfg = alembic_config()
    cfg.output_buffer = out
    command.upgrade(cfg, revision, sql=True)
    return out.getvalue()
