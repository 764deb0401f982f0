"""The documentation: the site builds without a warning, the README stays a front door, and
every relative link in README.md and docs/*.md reaches a file (and heading) that exists."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import unicodedata
from collections import Counter
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
README_MAX_LINES = 250

_FENCE = re.compile(r"^\s*(```|~~~)")
_HEADING = re.compile(r"^(#{1,6})\s+(.+?)\s*#*\s*$")
_CODE_SPAN = re.compile(r"(`+)(.+?)\1")
_LINK = re.compile(r"\[([^\]]*)\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")


def _prose_lines(path: Path) -> list[str]:
    """The file's lines outside fenced code blocks (a `# comment` in a fence is no heading)."""
    lines, fenced = [], False
    for line in path.read_text(encoding="utf-8").splitlines():
        if _FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            lines.append(line)
    return lines


def _slugify(heading: str) -> str:
    """A heading's anchor as mkdocs makes it (Python-Markdown's toc: the rendered text,
    lowercased, punctuation but '-' and '_' dropped, runs of spaces and '-' made one '-')."""
    text = _CODE_SPAN.sub(lambda m: m.group(2), heading)
    text = _LINK.sub(lambda m: m.group(1), text)
    text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode("ascii")
    text = re.sub(r"[^\w\s-]", "", text).strip().lower()
    return re.sub(r"[-\s]+", "-", text)


def _anchors(path: Path) -> set[str]:
    """Every heading anchor of a Markdown file; a repeated heading gets `_1`, `_2`, as in toc."""
    seen: Counter[str] = Counter()
    anchors = set()
    for line in _prose_lines(path):
        match = _HEADING.match(line)
        if match:
            slug = _slugify(match.group(2))
            anchors.add(slug if not seen[slug] else f"{slug}_{seen[slug]}")
            seen[slug] += 1
    return anchors


def _relative_links(path: Path) -> list[str]:
    """Link targets in the file's prose that are neither external nor mail addresses."""
    targets = []
    for line in _prose_lines(path):
        for match in _LINK.finditer(_CODE_SPAN.sub("", line)):
            target = match.group(2)
            if not re.match(r"^[a-z][a-z0-9+.-]*:", target, re.IGNORECASE):
                targets.append(target)
    return targets


def _pages() -> list[Path]:
    return [ROOT / "README.md", *sorted(DOCS.glob("*.md"))]


def test_the_site_builds_in_strict_mode_with_every_heading_anchor_where_links_expect_it(
    tmp_path: Path,
) -> None:
    site = tmp_path / "site"
    config = str(ROOT / "mkdocs.yml")
    # Not --quiet: it hides the warnings that strict mode counts.
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", config, "-d", str(site)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    assert done.returncode == 0, done.stdout + done.stderr
    # The link check below computes anchors itself: they must be the ids the site has.
    for page in sorted(DOCS.glob("*.md")):
        html_path = site / ("index.html" if page.stem == "index" else f"{page.stem}/index.html")
        ids = set(re.findall(r'id="([^"]+)"', html_path.read_text(encoding="utf-8")))
        missing = _anchors(page) - ids
        assert not missing, f"{page.name}: headings without these ids in the site: {missing}"


def test_readme_stays_a_front_door_of_at_most_250_lines() -> None:
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines"


@pytest.mark.parametrize("page", _pages(), ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_relative_link_reaches_an_existing_file_and_heading(page: Path) -> None:
    broken = []
    for target in _relative_links(page):
        path_part, _, anchor = target.partition("#")
        dest = (page.parent / path_part).resolve() if path_part else page
        if not dest.exists():
            broken.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
            broken.append(f"{target}: no heading #{anchor} in {dest.relative_to(ROOT)}")
    assert not broken, f"{page.relative_to(ROOT)}: " + "; ".join(broken)


def test_the_readme_links_into_every_docs_page() -> None:
    linked = {
        (ROOT / target.partition("#")[0]).resolve()
        for target in _relative_links(ROOT / "README.md")
    }
    unlinked = [p.name for p in DOCS.glob("*.md") if p.resolve() not in linked]
    assert not unlinked, f"README.md links to none of: {unlinked}"
