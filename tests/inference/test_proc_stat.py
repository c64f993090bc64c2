"""bench.gateway.proc_stat reads CPU time from /proc the way `bench gateway` counts it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench.gateway import proc_stat
from bench.gateway.proc_stat import TICKS_PER_SECOND, child_pids, tree_cpu_ticks

pytestmark = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="Linux /proc only")

# A child that spends CPU_SECONDS of its own CPU time (not wall-clock time), then waits for stdin.
CPU_SECONDS = 0.3
BURN = (
    "import sys, time\n"
    f"t = time.process_time()\nwhile time.process_time() - t < {CPU_SECONDS}: pass\n"
    "print('burnt', flush=True)\nsys.stdin.read()\n"
)


def test_it_names_the_process_and_its_parent() -> None:
    stat = proc_stat.proc_stat(os.getpid())
    assert stat is not None and stat.ppid == os.getppid()
    assert proc_stat.proc_stat(2**22 + 1) is None  # above pid_max: no such process


def test_a_name_with_spaces_and_parentheses_is_read_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "42").mkdir()
    fields = ["S", "7"] + ["0"] * 9 + ["11", "12", "13", "14"] + ["0"] * 30
    (tmp_path / "42" / "stat").write_text(f"42 (odd) name (x)) {' '.join(fields)}\n")
    monkeypatch.setattr(proc_stat, "PROC", tmp_path)
    stat = proc_stat.proc_stat(42)
    assert stat is not None
    assert (stat.name, stat.ppid, stat.own_ticks, stat.reaped_children_ticks) == ("odd) name (x)", 7, 23, 27)


def _children_ticks() -> int:
    """This process's tree less its own time: what its children (live or reaped) used."""
    own = proc_stat.proc_stat(os.getpid())
    assert own is not None
    return tree_cpu_ticks(os.getpid()) - own.own_ticks


def test_a_tree_counts_its_live_children_and_the_children_it_reaped() -> None:
    before = _children_ticks()
    child = subprocess.Popen(  # noqa: S603 (our interpreter, fixed code)
        [sys.executable, "-c", BURN], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    spent = CPU_SECONDS * TICKS_PER_SECOND - 2  # less a tick of rounding in utime and stime
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "burnt"
        assert child.pid in child_pids(os.getpid())
        assert _children_ticks() - before >= spent  # alive: its own time is in the tree
    finally:
        child.communicate("")
    # Reaped: its time moved into this process's cutime and cstime, and still counts.
    assert child.pid not in child_pids(os.getpid())
    assert _children_ticks() - before >= spent
