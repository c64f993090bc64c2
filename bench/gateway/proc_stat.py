"""CPU time of processes from Linux's /proc/<pid>/stat, for `bench gateway`'s CPU per request.

Fields 14-17 of /proc/<pid>/stat (proc(5)) are utime, stime, cutime and cstime in clock ticks:
the process's own user and system time (all its threads), and that of its children it has
waited for. A process tree's total, the live processes' own time plus the time of the children
they reaped, is therefore exact across a window in which children exit or are replaced (a
gunicorn worker respawned, a PostgreSQL backend that disconnected).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

PROC = Path("/proc")
TICKS_PER_SECOND = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


@dataclass(frozen=True)
class ProcStat:
    pid: int
    name: str  # the kernel's comm: "postgres" for every PostgreSQL process, "redis-server"
    ppid: int
    own_ticks: int  # utime + stime
    reaped_children_ticks: int  # cutime + cstime

    @property
    def total_ticks(self) -> int:
        return self.own_ticks + self.reaped_children_ticks


def proc_stat(pid: int) -> ProcStat | None:
    """The process's stat line, or None when it is gone (or /proc is not there)."""
    try:
        raw = (PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    # comm sits in parentheses and may itself contain spaces or ")": split on the last one.
    head, _, tail = raw.rpartition(")")
    name = head.partition("(")[2]
    fields = tail.split()
    # tail starts at field 3 (state): ppid is field 4, utime..cstime are fields 14..17.
    ppid, utime, stime, cutime, cstime = (int(fields[i]) for i in (1, 11, 12, 13, 14))
    return ProcStat(pid, name, ppid, utime + stime, cutime + cstime)


def all_processes() -> list[ProcStat]:
    found = []
    for entry in PROC.iterdir() if PROC.is_dir() else ():
        if entry.name.isdigit():
            stat = proc_stat(int(entry.name))
            if stat is not None:
                found.append(stat)
    return found


def tree_cpu_ticks(root: int, processes: list[ProcStat] | None = None) -> int:
    """CPU ticks of `root` and its live descendants, plus what each of them reaped."""
    processes = all_processes() if processes is None else processes
    children: dict[int, list[ProcStat]] = {}
    by_pid = {p.pid: p for p in processes}
    for p in processes:
        children.setdefault(p.ppid, []).append(p)
    total, stack = 0, [by_pid[root]] if root in by_pid else []
    while stack:
        p = stack.pop()
        total += p.total_ticks
        stack.extend(children.get(p.pid, ()))
    return total


def child_pids(parent: int) -> list[int]:
    return sorted(p.pid for p in all_processes() if p.ppid == parent)


def ticks_to_ms(ticks: float) -> float:
    return ticks * 1000.0 / TICKS_PER_SECOND
