"""Fixtures for the training tests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest


@pytest.fixture(autouse=True)
def _run_object_store(tmp_path: Path, settings: Any) -> None:
    """Runs keep their deltas and versions in the installation's store (a run cannot choose its
    own): each test gets its own, under tmp_path."""
    settings.OBJECT_STORE_URL = f"file://{tmp_path}"
