"""The blocking client and kept-connection writes are generated from their asyncio sources:
a generated file that is not what `scripts/unasync.py` writes now is a stale twin."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "unasync.py"


def unasync() -> ModuleType:
    spec = importlib.util.spec_from_file_location("unasync", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_generated_twin_is_what_the_script_writes_from_its_source():
    script = unasync()
    for source, target, doc in script.FILES:
        expected = script.render(source, doc)
        assert (ROOT / target).read_text() == expected, (
            f"{target} is stale: run python scripts/unasync.py"
        )


def test_check_mode_exits_zero_when_every_twin_is_current():
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--check"], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr


def test_check_mode_names_a_stale_twin_and_exits_one(tmp_path, monkeypatch):
    script = unasync()
    source = tmp_path / "thing_async.py"
    source.write_text('"""Doc."""\n\nasync def f(c: AsyncClient) -> None:\n    await c.close()\n')
    monkeypatch.setattr(script, "ROOT", tmp_path)
    monkeypatch.setattr(script, "FILES", [("thing_async.py", "thing_sync.py", "Twin.\n")])
    assert script.main(["--check"]) == 1  # not written yet
    assert script.main([]) == 0
    assert script.main(["--check"]) == 0
    generated = (tmp_path / "thing_sync.py").read_text()
    assert "def f(c: Client) -> None:\n    c.close()\n" in generated
    assert '"""Twin.\n"""' in generated and "Generated from thing_async.py" in generated
    source.write_text(source.read_text() + "\n# changed\n")
    assert script.main(["--check"]) == 1


def test_the_blocking_twin_has_no_async_left():
    for _, target, _ in unasync().FILES:
        text = (ROOT / target).read_text()
        assert "await " not in text and "async def" not in text and "async with" not in text
