"""One role's Schemathesis CLI process: started against the live server, read back from its report."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from registry.auth.roles import Role
from tests.stack.api_fuzz.options import EXCLUDED_CHECKS, RESPONSE_SECONDS, SEED, deep, examples
from tests.stack.api_fuzz.world import World, schemathesis_config


@dataclass
class FuzzRun:
    """One role's schemathesis process."""

    role: Role
    process: subprocess.Popen[bytes]
    report: Path
    output: Path
    started: float


@dataclass
class FuzzResult:
    role: Role
    operations: int
    operations_selected: int
    operations_total: int
    cases: int
    failures: list[str]
    errors: list[str]
    seconds: float
    cpu_seconds: float
    output: str

    def summary(self) -> str:
        return (
            f"{self.role.value}: {self.operations}/{self.operations_selected} operations (of {self.operations_total}), {self.cases} cases, "
            f"{len(self.failures)} failures, {len(self.errors)} errors, "
            f"{self.seconds:.0f} s ({self.cpu_seconds:.0f} s CPU)"
        )

    def failure_report(self) -> str:
        """The failures and errors, then schemathesis's own account of them (with curl commands)."""
        detail = self.output
        if "= FAILURES =" in detail or "= ERRORS =" in detail:
            first = min(i for i in (detail.find("= ERRORS ="), detail.find("= FAILURES =")) if i >= 0)
            detail = detail[detail.rfind("\n", 0, first) + 1 :]
        return "\n".join([self.summary(), *self.failures, *self.errors, "", detail[:20_000]])


def phases(role: Role) -> str:
    # The coverage phase (every boundary value and wrong type of every field, deterministic) is
    # the expensive one: the admin, who may call every operation, runs it; every role fuzzes.
    return "examples,coverage,fuzzing" if role == Role.ADMIN or deep() else "examples,fuzzing"


def start(base_url: str, token: str, role: Role, world: World, workdir: Path, paths: list[str]) -> FuzzRun:
    workdir.mkdir(parents=True, exist_ok=True)
    config = workdir / "schemathesis.toml"
    config.write_text(schemathesis_config(world))
    report = workdir / "report.json"
    output = workdir / "output.txt"
    command = [
        sys.executable,
        "-m",
        "schemathesis.cli",
        "--config-file",
        str(config),
        "--no-color",
        "run",
        f"{base_url}/api/schema/",
        "--header",
        f"Authorization: Bearer {token}",
        "--checks",
        "all",
        "--exclude-checks",
        ",".join(EXCLUDED_CHECKS),
        "--phases",
        phases(role),
        "--max-examples",
        str(examples()),
        "--seed",
        str(SEED),
        "--generation-database",
        "none",
        # One request at a time per role, in the order the seed gives.
        "--workers",
        "1",
        "--continue-on-failure",
        "--report",
        "json",
        "--report-json-path",
        str(report),
        "--request-timeout",
        str(RESPONSE_SECONDS),
        "--max-response-time",
        str(RESPONSE_SECONDS),
        "--wait-for-schema",
        "30",
        *paths,
    ]
    with output.open("wb") as sink:
        process = subprocess.Popen(command, stdout=sink, stderr=subprocess.STDOUT, cwd=workdir)  # noqa: S603
    return FuzzRun(role=role, process=process, report=report, output=output, started=time.monotonic())


def finish(run: FuzzRun, *, deadline: float) -> FuzzResult:
    """Wait for the process (os.wait4, for the CPU time it used) and read its JSON report."""
    pid = run.process.pid
    while True:
        waited, status, usage = os.wait4(pid, os.WNOHANG)
        if waited == pid:
            break
        if time.monotonic() > deadline:
            run.process.kill()
            waited, status, usage = os.wait4(pid, 0)
            break
        time.sleep(0.5)
    run.process.returncode = os.waitstatus_to_exitcode(status)
    seconds = time.monotonic() - run.started
    output = run.output.read_text(errors="replace")
    if not run.report.exists():
        pytest.fail(f"{run.role.value}: no report (exit {run.process.returncode}):\n{output[-4000:]}")
    document = json.loads(run.report.read_text())
    operations = document["operations"] or {}
    return FuzzResult(
        role=run.role,
        operations=operations.get("tested", 0),
        operations_selected=operations.get("selected", 0),
        operations_total=operations.get("total", 0),
        cases=document["test_cases"]["generated"],
        failures=[
            f"{group['code']} {group['title']} ({group['count']}x): {', '.join(group['operations'])}"
            for group in document["failures"]
        ],
        errors=[f"{error['title']} ({error['count']}x)" for error in document["errors"]],
        seconds=seconds,
        cpu_seconds=usage.ru_utime + usage.ru_stime,
        output=output,
    )


# The admin's run, with the coverage phase, is the longest by far: it runs as two tests, split by
# path, so that two pytest-xdist workers share it. The second half is "every path but the first
