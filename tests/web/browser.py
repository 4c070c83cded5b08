"""Headless Chromium for page tests: Debian's /usr/bin/chromium driven by Playwright.

Playwright's own browser download is never used (the machine may be offline):
``executable_path`` points at the system browser that ``scripts/bootstrap.sh``
installs.
"""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import Iterator
from pathlib import Path

from playwright.sync_api import BrowserContext, sync_playwright

CHROMIUM = Path("/usr/bin/chromium")
# Quiet and self-contained: nothing phones home, nothing is shared with a real profile.
FLAGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


@contextlib.contextmanager
def chromium(profile: Path) -> Iterator[BrowserContext]:
    if not CHROMIUM.exists():
        found = shutil.which("chromium")
        raise AssertionError(
            f"no Chromium at {CHROMIUM} (PATH has: {found}); install Debian's package: "
            "scripts/bootstrap.sh does it (apt-get install -y chromium)"
        )
    with sync_playwright() as pw:
        context = pw.chromium.launch_persistent_context(
            str(profile),
            executable_path=str(CHROMIUM),
            headless=True,
            args=FLAGS,
            viewport={"width": 1400, "height": 1000},
        )
        try:
            yield context
        finally:
            context.close()
