"""Fixtures for the integration tests: real worker and beat processes (tests/integration/processes.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.integration.processes import Processes


@pytest.fixture
def processes(transactional_db: Any, tmp_path: Path) -> Iterator[Processes]:
    procs = Processes(tmp_path)
    try:
        yield procs
    finally:
        procs.stop_all()
