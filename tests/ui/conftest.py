"""The browser fixture: Debian's headless Chromium driven by Playwright (never a downloaded browser)."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator

import pytest
from django.db import connections
from playwright.sync_api import Browser, sync_playwright

CHROMIUM = os.environ.get("CHROMIUM_PATH") or shutil.which("chromium") or "/usr/bin/chromium"
# The flags keep Chromium off the network it cannot reach from here.
CHROMIUM_ARGS = [
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


@pytest.fixture
def browser() -> Iterator[Browser]:
    # Playwright's sync API runs an event loop in this thread; the ORM calls the
    # test makes around it are still synchronous, which Django must be told.
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield browser
        finally:
            browser.close()
            # ORM calls made while Playwright's loop runs get connections of their
            # own (Django keys them per async context); close them here, in that
            # context, or the test database cannot be dropped at the end.
            connections.close_all()
    os.environ.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)
