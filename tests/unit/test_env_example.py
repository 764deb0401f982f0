"""`.env.example` lists every setting with its real default."""

from __future__ import annotations

import re

from support import ROOT

from worker.settings import Settings


def documented() -> dict[str, str | None]:
    found: dict[str, str | None] = {}
    for line in (ROOT / ".env.example").read_text().splitlines():
        if m := re.match(r"^(#\s*)?([A-Z_]+)=(.*)$", line):
            commented, name, value = m.groups()
            found[name] = None if commented else value
    return found


def test_every_setting_is_documented_with_its_default():
    docs = documented()
    for name, field in Settings.model_fields.items():
        alias = field.alias or name
        assert alias in docs, f"{alias} is missing from .env.example"
        value = docs[alias]
        if value is None:  # shown commented out: only for settings unset by default
            assert field.default is None, f"{alias} has a default; show it uncommented"
            continue
        default = field.default
        if isinstance(default, list):
            assert value.split(",") == default, alias
        elif isinstance(default, bool):
            assert value == str(default).lower(), alias
        elif isinstance(default, int | float):
            assert float(value) == float(default), alias
        else:
            assert value == str(default), alias


def test_every_documented_variable_is_a_setting():
    names = {f.alias or n for n, f in Settings.model_fields.items()}
    assert set(documented()) <= names
