"""How the CLI fails: one red line and an exit code (1, or 2 for bad settings and usage).

Every command is wrapped in `friendly`, which turns each failure an operator can act on (an
unreachable database, a missing schema, a refused value, an unknown job) into that line. A
value the command line gave that is refused (by the client's checks, or out of range) is a
usage error, exit code 2, like one Typer refuses while parsing. What
this does not do: an unexpected error keeps its traceback, since it is a defect to report.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

import typer
from rich.markup import escape

from worker.cli.output import err
from worker.db.errors import CLASSIFIED, Failure, failure
from worker.logs import first_line
from worker.settings import SettingsError

F = TypeVar("F", bound=Callable[..., Any])


class CliError(Exception):
    """An error the user can act on: printed as one line, exit code 1."""


class UsageError(CliError):
    """A value given on the command line that a command refuses: one line, exit code 2."""


def fail(message: str, code: int = 1) -> typer.Exit:
    """Print `message` as the one red line; raise what this returns to exit with `code`."""
    err.print(f"[red]error:[/red] {escape(message)}", highlight=False, soft_wrap=True)
    return typer.Exit(code)


# The line each kind of database failure prints: the error's first line fills the braces.
_FAILURES = {
    Failure.UNAVAILABLE: "cannot reach the database: {}",
    Failure.VALUE_REFUSED: "the database refused a value: {}",
    Failure.NOT_PERMITTED: "the database role may not do this: {}",
    Failure.NO_SCHEMA: "the worker schema is missing: run `worker migrate` first",
}


def friendly(fn: F) -> F:
    """Turn every expected failure into one red line instead of a traceback."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        from worker.client import InvalidJob, InvalidTransition, JobNotFound
        from worker.db.embedded import EmbeddedServerError
        from worker.logs import scrub

        try:
            return fn(*args, **kwargs)
        except SettingsError as exc:
            raise fail(str(exc), 2) from None
        except UsageError as exc:
            raise fail(str(exc), 2) from None
        except (CliError, InvalidTransition, JobNotFound, EmbeddedServerError) as exc:
            raise fail(scrub(str(exc))) from None
        except (InvalidJob, ValueError) as exc:  # a value given on the command line, refused
            raise fail(scrub(str(exc)), 2) from None
        except OverflowError as exc:  # a date or duration past what can be represented
            raise fail(f"out of range: {exc}", 2) from None
        except CLASSIFIED as exc:
            kind = failure(exc)
            if kind is None or kind is Failure.STATEMENT_REFUSED:
                raise  # a statement of ours the database refuses: a defect to report
            raise fail(_FAILURES[kind].format(first_line(exc))) from None

    return wrapper  # type: ignore[return-value]
