"""An application's own `worker.py` (or `worker/` package) found before this package.

The `worker` program puts the current directory first on the import path, to import task
modules from there, as `python app.py` does with the application's folder: a `worker` module
there is what the application's `import worker` gets, so its `from worker import task` fails
or, in the program, its own module is silently replaced. The program stops at once instead,
naming the file. What this does not do: it changes no import path and renames nothing.
"""

from __future__ import annotations

import importlib.machinery
import os
from collections.abc import Sequence
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1]  # this package's folder, `worker/`


def shadowing_module(path: Sequence[str]) -> Path | None:
    """The file or folder `import worker` would load from `path` if it is not this package."""
    spec = importlib.machinery.PathFinder.find_spec("worker", list(path))
    if spec is None or spec.origin is None:  # nothing, or folders without __init__.py only
        return None
    found = Path(spec.origin).resolve()
    if found.name == "__init__.py":
        found = found.parent
    return None if found == PACKAGE else found


def shadowing_message(found: Path) -> str:
    """One line naming the module in the way and what to do."""
    try:
        shown = f"./{found.relative_to(Path(os.getcwd()).resolve())}"
    except ValueError:
        shown = str(found)
    if found.is_dir():
        shown += "/"
    return (
        f"{shown} shadows the `worker` package of durable-worker-pg: rename your module "
        "(or move it into a package of yours); see the getting-started guide"
    )
