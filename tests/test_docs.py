"""The documentation: the site builds without a warning, the README stays a front door, every
relative link in README.md and docs/*.md reaches a file (and heading) that exists, the
generated reference lists every setting and command, and every Python block of a page runs
(against the suite's PostgreSQL) or says, in a comment just above it, why it does not."""

from __future__ import annotations

import html
import json
import os
import re
import shutil
import subprocess
import sys
import unicodedata
from collections import Counter
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
README_MAX_LINES = 250
RUNNER = ROOT / "tests" / "support" / "docs_runner.py"

_FENCE = re.compile(r"^\s*(```|~~~)")
_HEADING = re.compile(r"^(#{1,6})\s+(.+?)\s*#*\s*$")
_CODE_SPAN = re.compile(r"(`+)(.+?)\1")
_LINK = re.compile(r"\[([^\]]*)\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
_PYTHON_FENCE = re.compile(r"^```python\s*$")
_CONSOLE_FENCE = re.compile(r"^```console\s*$")
# Pages whose console blocks run too, each `$ command` in turn: each step can be followed.
CONSOLE_RUN = {"tutorial.md"}
_NOT_RUN = re.compile(r"^<!-- not run: (.+\S) -->$")


def _python_blocks(path: Path) -> list[dict[str, str | None]]:
    """Each ```python block of a page (and ```console one, for the pages in CONSOLE_RUN):
    where it starts, its kind, its code, and why it is not run (the reason of a
    `<!-- not run: ... -->` line just above it) or None."""
    lines = path.read_text(encoding="utf-8").splitlines()
    blocks: list[dict[str, str | None]] = []
    console = path.name in CONSOLE_RUN and path.parent == DOCS
    index = 0
    while index < len(lines):
        kind = "python" if _PYTHON_FENCE.match(lines[index]) else None
        if console and _CONSOLE_FENCE.match(lines[index]):
            kind = "console"
        if kind:
            end = next(i for i in range(index + 1, len(lines)) if lines[i].startswith("```"))
            above = next((lines[i] for i in range(index - 1, -1, -1) if lines[i].strip()), "")
            reason = _NOT_RUN.match(above)
            blocks.append(
                {
                    "where": f"{path.relative_to(ROOT).as_posix()}:{index + 1}",
                    "kind": kind,
                    "code": "\n".join(lines[index + 1 : end]) + "\n",
                    "not_run": reason.group(1) if reason else None,
                }
            )
            index = end
        index += 1
    return blocks


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


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The site as `mkdocs build --strict` makes it."""
    site = tmp_path_factory.mktemp("docs") / "site"
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
    return site


def test_the_site_builds_in_strict_mode_with_every_heading_anchor_where_links_expect_it(
    site: Path,
) -> None:
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


def test_the_readme_s_layout_table_names_every_module() -> None:
    """A newcomer finds each file from the README: a module is named in its folder's row
    (`worker/db/` names `connect.py`), or its subfolder is (`sql/`, `plugins/`)."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text[text.index("## How the code is laid out") :]
    section = section[: section.find("\n## ", 1)]
    rows = re.findall(r"^\| (.+?) \| (.+) \|$", section, re.MULTILINE)
    unnamed = []
    for path in sorted((ROOT / "worker").rglob("*.py")):
        module = path.relative_to(ROOT).as_posix()
        if path.name in ("__init__.py", "__main__.py") or f"`{module}`" in section:
            continue
        named = False
        for folders, what in rows:
            for folder in re.findall(r"`(worker/\S*/)`", folders):
                inner = module.removeprefix(folder)
                if inner != module:
                    sub = inner.partition("/")[0] + "/"
                    named |= f"`{inner}`" in what or ("/" in inner and f"`{sub}`" in what)
        if not named:
            unnamed.append(module)
    assert not unnamed, f"README.md's layout table does not name: {unnamed}"


def test_the_readme_links_into_every_docs_page() -> None:
    linked = {
        (ROOT / target.partition("#")[0]).resolve()
        for target in _relative_links(ROOT / "README.md")
    }
    unlinked = [p.name for p in DOCS.glob("*.md") if p.resolve() not in linked]
    assert not unlinked, f"README.md links to none of: {unlinked}"


def test_the_settings_page_lists_every_setting_with_its_default(site: Path) -> None:
    from worker.settings import Settings

    page = (site / "settings" / "index.html").read_text(encoding="utf-8")
    rows = re.findall(r"<tr>\s*<td><code>([A-Z_]+)</code></td>\s*<td>(.*?)</td>", page)
    listed = dict(rows)
    assert list(listed) == [f.alias for f in Settings.model_fields.values()]
    assert listed["WORKER_CONCURRENCY"] == f"<code>{Settings().concurrency}</code>"


def test_the_cli_page_lists_every_command_and_its_options(site: Path) -> None:
    import typer

    from worker.cli import app

    page = html.unescape((site / "cli" / "index.html").read_text(encoding="utf-8"))
    root = typer.main.get_command(app)
    missing = []
    for name in root.list_commands(root.context_class(root)):
        command = root.get_command(root.context_class(root), name)
        subs = getattr(command, "commands", {}) or {name: command}
        for sub_name, sub in subs.items():
            path = f"worker {name}" if sub is command else f"worker {name} {sub_name}"
            if f"<code>{path}</code>" not in page:
                missing.append(path)
            missing += [
                f"{path} {o}"
                for p in sub.params
                if not getattr(p, "hidden", False)
                for o in p.opts
                if o not in page
            ]
    assert not missing, f"not on docs/cli.md: {missing}"


def test_the_reference_documents_the_public_api(site: Path) -> None:
    import worker
    import worker.testing

    page = (site / "reference" / "index.html").read_text(encoding="utf-8")
    ids = set(re.findall(r'id="([^"]+)"', page))
    expected = {f"worker.{name}" for name in worker.__all__}
    expected |= {"worker.testing.drain", "worker.testing.drain_async"}
    assert expected <= ids, f"not in the reference: {sorted(expected - ids)}"


def _runnable_pages() -> list[Path]:
    return [p for p in _pages() if any(not b["not_run"] for b in _python_blocks(p))]


def test_every_python_block_either_runs_or_says_why_not() -> None:
    # A reason names what the block needs that a page cannot give it, or the test that runs it.
    blocks = [b for p in _pages() for b in _python_blocks(p)]
    assert blocks, "no Python blocks found"
    vague = [b["where"] for b in blocks if b["not_run"] and len(str(b["not_run"])) < 15]
    assert not vague, f"a not-run block with no real reason: {vague}"
    orphans = []
    for page in _pages():
        markers = [
            line for line in page.read_text(encoding="utf-8").splitlines() if _NOT_RUN.match(line)
        ]
        if len(markers) != sum(1 for b in _python_blocks(page) if b["not_run"]):
            orphans.append(page.name)
    assert not orphans, f"a not-run comment with no Python block just under it: {orphans}"


@pytest.mark.parametrize("page", _runnable_pages(), ids=lambda p: p.relative_to(ROOT).as_posix())
def test_the_python_blocks_of_the_page_run_in_order(
    page: Path, database_url: str, pg_server: str, tmp_path: Path
) -> None:
    blocks = [b for b in _python_blocks(page) if not b["not_run"]]
    blocks_file = tmp_path / "blocks.json"
    blocks_file.write_text(json.dumps(blocks), encoding="utf-8")
    cwd = tmp_path / "reader"
    cwd.mkdir()
    env = {
        k: v for k, v in os.environ.items() if not k.startswith("WORKER_") and k != "DATABASE_URL"
    }
    env.update(
        {
            "DATABASE_URL": database_url,
            "TEST_DATABASE_URL": pg_server,  # for a page's own pytest file (worker_database)
            "WORKER_DATA_DIR": str(tmp_path / "data"),
            "WORKER_POLL_MAX": "0.2",
            "PYTHONPATH": os.pathsep.join([str(cwd), str(ROOT / "tests"), str(ROOT)]),
            # The reader's `worker` and `python` are this environment's.
            "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ["PATH"]]),
        }
    )
    done = subprocess.run(
        [sys.executable, str(RUNNER), str(blocks_file)],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]


_CITED_TEST = re.compile(r"`(?:(tests/[\w/]+\.py)::)?(test_\w+)`")


def test_every_test_a_page_cites_exists() -> None:
    # The pages back their claims with the tests that check them: those must be real tests.
    defined: dict[str, set[str]] = {}
    for path in (ROOT / "tests").rglob("test_*.py"):
        names = set(re.findall(r"^(?:async )?def (test_\w+)", path.read_text(), re.MULTILINE))
        defined[path.relative_to(ROOT).as_posix()] = names
    everywhere = set().union(*defined.values())
    missing = []
    for page in _pages():
        for match in _CITED_TEST.finditer(page.read_text(encoding="utf-8")):
            file, name = match.groups()
            if name not in (defined.get(file, set()) if file else everywhere):
                missing.append(f"{page.name}: {match.group(0)}")
    assert not missing, f"cited tests that do not exist: {missing}"


def test_the_status_machine_page_lists_exactly_the_moves_the_suite_allows() -> None:
    from chaos.harness import LEGAL_TRANSITIONS

    rows = re.findall(
        r"^\| (`\w+`|\(new\)) \| `(\w+)` \|",
        (DOCS / "status-machine.md").read_text(encoding="utf-8"),
        re.MULTILINE,
    )
    listed = {(None if old == "(new)" else old.strip("`"), new) for old, new in rows}
    assert listed == LEGAL_TRANSITIONS


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="no systemd-analyze here")
def test_the_systemd_unit_passes_systemd_analyze_verify(tmp_path: Path) -> None:
    installed = Path(sys.executable).parent / "worker"
    text = (ROOT / "deploy" / "durable-worker.service").read_text(encoding="utf-8")
    text = re.sub(r"^ExecStart=\S+/worker", f"ExecStart={installed}", text, flags=re.MULTILINE)
    text = re.sub(r"^WorkingDirectory=.*$", f"WorkingDirectory={tmp_path}", text, flags=re.M)
    unit = tmp_path / "durable-worker.service"
    unit.write_text(text, encoding="utf-8")
    done = subprocess.run(
        ["systemd-analyze", "verify", str(unit)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"ExecStart={installed} run " in text
