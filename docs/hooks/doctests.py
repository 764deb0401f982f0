"""Docstring examples (`>>>` lines) shown as Python code in the reference, not as prose.

The docstrings keep plain doctest examples, which `doctest` runs; left as they are, Markdown
would read `[('a', 1)]` in an expected output as a link. This hook adds a Markdown
preprocessor, used by every page and by mkdocstrings' docstrings alike, that fences each run
of lines starting at a `>>>` line up to the next blank line.
"""

from __future__ import annotations

import re
from typing import Any

from markdown import Extension, Markdown
from markdown.preprocessors import Preprocessor

_FENCE = re.compile(r"^\s*(```|~~~)")


class _FenceDoctests(Preprocessor):
    def run(self, lines: list[str]) -> list[str]:
        out: list[str] = []
        fenced = in_example = False
        for line in lines:
            if in_example and not line.strip():
                out += ["```", line]
                in_example = False
                continue
            if not in_example and _FENCE.match(line):
                fenced = not fenced
            elif not fenced and not in_example and line.startswith(">>> "):
                out.append("```pycon")
                in_example = True
            out.append(line)
        if in_example:
            out.append("```")
        return out


class DoctestFences(Extension):
    def extendMarkdown(self, md: Markdown) -> None:
        # Before the fenced-code preprocessor (priority 25), so it sees the fences added here.
        md.preprocessors.register(_FenceDoctests(md), "doctest_fences", 30)


def on_config(config: Any, **_: Any) -> Any:
    """The mkdocs hook: the extension joins the site's, which mkdocstrings uses as well."""
    config.markdown_extensions.append(DoctestFences())
    return config
