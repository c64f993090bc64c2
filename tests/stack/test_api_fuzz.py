"""Schemathesis fuzzes every /api/ operation of the live app with a bearer token of each role and
finds no server error and no answer outside the documented schema.

The app runs in pytest-django's live server on this run's database, seeded for each role with
one object of each kind, so that the ids and slugs Schemathesis puts in paths, query strings and
bodies name real objects half of the time (its dictionaries) and the requests reach the services
behind the validation. Schemathesis runs as its CLI in a subprocess (its pytest plugin does not
load on this pytest), one test per role (the admin's in two halves by path), so that
pytest-xdist runs them side by side, each against its own worker's server; each with a fixed
seed, no example database and one request at a time. The admin's run covers every operation;
another role's covers the operations stack.access lets it call (the role matrix proves that
every other operation refuses it, with the documented 403 body). Every role runs
the fuzzing phase (EXAMPLES cases per operation); the admin also runs the coverage
phase (every boundary value, wrong type and missing field of every parameter, deterministic),
with bodies in JSON only (tests/stack/api_fuzz_hooks.py says why). API_FUZZ_DEEP=1 (or a number
of examples) is a long run by hand: 50 examples, and the coverage phase for every role in every
media type:

    API_FUZZ_DEEP=50 .venv/bin/python -m pytest tests/stack/test_api_fuzz.py -s

Every check is on except four. `positive_data_acceptance` expects every schema-valid body to be
accepted, but valid-looking input is refused for reasons a schema cannot say (a slug naming no
provider, a period that ends before it starts, a name that is taken). `use_after_free` and
`ensure_resource_availability` need the stateful phase, which is off: it walks links between
operations that this schema does not declare. `negative_data_rejection` (a request that breaks
the schema must be refused) was tried and is off for what it flagged, all of it lenient by
design rather than wrong: DRF reads a JSON number as text (`"display_name": 0` is "0") and 0 or 1
as a boolean; read-only fields sent in a body are ignored; a form or multipart body carries no
types, a boolean left out of a form is false (an unticked checkbox) and a multipart body without
parts is no fields (an empty PATCH). The one real fault it found, a filter documented as an enum
that took any value (`?kind=` on failover events), is fixed and has its own test.
Celery messages are dropped (no broker is needed: the fuzzer only checks what the API answers),
and the object store is a temporary directory.
"""

from __future__ import annotations

import json
import logging
import os
import re
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.core.servers import basehttp
from django.db import DEFAULT_DB_ALIAS, connections
from django.urls import resolve
from django.utils import timezone
from drf_spectacular.generators import SchemaGenerator

from billing.models import Budget, BudgetAlert, ExportJob, InvoiceImport, InvoiceLine, PriceBook, UsageRecord
from decisions.models import Recommendation
from inference.models import (
    BatchJob,
    ChaosConfig,
    EvalCase,
    EvalRun,
    EvalSet,
    InferenceRequest,
    QualityRecord,
)
from registry.auth.roles import Role
from registry.models import FailoverEvent, Provider
from registry.services import api_token_create
from stack.access import ACCESS
from stack.celery import app as celery_app
from tests.factories import (
    fabricate_run,
    make_cluster,
    make_deployment,
    make_model,
    make_provider,
    make_user,
    make_workflow,
)
from training.models import ProbeJob

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

HOOKS = Path(__file__).with_name("api_fuzz_hooks.py")
SEED = 20260512
EXAMPLES = 10  # per operation and phase; API_FUZZ_DEEP raises it
DEEP_EXAMPLES = 50
EXCLUDED_CHECKS = (
    "negative_data_rejection",
    "positive_data_acceptance",
    "use_after_free",
    "ensure_resource_availability",
)
# `--checks all` includes a response-time limit (10 s unless set). A wall clock is no behaviour:
# on a shared 2-core machine running the suite in parallel a 403 once took 26 s. The limit is set
# to the request timeout, so only a request that times out fails; speed is the benchmarks'.
RESPONSE_SECONDS = 60


def _deep() -> bool:
    return os.environ.get("API_FUZZ_DEEP", "").strip() not in ("", "0")


def _examples() -> int:
    if not _deep():
        return EXAMPLES
    deep = os.environ["API_FUZZ_DEEP"].strip()
    return int(deep) if deep.isdigit() and int(deep) > 1 else DEEP_EXAMPLES


# --- The seeded objects ------------------------------------------------------------------------


@dataclass
class World:
    """What the fuzzer may name: per dictionary, the ids or slugs of real objects."""

    dictionaries: dict[str, list[str | int]]


def _seed(user: User, prefix: str) -> World:
    """One object of each kind the API addresses, owned by `user` where objects have owners."""
    now = timezone.now()
    provider = make_provider(slug=f"{prefix}-prov", kind=Provider.Kind.OPENAI_COMPATIBLE)
    cluster = make_cluster(slug=f"{prefix}-cl", provider=provider)
    model = make_model(slug=f"{prefix}-model")
    primary = make_deployment(slug=f"{prefix}-dep-a", model=model, provider=provider)
    backup = make_deployment(slug=f"{prefix}-dep-b", model=model, provider=provider)
    workflow = make_workflow(owner=user, slug=f"{prefix}-wf", deployments=[primary, backup])
    ChaosConfig.objects.create(deployment=backup, enabled=False, status_codes=[503])
    run = fabricate_run(name=f"{prefix}-run")
    budget = Budget.objects.create(
        name=f"{prefix}-budget",
        scope=Budget.Scope.WORKFLOW,
        workflow=workflow,
        limit_amount=Decimal("100"),
        thresholds=[50, 100],
    )
    alert = BudgetAlert.objects.create(
        budget=budget,
        period_start=now.replace(day=1, hour=0, minute=0, second=0, microsecond=0),
        threshold_percent=50,
        spent=Decimal("60"),
        limit_amount=Decimal("100"),
        triggered_at=now,
    )
    failover = FailoverEvent.objects.create(
        kind=FailoverEvent.Kind.INFERENCE,
        from_provider=provider,
        to_provider=provider,
        from_deployment=primary,
        to_deployment=backup,
        reason="503 from the primary",
        detected_at=now,
        status_code=503,
    )
    probe = ProbeJob.objects.create(cluster=cluster, created_by=user, steps=10)
    eval_set = EvalSet.objects.create(workflow=workflow, name=f"{prefix}-evals", created_by=user)
    case = EvalCase.objects.create(eval_set=eval_set, prompt="2+2?", expected="4")
    eval_run = EvalRun.objects.create(eval_set=eval_set, deployment=primary, cases_total=1, created_by=user)
    request = InferenceRequest.objects.create(
        workflow=workflow, deployment=primary, status=InferenceRequest.Status.SUCCEEDED, tokens_in=3
    )
    QualityRecord.objects.create(
        deployment=primary,
        workflow=workflow,
        source=QualityRecord.Source.EVAL,
        score=Decimal("1"),
        eval_run=eval_run,
        eval_case=case,
    )
    batch = BatchJob.objects.create(
        workflow=workflow, input_uri=f"batch/{prefix}/input.jsonl", created_by=user
    )
    export = ExportJob.objects.create(created_by=user, formats=["csv"])
    invoice = InvoiceImport.objects.create(
        provider=provider,
        filename="invoice.csv",
        uploaded_by=user,
        period_start=timezone.now().date() - timedelta(days=30),
        period_end=timezone.now().date(),
        row_count=1,
    )
    InvoiceLine.objects.create(
        invoice=invoice,
        line_number=1,
        day=timezone.now().date(),
        service="inference",
        amount=Decimal("1.5"),
        currency="USD",
    )
    recommendation = Recommendation.objects.create(
        workflow=workflow,
        from_deployment=primary,
        to_deployment=backup,
        policy_version=workflow.policy_versions.order_by("-version").first(),
        summary=f"switch {workflow.slug}'s primary from {primary.slug} to {backup.slug}",
    )
    clusters = [cluster.slug, *run.learners.values_list("cluster__slug", flat=True)]
    return World(
        dictionaries={
            "providers": [provider.slug],
            "clusters": clusters,
            "models": [model.slug],
            "deployments": [primary.slug, backup.slug],
            "workflows": [workflow.slug],
            "batch_jobs": [batch.pk],
            "budget_alerts": [alert.pk],
            "budgets": [budget.pk],
            "eval_runs": [eval_run.pk],
            "eval_sets": [eval_set.pk],
            "export_jobs": [export.pk],
            "failover_events": [failover.pk],
            "invoice_imports": [invoice.pk],
            "price_books": list(PriceBook.objects.values_list("pk", flat=True)),
            "probe_jobs": [probe.pk],
            "training_runs": [run.pk],
            "usage_records": list(UsageRecord.objects.values_list("pk", flat=True)),
            "requests": [request.pk],
            "recommendations": [recommendation.pk],
        }
    )


# Path parameters, by the collection their path starts with, and the dictionary naming real ones.
PATH_DICTIONARIES = {
    "/api/providers/": ("slug", "providers"),
    "/api/clusters/": ("slug", "clusters"),
    "/api/models/": ("slug", "models"),
    "/api/deployments/": ("slug", "deployments"),
    "/api/chaos/": ("slug", "deployments"),
    "/api/workflows/": ("slug", "workflows"),
    "/api/batch-jobs/": ("id", "batch_jobs"),
    "/api/budget-alerts/": ("id", "budget_alerts"),
    "/api/budgets/": ("id", "budgets"),
    "/api/eval-runs/": ("id", "eval_runs"),
    "/api/eval-sets/": ("id", "eval_sets"),
    "/api/export-jobs/": ("id", "export_jobs"),
    "/api/failover-events/": ("id", "failover_events"),
    "/api/invoice-imports/": ("id", "invoice_imports"),
    "/api/price-books/": ("id", "price_books"),
    "/api/probe-jobs/": ("id", "probe_jobs"),
    "/api/training-runs/": ("id", "training_runs"),
    "/api/usage-records/": ("id", "usage_records"),
    "/api/recommendations/": ("id", "recommendations"),
}

# Fields of bodies and query strings that name other objects, everywhere they appear.
FIELD_DICTIONARIES = {
    "provider": "providers",
    "cluster": "clusters",
    "hosting_cluster": "clusters",
    "model": "models",
    "deployment": "deployments",
    "judge_deployment": "deployments",
    "deployments[*]": "deployments",
    "workflow": "workflows",
    "eval_set": "eval_sets",
    "budget": "budgets",
    "request_id": "requests",
    "training_run": "training_runs",
}


def _toml(value: Any) -> str:
    """A TOML value: strings and numbers as JSON writes them (the same syntax for these), tables inline."""
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{json.dumps(k)} = {_toml(v)}" for k, v in value.items()) + " }"
    if isinstance(value, list):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    if isinstance(value, bool):
        return "true" if value else "false"
    return json.dumps(value)


def _config(world: World) -> str:
    """schemathesis.toml for one role's run: where real ids and slugs go.

    Each dictionary comes twice: as its values (ids are numbers in paths and bodies) and as text
    (`<name>_text`: every query parameter is text)."""
    half = 0.5
    lines = [f"seed = {SEED}", ""]
    if not _deep():  # a deep run sends the coverage phase's bodies in every media type
        lines[1:1] = [f"hooks = {_toml(str(HOOKS))}"]
    for name, values in world.dictionaries.items():
        lines += [f"[dictionaries.{name}]", f"values = {_toml(values)}", ""]
        lines += [f"[dictionaries.{name}_text]", f"values = {_toml([str(v) for v in values])}", ""]
    bindings: dict[str, Any] = {}
    for field, name in FIELD_DICTIONARIES.items():
        bindings[f"body.{field}"] = {"dictionary": name, "probability": half}
        if "[" not in field:
            bindings[f"query.{field}"] = {"dictionary": f"{name}_text", "probability": half}
    lines += ["[parameters]", *(f"{_toml(k)} = {_toml(v)}" for k, v in bindings.items()), ""]
    for prefix, (parameter, name) in PATH_DICTIONARIES.items():
        lines += [
            "[[operations]]",
            f"include-path-regex = {_toml('^' + prefix + '{')}",
            f"parameters = {_toml({f'path.{parameter}': {'dictionary': name, 'probability': half}})}",
            "",
        ]
    return "\n".join(lines)


# --- The live server --------------------------------------------------------------------------


class _OneRequestPerConnection(basehttp.ServerHandler):
    """Django's test server handler, closing the connection after every answer.

    wsgiref reads the next request of a kept-alive connection from whatever bytes follow the
    last one; a fuzzed request whose body it did not take whole (a chunked body, which it
    does not parse) leaves bytes that it then reads as a request line, and it answers that
    with an HTTP/0.9-style error page without a status line. Schemathesis reported that once
    as a "Network Error" of the next operation (a viewer's POST .../cancel/), an answer of
    this test's server and not of the app or of gunicorn, which ships. One request per
    connection keeps every fuzzed request's answer its own."""

    def cleanup_headers(self) -> None:
        self.headers["Connection"] = "close"
        super().cleanup_headers()


@pytest.fixture
def fast_live_server(live_server: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """The live server, answering without Nagle's delay, one request per connection.

    wsgiref writes a response's headers and body in separate sends; with Nagle's algorithm on,
    the second waits for the client's delayed ACK (about 40 ms on Linux) on every request."""
    httpd = live_server.thread.httpd
    accept = httpd.get_request
    monkeypatch.setattr(basehttp, "ServerHandler", _OneRequestPerConnection)
    # Each connection is a server thread of its own that answers one request: close its
    # database connection when the request ends rather than leave one per thread open.
    monkeypatch.setitem(connections.settings[DEFAULT_DB_ALIAS], "CONN_MAX_AGE", 0)

    def get_request() -> tuple[socket.socket, Any]:
        conn, address = accept()
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return conn, address

    httpd.get_request = get_request
    try:
        yield live_server.url
    finally:
        del httpd.get_request


@pytest.fixture
def dropped_tasks(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Celery messages the requests sent, recorded by task name and not delivered anywhere."""
    sent: list[str] = []

    def send_task(name: str, *args: Any, **kwargs: Any) -> None:
        sent.append(name)

    monkeypatch.setattr(celery_app, "send_task", send_task)
    return sent


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


def _phases(role: Role) -> str:
    # The coverage phase (every boundary value and wrong type of every field, deterministic) is
    # the expensive one: the admin, who may call every operation, runs it; every role fuzzes.
    return "examples,coverage,fuzzing" if role == Role.ADMIN or _deep() else "examples,fuzzing"


def _start(base_url: str, token: str, role: Role, world: World, workdir: Path, paths: list[str]) -> FuzzRun:
    workdir.mkdir(parents=True, exist_ok=True)
    config = workdir / "schemathesis.toml"
    config.write_text(_config(world))
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
        _phases(role),
        "--max-examples",
        str(_examples()),
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


def _finish(run: FuzzRun, *, deadline: float) -> FuzzResult:
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
# half's", so together they fuzz every operation whatever the API grows.
ADMIN_FIRST_HALF = r"^/api/[a-e]"
SHARDS = {
    "viewer": (Role.VIEWER, []),
    "operator": (Role.OPERATOR, []),
    "auditor": (Role.AUDITOR, []),
    "admin-a-e": (Role.ADMIN, ["--include-path-regex", ADMIN_FIRST_HALF]),
    "admin-rest": (Role.ADMIN, ["--exclude-path-regex", ADMIN_FIRST_HALF]),
}
WRITES = ("post", "put", "patch", "delete")


def _operations_for(role: Role) -> tuple[list[str], int]:
    """(the operationIds the role may call, the schema's number of operations), by stack.access.

    An operation the table refuses to a role answers 403 whatever its inputs (from the
    permission check, or for a team's writes from the team-admin check after the team is
    looked up): fuzzing them under that role sent thousands of requests that could only be
    refused. The role matrix (tests/stack/test_role_matrix.py) proves every such refusal and
    checks its body against the documented ErrorDetail; the admin's run fuzzes every
    operation's inputs; each other role fuzzes the operations it may call, where what it is
    allowed to see and change can differ from the admin's."""
    schema = SchemaGenerator().get_schema(request=None, public=True)
    allowed: list[str] = []
    total = 0
    for path, item in schema["paths"].items():
        # The URL name, from the path with every parameter filled in (each converter takes "1").
        access = ACCESS[resolve(re.sub(r"\{[^}]+\}", "1", path)).url_name]
        for method, operation in item.items():
            if method != "get" and method not in WRITES:
                continue
            total += 1
            may = access.may_write if method in WRITES else access.may_read
            if may(role, authenticated=True):
                allowed.append(operation["operationId"])
    return allowed, total


def _filters(role: Role, paths: list[str]) -> tuple[list[str], int | None]:
    """The shard's operation filters for schemathesis, and how many operations they select
    (None where the path split of the admin's run decides)."""
    if role == Role.ADMIN:
        return paths, None
    allowed, _ = _operations_for(role)
    return [arg for op in allowed for arg in ("--include-operation-id", op)], len(allowed)


@pytest.mark.parametrize("shard", list(SHARDS))
def test_schemathesis_finds_no_server_error_or_schema_violation_for_the_role(
    shard: str,
    fast_live_server: str,
    dropped_tasks: list[str],
    settings: Any,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    role, paths = SHARDS[shard]
    filters, selected = _filters(role, paths)
    settings.OBJECT_STORE_URL = f"file://{tmp_path / 'objects'}"
    # Thousands of refused requests log a warning each; a server error's traceback (ERROR) is kept.
    caplog.set_level(logging.ERROR, logger="django.request")
    server_cpu = time.process_time()
    user = make_user(role, username=f"fuzz-{role.value}")
    world = _seed(user, prefix=f"fz-{role.value}")
    _, token = api_token_create(user=user, name="fuzz")
    run = _start(fast_live_server, token, role, world, tmp_path / role.value, filters)
    result = _finish(run, deadline=time.monotonic() + 3600)
    server_cpu = time.process_time() - server_cpu

    # The figures a run by hand reports (pytest -s).
    print(
        shard,
        result.summary(),
        f"server {server_cpu:.0f} s CPU, {len(dropped_tasks)} Celery messages dropped",
    )
    # Every operation the shard selects was fuzzed. The admin's halves select 40 or more each,
    # and together (include and exclude of one pattern) every operation (109 today); another
    # role selects exactly the operations stack.access lets it call.
    assert result.operations == result.operations_selected, result.failure_report()
    assert result.operations_total >= 80, result.failure_report()
    if selected is None:
        assert 40 <= result.operations_selected < result.operations_total, result.failure_report()
    else:
        assert 20 <= result.operations_selected == selected, result.failure_report()
    assert not (result.failures or result.errors), result.failure_report()
