"""`worker workflows`, `worker workflow show` and `worker show` of a held job, against a real
PostgreSQL, in 80 columns."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest
from typer.testing import CliRunner

from worker import Client, Workflow, cli
from worker.settings import get_settings


@pytest.fixture
def narrow_cli(database_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    for name in list(os.environ):
        if name.startswith("WORKER_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("DATABASE_URL", database_url)
    monkeypatch.setattr(cli.out, "width", 80)
    get_settings.cache_clear()
    runner = CliRunner()

    def invoke(*args: str, code: int = 0) -> Any:
        result = runner.invoke(cli.app, list(args))
        assert result.exit_code == code, (result.stdout, result.stderr, result.exception)
        assert "Traceback" not in result.stderr
        return result

    yield invoke
    get_settings.cache_clear()


def _export(database_url: str) -> Any:
    wf = Workflow("export")
    tables = [wf.add("part", {"n": n}, name=f"export_{n}") for n in range(12)]
    verify = wf.add("fan_in", {}, name="verify", after=tables)
    wf.add("finalize", {}, name="clean_up", after=[verify], on_parent_failure="run")
    return wf.enqueue(client=Client(database_url))


def test_workflow_show_draws_the_graph_as_a_tree_in_80_columns(database_url, narrow_cli):
    handle = _export(database_url)
    shown = narrow_cli("workflow", "show", handle.id).stdout
    lines = shown.splitlines()
    assert all(len(line) <= 80 for line in lines), shown
    assert "export" in lines[0] and "12 pending" in lines[0] and "2 held" in lines[0]
    assert any("export_0" in line and "pending" in line for line in lines)
    # The fan-in is drawn once, under its last parent, saying how many it waits for.
    (verify,) = [line for line in lines if "verify" in line]
    assert "held" in verify and "after 12" in verify
    (clean_up,) = [line for line in lines if "clean_up" in line]
    assert clean_up.index("clean_up") > verify.index("verify")


def test_workflows_lists_each_with_its_counts(database_url, narrow_cli):
    handle = _export(database_url)
    listed = narrow_cli("workflows").stdout
    assert all(len(line) <= 80 for line in listed.splitlines()), listed
    (row,) = [line for line in listed.splitlines() if handle.id in line]
    # The counts wrap within their cell at 80 columns; the id is never cut.
    assert "export" in row and "2 held, 12" in row and "pending" in listed


def test_show_of_a_held_job_lists_the_parents_it_waits_for(database_url, narrow_cli):
    handle = _export(database_url)
    shown = narrow_cli("show", handle.jobs["clean_up"].job_id).stdout
    assert "held" in shown
    assert "waiting for" in shown and handle.jobs["verify"].job_id in shown


def test_workflow_show_of_a_bad_or_unknown_id_is_one_line(database_url, narrow_cli):
    bad = narrow_cli("workflow", "show", "nope", code=2)
    assert bad.stderr.strip() == "error: workflow id must be a UUID, not 'nope'"
    missing = narrow_cli("workflow", "show", "01a24656-0327-71ec-9e8c-1ffb08bd5528", code=1)
    assert missing.stderr.strip() == "error: no workflow 01a24656-0327-71ec-9e8c-1ffb08bd5528"
