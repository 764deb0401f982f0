"""A headless Chromium page, for the console's browser tests (Debian's `chromium`, driven
through Playwright's Python package).

`CONSOLE_SCREENSHOTS=docs/images` saves each test's named screenshots there, for the docs;
otherwise they go to the test's temporary directory.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


# The marks of a browser test: `browser`, and skipped, saying why, without the browser.
BROWSER = [
    pytest.mark.browser,
    pytest.mark.skipif(
        not CHROMIUM.exists(),
        reason="needs Debian's chromium at /usr/bin/chromium (apt-get install -y chromium)",
    ),
]


@contextlib.contextmanager
def chromium_page(width: int = 1400, height: int = 900) -> Iterator[Any]:
    """A fresh page of `width` x `height` CSS pixels, in UTC, closed after."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            context = browser.new_context(
                viewport={"width": width, "height": height}, timezone_id="UTC"
            )
            yield context.new_page()
        finally:
            browser.close()


def screenshot(page: Any, tmp_path: Path, name: str) -> Path:
    """Save the page as `name`.png, where `CONSOLE_SCREENSHOTS` says (else `tmp_path`)."""
    folder = Path(os.environ.get("CONSOLE_SCREENSHOTS") or tmp_path)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.png"
    page.screenshot(path=str(path))
    return path


def overflow(page: Any) -> int:
    """How many CSS pixels the page is wider than its viewport (0: no sideways scroll)."""
    return int(
        page.evaluate("document.documentElement.scrollWidth - document.documentElement.clientWidth")
    )
