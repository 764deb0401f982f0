# mypy: disallow-subclassing-any=False, disallow-untyped-decorators=False
# (Django ships no type hints: its classes are `Any` to mypy.)
"""`manage.py worker ARGS`: the `worker` program with ARGS, on Django's default database
(`DATABASES["default"]`, given to it as `DATABASE_URL`).

    python manage.py worker jobs --status failed
    python manage.py worker run myapp.tasks
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from worker.contrib.django import database_url


class Command(BaseCommand):
    help = "Run the worker program (worker --help) on Django's database."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("args", nargs=argparse.REMAINDER, help="the worker program's")

    def run_from_argv(self, argv: list[str]) -> None:
        # Every argument is the program's own (even `--help`), not Django's.
        self.handle(*argv[2:])

    def handle(self, *args: Any, **options: Any) -> None:
        from worker.cli import main
        from worker.settings import get_settings

        saved = sys.argv, os.environ.get("DATABASE_URL")
        sys.argv = ["manage.py worker", *map(str, args)]
        os.environ["DATABASE_URL"] = database_url()
        get_settings.cache_clear()  # read again, with Django's database
        try:
            main()
        except SystemExit as exc:
            if exc.code not in (0, None):
                raise
        finally:
            sys.argv = saved[0]
            if saved[1] is None:
                os.environ.pop("DATABASE_URL", None)
            else:
                os.environ["DATABASE_URL"] = saved[1]
            get_settings.cache_clear()
