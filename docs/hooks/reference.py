"""The generated parts of the site, made from the code at every build so they cannot go stale.

A page asks for one with a marker line: `<!-- generated: settings -->` becomes the table of
every field of `worker.settings.Settings` (its variable, default and rule from the class, its
meaning from the comment above it in `.env.example`, which a unit test keeps complete);
`<!-- generated: cli -->` becomes the reference of every command of the `worker` program,
walked from its Typer app; `<!-- generated: sql worker.db.sql.claim.CLAIM -->` becomes that
statement as the worker sends it, under the comment its module gives it.
`python docs/hooks/reference.py settings|cli|sql NAME` prints one of them.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
MARKER = re.compile(r"^<!-- generated: (settings|cli|sql) ?([\w.]*) -->$", re.MULTILINE)
_VARIABLE = re.compile(r"^#?\s*([A-Z][A-Z0-9_]*)=")


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ").strip()


def env_example_meanings(path: Path = ROOT / ".env.example") -> dict[str, str]:
    """Each variable of `.env.example` with the comment block above it (shared by a group)."""
    meanings: dict[str, str] = {}
    comment: list[str] = []
    after_variable = False
    for line in path.read_text(encoding="utf-8").splitlines():
        match = _VARIABLE.match(line)
        if match:
            meanings[match.group(1)] = " ".join(comment)
            after_variable = True
        elif line.startswith("#"):
            if after_variable:
                comment, after_variable = [], False
            comment.append(line.lstrip("#").strip())
        else:
            comment, after_variable = [], False
    return meanings


def _rule(field: Any) -> str:
    """The type and bounds pydantic checks, as a reader would write them."""
    annotation = field.annotation
    if getattr(annotation, "__origin__", None) is list:
        return "comma-separated list"
    name = getattr(annotation, "__name__", None) or str(annotation)
    name = str(name).replace("typing.", "").replace("NoneType", "None")
    if name.startswith("Literal"):
        name = "one of " + ", ".join(f"`{v}`" for v in annotation.__args__)
    else:
        name = f"`{name}`"
    bounds = []
    for meta in field.metadata:
        for attr, sign in (("gt", ">"), ("ge", "≥"), ("lt", "<"), ("le", "≤")):
            value = getattr(meta, attr, None)
            if value is not None:
                bounds.append(f"{sign} {value}")
    return name + (f" ({', '.join(bounds)})" if bounds else "")


def _default(field: Any) -> str:
    value = field.default
    if value is None:
        return "unset"
    if isinstance(value, list):
        value = ",".join(value)
    if isinstance(value, bool):
        value = str(value).lower()
    return f"`{value}`"


def settings_table() -> str:
    """The Markdown table of every setting, in the order `Settings` declares them."""
    from worker.settings import Settings

    meanings = env_example_meanings()
    rows = ["| variable | default | rule | meaning |", "|---|---|---|---|"]
    previous: tuple[str, str] = ("", "")
    for name, field in Settings.model_fields.items():
        variable = field.alias or name.upper()
        meaning = field.description or meanings.get(variable, "")
        if meaning and meaning == previous[1]:
            shown = f"as `{previous[0]}`"  # one comment of .env.example covers a group
        else:
            previous, shown = (variable, meaning), meaning
        meaning = shown
        rows.append(
            f"| `{variable}` | {_default(field)} | {_cell(_rule(field))} | {_cell(meaning)} |"
        )
    return "\n".join(rows)


def _context(command: Any, path: list[str]) -> Any:
    # Typer may carry its own copy of click: the command's own context class, not click's.
    return command.context_class(command, info_name=" ".join(path))


def _is_group(command: Any) -> bool:
    return hasattr(command, "list_commands")


def _commands(command: Any, path: list[str]) -> list[tuple[list[str], Any]]:
    found = [(path, command)]
    if _is_group(command):
        ctx = _context(command, path)
        for name in command.list_commands(ctx):
            sub = command.get_command(ctx, name)
            if sub is not None and not sub.hidden:
                found += _commands(sub, [*path, name])
    return found


def _parameter_row(param: Any, ctx: Any) -> str | None:
    if getattr(param, "hidden", False):
        return None
    record = param.get_help_record(ctx)
    if param.param_type_name == "argument":
        name = (record[0] if record else None) or param.metavar or param.name.upper()
        help_text = (record[1] if record else "") or ("" if param.required else "(optional)")
    elif record is None:
        return None
    else:
        name, help_text = record
    return f"| {_cell(f'`{name}`')} | {_cell(help_text)} |"


def cli_reference() -> str:
    """Every `worker` command: its usage line, its help and its options, from the Typer app."""
    import typer

    from worker.cli import app

    root = typer.main.get_command(app)
    blocks = []
    for path, command in _commands(root, ["worker"]):
        if _is_group(command) and path != ["worker"]:
            blocks.append(f"### `{' '.join(path)}`\n\n{command.help or ''}".rstrip())
            continue
        ctx = _context(command, path)
        usage = command.get_usage(ctx).removeprefix("Usage: ")
        rows = [row for p in command.get_params(ctx) if (row := _parameter_row(p, ctx))]
        title = "worker" if path == ["worker"] else " ".join(path)
        parts = [f"### `{title}`", f"```console\n$ {usage}\n```", (command.help or "").strip()]
        if rows:
            parts.append("\n".join(["| option | meaning |", "|---|---|", *rows]))
        blocks.append("\n\n".join(p for p in parts if p))
    return "\n\n".join(blocks)


def sql_statement(dotted: str) -> str:
    """A named statement of `worker/db/sql/` in a SQL block, its module's comment above it."""
    import importlib

    module_name, _, name = dotted.rpartition(".")
    module = importlib.import_module(module_name)
    statement = getattr(module, name)
    source = Path(str(module.__file__)).read_text(encoding="utf-8").splitlines()
    start = next(i for i, line in enumerate(source) if line.startswith(f"{name} = "))
    comment: list[str] = []
    for line in reversed(source[:start]):
        if not line.startswith("#"):
            break
        comment.insert(0, "-- " + line.lstrip("#").strip())
    body = "\n".join(line.rstrip() for line in statement.strip("\n").splitlines())
    return "```sql\n" + "\n".join([*comment, body]) + "\n```"


GENERATORS = {"settings": settings_table, "cli": cli_reference}


def on_page_markdown(markdown: str, **_: Any) -> str:
    """The mkdocs hook: each marker line replaced by what it names, made now."""
    if "<!-- generated:" not in markdown:
        return markdown
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    return MARKER.sub(lambda m: _generate(m.group(1), m.group(2)), markdown)


def _generate(kind: str, argument: str) -> str:
    return sql_statement(argument) if kind == "sql" else GENERATORS[kind]()


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    print(_generate(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else ""))
