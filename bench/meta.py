"""What every benchmark's JSON says about the run itself: the commit, when, and how loaded the
machine was (figures on a shared machine move with its load; the load is part of the figure)."""

from __future__ import annotations

import os
import platform
import subprocess
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def _git(*args: str) -> str:
    try:
        done = subprocess.run(  # noqa: S603 (fixed git arguments)
            ["git", *args],  # noqa: S607 (git from PATH, as a developer runs it)
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=10,
            check=True,  # noqa: S607
        )
    except (OSError, subprocess.SubprocessError):
        return ""
    return done.stdout.strip()


def run_meta() -> dict[str, Any]:
    """Commit (with `+dirty` when the tree had changes), UTC date, CPUs and 1/5/15-minute load."""
    commit = _git("rev-parse", "--short=12", "HEAD")
    if commit and _git("status", "--porcelain", "--untracked-files=no"):
        commit += "+dirty"
    return {
        "commit": commit or "unknown",
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "cpus": os.cpu_count(),
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "python": platform.python_version(),
    }
