"""`manage.py bench` answers a database it cannot reach with one readable line, not a traceback."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.postgres
def test_a_bench_against_a_database_not_created_yet_says_so_in_one_line() -> None:
    base = os.environ["DATABASE_URL"].rsplit("/", 1)[0]
    env = {**os.environ, "DATABASE_URL": f"{base}/sw_no_such_database_for_bench"}
    env.pop("DJANGO_SETTINGS_MODULE", None)
    done = subprocess.run(
        [sys.executable, "manage.py", "bench", "gateway", "--requests", "500"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("manage.py bench gateway: the database is unavailable:")
    assert "sw_no_such_database_for_bench" in lines[0] and "does not exist" in lines[0]
