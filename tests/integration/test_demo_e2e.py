"""`manage.py demo --quick` end to end: the whole demo as `make demo` runs it, every stage shortened.

The demo runs as a real subprocess on its embedded defaults (SQLite, the filesystem broker, the
file object store), all under a scratch SWITCHYARD_VAR_DIR, with DATABASE_URL and REDIS_URL
unset: it shares nothing with the test session. The test follows the demo's `stage <name>: done`
lines, asserts each stage's outcome over HTTP from the demo's own /api/ (logged in as the admin
the demo seeds), then sends SIGINT and asserts a clean exit with none of its processes left.

The waits are bounded only so that a broken demo fails instead of hanging; nothing here times
the demo (`make demo`'s pace on a shared machine is no test's business).
"""

from __future__ import annotations

import http.cookiejar
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings

# One of the suite's trainers, which one pytest-xdist worker runs one after another
# (tests/xdist_workers.py, SERIAL_GROUPS).
pytestmark = pytest.mark.integration

MANAGE = str(Path(settings.BASE_DIR) / "manage.py")
# The order in which the demo finishes its stages (stack/management/commands/demo.py).
STAGES = ("probes", "replay", "training", "serving", "drill")
# Generous: `demo --quick` took 2½ to 3½ minutes on a loaded 2-core machine.
WHOLE_DEMO_S = 900.0
API_WAIT_S = 120.0
STOP_WAIT_S = 60.0
ADMIN_PASSWORD = "demo-e2e-admin-password"  # noqa: S105 (a throwaway scratch-dir admin)
# Settings the test session may carry that would point the demo away from its embedded defaults.
NOT_INHERITED = (
    "DATABASE_URL",
    "REDIS_URL",
    "CELERY_BROKER_URL",
    "OBJECT_STORE_URL",
    "SWITCHYARD_RATE_LIMIT_REDIS_URL",
    "SWITCHYARD_ENV",
    "SECRET_KEY",
)


def _free_base_port() -> int:
    """A port p with p, p+100, p+101 and p+200..p+202 free: the web server, the two model
    replicas and the three loopback providers of the demo (stack.demo.seed)."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            base = int(s.getsockname()[1])
        if base + 202 > 65535:
            continue
        if all(_port_free(base + offset) for offset in (0, 100, 101, 200, 201, 202)):
            return base
    raise RuntimeError("no free block of ports for the demo")


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


class Demo:
    """The demo subprocess: its output file, its stage lines and its process groups."""

    def __init__(self, scratch: Path, port: int) -> None:
        self.scratch = scratch
        self.port = port
        self.base = f"http://127.0.0.1:{port}"
        self.output = scratch / "demo.out"
        self.env = {k: v for k, v in os.environ.items() if k not in NOT_INHERITED}
        self.env.update(
            {
                "SWITCHYARD_VAR_DIR": str(scratch / "var"),
                "DEMO_ADMIN_PASSWORD": ADMIN_PASSWORD,
                "PYTHONUNBUFFERED": "1",
            }
        )
        self.process: subprocess.Popen[bytes] | None = None

    def manage(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(  # noqa: S603 (our own manage.py)
            [sys.executable, MANAGE, *args],
            cwd=self.scratch,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )

    def start(self) -> None:
        with self.output.open("wb") as out:
            self.process = subprocess.Popen(  # noqa: S603 (our own manage.py)
                [sys.executable, MANAGE, "demo", "--quick", "--port", str(self.port)],
                cwd=self.scratch,
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
                # Its own process group: the teardown can kill whatever a failed test leaves.
                start_new_session=True,
            )

    def text(self) -> str:
        return self.output.read_text(errors="replace")

    def wait_for_stage(self, stage: str, deadline: float) -> None:
        assert self.process is not None
        line = f"stage {stage}: done"
        while line not in self.text():
            if self.process.poll() is not None:
                pytest.fail(f"the demo exited {self.process.returncode} before {stage!r}:\n{self.tail()}")
            if time.monotonic() > deadline:
                pytest.fail(f"the demo did not finish {stage!r} in time:\n{self.tail()}")
            time.sleep(1)

    def child_groups(self) -> set[int]:
        """Process groups of the children the demo printed (each starts its own session)."""
        return {int(pid) for pid in re.findall(r"^started \S+ \(pid (\d+)\)", self.text(), re.M)}

    def tail(self) -> str:
        lines = self.text().splitlines()[-60:]
        logs = self.scratch / "var" / "demo-logs"
        for log in sorted(logs.glob("*.log")) if logs.exists() else []:
            lines += [f"--- {log.name}", *log.read_text(errors="replace").splitlines()[-15:]]
        return "\n".join(lines)

    def kill(self) -> None:
        """Teardown after a failure: nothing the demo started outlives the test."""
        groups = self.child_groups()
        if self.process is not None:
            groups.add(self.process.pid)
        for group in groups:
            try:
                os.killpg(group, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        if self.process is not None:
            self.process.wait(timeout=STOP_WAIT_S)


def _live_processes_in(groups: set[int]) -> list[str]:
    """Processes (not zombies) whose process group is one of `groups`, from /proc."""
    live = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue  # gone meanwhile
        # pid (comm) state ppid pgrp ...: comm may hold spaces, so split after its ")".
        fields = stat.rpartition(")")[2].split()
        if fields[0] != "Z" and int(fields[2]) in groups:
            live.append(f"{entry.name} {stat.partition(')')[0]})")
    return live


class Api:
    """The demo's /api/ as its admin sees it: a session from the login page, as a browser gets."""

    def __init__(self, base: str) -> None:
        self.base = base
        self.jar = http.cookiejar.CookieJar()
        self.opener = urllib.request.build_opener(
            urllib.request.ProxyHandler({}),  # loopback: never through a configured proxy
            urllib.request.HTTPCookieProcessor(self.jar),
        )

    def login(self, username: str, password: str) -> None:
        self.opener.open(f"{self.base}/login/", timeout=30).read()
        csrf = next(c.value for c in self.jar if c.name == "csrftoken")
        form = urllib.parse.urlencode(
            {"username": username, "password": password, "csrfmiddlewaretoken": csrf}
        ).encode()
        request = urllib.request.Request(  # noqa: S310 (loopback)
            f"{self.base}/login/", data=form, headers={"Referer": f"{self.base}/login/"}
        )
        self.opener.open(request, timeout=30).read()
        assert any(c.name == "sessionid" for c in self.jar), "the demo's admin could not log in"

    def get(self, path: str) -> Any:
        with self.opener.open(f"{self.base}{path}", timeout=30) as response:
            return json.load(response)

    def text(self, path: str) -> str:
        with self.opener.open(f"{self.base}{path}", timeout=30) as response:
            return str(response.read().decode())

    def rows(self, path: str) -> list[dict[str, Any]]:
        return list(self.get(path)["results"])


def _eventually(check: Callable[[], Any], what: str, timeout: float = API_WAIT_S) -> Any:
    """Poll `check` until it returns something truthy (what lands asynchronously: ledger rows,
    folded failover events); bounded only to fail instead of hanging."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"{what} did not show in the API")
        time.sleep(1)


@pytest.fixture
def demo(tmp_path: Path) -> Iterator[Demo]:
    running = Demo(tmp_path, _free_base_port())
    try:
        yield running
    finally:
        if running.process is not None and running.process.poll() is None:
            running.kill()


def test_the_quick_demo_runs_every_stage_end_to_end_and_stops_cleanly(demo: Demo) -> None:
    migrated = demo.manage("migrate", "--no-input", "-v", "0")
    assert migrated.returncode == 0, migrated.stdout + migrated.stderr
    # Everything lands in the scratch directory: its SQLite file, broker and object store.
    assert (demo.scratch / "var" / "switchyard.sqlite3").exists()

    demo.start()
    deadline = time.monotonic() + WHOLE_DEMO_S
    demo.wait_for_stage("probes", deadline)
    api = Api(demo.base)
    api.login("admin", ADMIN_PASSWORD)

    # Probes: one job on each demo cluster, both succeeded with a loss curve.
    probes = api.rows("/api/probe-jobs/")
    assert sorted(p["cluster"] for p in probes) == ["aws-g5-use1", "onprem-a100"]
    assert {p["status"] for p in probes} == {"succeeded"}, probes
    assert all(p["loss_curve"] and p["final_loss"] is not None for p in probes)

    # The cost-quality part: the tickets' replay succeeded and derived a recommendation.
    demo.wait_for_stage("replay", deadline)
    studies = api.rows("/api/replay-studies/")
    assert [(s["workflow"], s["state"]) for s in studies] == [("ticket-labels", "succeeded")], studies
    recommendations = api.rows("/api/recommendations/")
    assert recommendations, "the replay study proposed no change"
    assert {r["workflow"] for r in recommendations} == {"ticket-labels"}

    # The short DiLoCo run reached its final state and registered its model's versions.
    demo.wait_for_stage("training", deadline)
    [run] = api.rows("/api/training-runs/")
    assert run["state"] == "succeeded", run
    assert run["registered_model"]
    assert run["final_eval_loss"] < run["initial_eval_loss"]
    detail = api.get(f"/api/training-runs/{run['id']}/")
    assert detail["config"]["stop"]["outer_steps"] == 20  # the quick run (QUICK_SCALE)
    versions = detail["model_versions"]
    assert any(v["final"] for v in versions), versions
    assert {v["model"] for v in versions} == {run["registered_model"]}

    # Serving: both replicas of the trained model behind local-chat, which answered the drill
    # (its requests are in the ledger, through the /v1 gateway).
    demo.wait_for_stage("serving", deadline)
    demo.wait_for_stage("drill", deadline)
    workflow = api.get("/api/workflows/local-chat/")
    assert workflow["slug"] == "local-chat"
    for slug in ("gpt-byte-local", "gpt-byte-local-aws"):
        assert api.get(f"/api/deployments/{slug}/")["model"] == run["registered_model"]
    usage = _eventually(
        lambda: api.text("/api/usage-export/?format=jsonl&workflow=local-chat").strip(),
        "local-chat's usage rows",
    )
    assert "gpt-byte-local" in usage

    # The chaos drill: the primary failed half its calls; the gateway failed over.
    events = _eventually(
        lambda: [
            e
            for e in api.rows("/api/failover-events/?kind=inference")
            if e["from_deployment"] == "gpt-byte-local"
        ],
        "a failover from the failing primary",
    )
    # Besides the failovers to the fallback, the primary's breaker opening is an event too
    # (it names no deployment to go to).
    assert "gpt-byte-local-aws" in {e["to_deployment"] for e in events}, events

    # Ctrl-C: the demo stops every process it started and exits 0.
    assert demo.process is not None
    groups = demo.child_groups()
    assert len(groups) == 7, demo.text()  # web, control, beat, two workers, two replicas
    demo.process.send_signal(signal.SIGINT)
    assert demo.process.wait(timeout=STOP_WAIT_S) == 0, demo.tail()
    assert "stopping…" in demo.text()
    assert _live_processes_in(groups | {demo.process.pid}) == []
    for port in (demo.port, demo.port + 100, demo.port + 101, demo.port + 200):
        with socket.socket() as s:
            # Connected sockets may linger in TIME_WAIT; only a listener would accept.
            assert s.connect_ex(("127.0.0.1", port)) != 0, f"something still listens on {port}"
