"""Every endpoint's read and write roles, proved from the URL conf against stack/access.py.

The URL conf is walked recursively; each URL (API and pages; the admin and the /v1 gateway
have their own access model, see stack.access.SEPARATELY_GUARDED) gets concrete path values
from seeded objects, and each role (anonymous, a user with no role, viewer, operator, auditor,
admin) sends a GET and each write method. A URL the table does not declare fails the test.

Allowed: neither 401 nor 403 nor a redirect to the login page, never a 5xx; a GET answers 200
(405 where the URL takes no GET). Refused: 401 for an anonymous API call, a redirect to the
login page for an anonymous page, 403 for a logged-in role; 405 for a write the URL does not
take at all. Allowed writes run inside a rolled-back savepoint, so each role meets
the same seeded objects.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import date, timedelta
from decimal import Decimal
from typing import Any

import jsonschema
import pytest
from django.db import transaction
from django.test import Client, override_settings
from django.urls import URLPattern, URLResolver, get_resolver, reverse
from django.utils import timezone
from rest_framework.test import APIClient

from billing.exports.columns import MANIFEST_NAME
from billing.exports.filters import ExportFilters
from billing.exports.jobs import export_job_create, export_job_run
from billing.models import (
    AlertChannel,
    Budget,
    BudgetAlert,
    InvoiceImport,
    PriceBook,
    SpendAnomaly,
    UsageRecord,
)
from decisions.models import Recommendation, ReplayStudy
from inference.models import BatchJob, ChaosConfig, EvalRun, EvalSet
from registry.api.schema import COMPONENTS
from registry.audit.models import AuditEntry
from registry.auth.roles import Role
from registry.crypto import encrypt_secret
from registry.models import FailoverEvent
from stack.access import ACCESS, SEPARATELY_GUARDED, Access
from tests.factories import (
    api_client,
    fabricate_run,
    make_deployment,
    make_member,
    make_team,
    make_user,
    make_workflow,
)
from tests.helpers import FAST_PASSWORD_HASHERS
from training.models import ProbeJob

WRITES = ("put", "patch", "delete", "post")  # POST last: /logout/ ends the session
ROLES: list[Role | None] = [None, Role.VIEWER, Role.OPERATOR, Role.AUDITOR, Role.ADMIN]
ERROR_DETAIL = COMPONENTS["ErrorDetail"]
# Query strings a URL needs to answer 200 at all (otherwise a 400 naming what is missing).
REQUIRED_QUERY = {"invoiceimport-rows": "?day=2026-01-15&service=compute"}
PARAM = re.compile(r"([\w.-]+)/(?:<(?:\w+:)?(\w+)>|\(\?P<(\w+)>[^)]*\))")


@dataclass(frozen=True)
class Endpoint:
    name: str
    route: str  # the joined pattern text, for messages
    params: tuple[tuple[str, str], ...]  # (collection segment before it, parameter name)
    view: Any
    methods: frozenset[str]  # the HTTP methods the URL takes (lower case)

    @property
    def is_api(self) -> bool:
        return self.route.startswith("api/")


def _view_methods(pattern: URLPattern) -> frozenset[str]:
    callback = pattern.callback
    actions = getattr(callback, "actions", None)
    if actions:  # a DRF viewset route: exactly the mapped methods
        return frozenset(actions)
    view = getattr(callback, "view_class", None) or getattr(callback, "cls", None)
    if view is None:  # a function view (healthz, plotly.js): reads only
        return frozenset({"get"})
    return frozenset(m for m in view.http_method_names if m != "options" and hasattr(view, m))


def _walk(
    patterns: list[Any], prefix: str = "", namespace: str = ""
) -> Iterator[tuple[str, URLPattern, str]]:
    """(route, pattern, name): the name as `reverse` takes it, "decisions:recommendations" inside
    an app's namespace."""
    for pattern in patterns:
        route = prefix + str(pattern.pattern)
        if isinstance(pattern, URLResolver):
            inner = f"{namespace}{pattern.namespace}:" if pattern.namespace else namespace
            yield from _walk(pattern.url_patterns, route, inner)
        else:
            yield route, pattern, f"{namespace}{pattern.name}" if pattern.name else ""


def _guarded(route: str) -> bool:
    return any(route.startswith(prefix) for prefix in SEPARATELY_GUARDED)


def _all_patterns() -> list[tuple[str, URLPattern, str]]:
    return [(route, p, name) for route, p, name in _walk(get_resolver().url_patterns) if not _guarded(route)]


def _endpoints() -> list[Endpoint]:
    """One per URL name: DRF's format-suffix twins (`.json`) are the same view, checked below."""
    found: dict[str, Endpoint] = {}
    for route, pattern, name in _all_patterns():
        params = tuple((m.group(1), m.group(2) or m.group(3)) for m in PARAM.finditer(route))
        if "format" in route and ("<drf_format_suffix:format>" in route or "(?P<format>" in route):
            continue
        assert name, f"unnamed URL {route}: give it a name and a line in stack/access.py"
        assert name not in found, f"two URLs named {name}"
        found[name] = Endpoint(name, route, params, pattern.callback, _view_methods(pattern))
    return list(found.values())


ENDPOINTS = _endpoints()


# --- The declaration covers the URL conf, exactly ---------------------------------------------------


def test_every_url_has_declared_read_and_write_roles() -> None:
    names = {route: name for route, _, name in _all_patterns()}
    undeclared = sorted(f"{name} ({route})" for route, name in names.items() if name not in ACCESS)
    assert undeclared == [], "declare who may read and write these in stack/access.py"


def test_the_declaration_names_no_url_that_is_gone() -> None:
    names = {name for _, _, name in _all_patterns()}
    assert sorted(set(ACCESS) - names) == []


def test_format_suffix_twins_are_the_same_view_as_their_url() -> None:
    views = {e.name: e.view for e in ENDPOINTS}
    for route, pattern, name in _all_patterns():
        if "format" in route:
            twin = getattr(pattern.callback, "cls", None) or pattern.callback
            canonical = getattr(views[name], "cls", None) or views[name]
            assert twin is canonical, route


def test_the_table_says_what_the_views_enforce() -> None:
    """The API views' own read_roles/write_roles agree with the table (pages: the run proves it)."""
    for endpoint in ENDPOINTS:
        view = getattr(endpoint.view, "cls", None)
        if view is None or not endpoint.is_api:
            continue
        declared = ACCESS[endpoint.name]
        read = getattr(view, "read_roles", None)
        if read is not None and declared.read is not None:
            assert read == declared.read, endpoint.name


# --- Seeded objects for the path parameters --------------------------------------------------------


@pytest.fixture(scope="module")
def seeded(
    django_db_setup: None, django_db_blocker: Any, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, Any]]:
    """What every endpoint's test meets, made once per module (per pytest-xdist worker) inside a
    transaction that is rolled back at the module's end, as Django's TestCase.setUpTestData
    does: each test runs inside it (its `db` fixture is a savepoint, rolled back after the test),
    so every test starts from the same rows. Seeding (a fabricated run, an export written to
    the store, a user per role) took a third of each of the 131 tests' time."""
    objects = tmp_path_factory.mktemp("matrix-objects")
    # Module-scoped, so it runs before the per-test fast hasher (tests/conftest.py): set it here.
    fast = override_settings(OBJECT_STORE_URL=f"file://{objects}", PASSWORD_HASHERS=FAST_PASSWORD_HASHERS)
    with fast, django_db_blocker.unblock():
        outer = transaction.atomic()
        outer.__enter__()
        try:
            yield {**_seed(), "users": {role: make_user(role) for role in ROLES}}
        finally:
            transaction.set_rollback(True)
            outer.__exit__(None, None, None)


def _seed() -> dict[str, Any]:
    """One object of each kind a URL can name, keyed by the path segment before its parameter."""
    owner = make_user(Role.ADMIN, username="owner")
    run = fabricate_run()  # clusters, price books, usage records, placements
    cluster = run.learners.first().cluster
    deployment = make_deployment()
    workflow = make_workflow(owner=owner, deployments=[deployment, make_deployment()])
    provider = deployment.provider
    probe = ProbeJob.objects.create(cluster=cluster, created_by=owner, steps=20)
    failover = FailoverEvent.objects.create(
        kind=FailoverEvent.Kind.CLUSTER_HEALTH,
        from_cluster=cluster,
        reason="silent",
        detected_at=timezone.now(),
    )
    budget = Budget.objects.create(
        name="matrix", scope=Budget.Scope.PROVIDER, provider=provider, limit_amount=Decimal("10")
    )
    alert = BudgetAlert.objects.create(
        budget=budget,
        period_start=timezone.now() - timedelta(days=1),
        threshold_percent=50,
        spent=Decimal("5"),
        limit_amount=Decimal("10"),
        triggered_at=timezone.now(),
    )
    export = export_job_create(created_by=owner, filters=ExportFilters(), formats=["csv"])
    export_job_run(job_id=export.pk)
    invoice = InvoiceImport.objects.create(
        provider=provider, filename="inv.csv", period_start=date(2026, 1, 1), period_end=date(2026, 1, 31)
    )
    ChaosConfig.objects.create(deployment=deployment)
    eval_set = EvalSet.objects.create(workflow=workflow, name="matrix")
    eval_run = EvalRun.objects.create(eval_set=eval_set, deployment=deployment)
    batch = BatchJob.objects.create(workflow=workflow, input_uri="in/x.jsonl", created_by=owner)
    channel = AlertChannel.objects.create(
        name="matrix", kind=AlertChannel.Kind.SLACK, url_encrypted=encrypt_secret("https://hooks.example.com/x"),
        url_host="hooks.example.com",
    )  # fmt: skip
    anomaly = SpendAnomaly.objects.create(
        dimension=SpendAnomaly.Dimension.PROVIDER, target_id=provider.pk, target_label=provider.slug,
        day=date(2026, 1, 15), currency="USD", spent_so_far=Decimal("5"), rate=Decimal("40"),
        median=Decimal("12"), mad=Decimal("1"), threshold=Decimal("17.19"),
        baseline=[["2026-01-14", "12"]], detected_at=timezone.now(),
    )  # fmt: skip
    team = make_team("matrix")
    replay_study = ReplayStudy.objects.create(workflow=workflow, sample_size=1, scorer="exact")
    make_member(team, Role.VIEWER, user=make_user(username="matrix-member"))
    recommendation = Recommendation.objects.create(
        workflow=workflow,
        from_deployment=deployment,
        to_deployment=workflow.policy_versions.get().ordered_deployments()[1],
        policy_version=workflow.policy_versions.get(),
        summary="switch the primary",
    )
    return {
        "teams": team.slug,
        "members": "matrix-member",
        "alert-channels": channel.pk,
        "anomalies": anomaly.pk,
        "providers": provider.slug,
        "clusters": cluster.slug,
        "models": deployment.model.slug,
        "deployments": deployment.slug,
        "workflows": workflow.slug,
        "chaos": deployment.slug,
        "jobs": probe.pk,
        "probe-jobs": probe.pk,
        "training": run.pk,
        "training-runs": run.pk,
        "failover-events": failover.pk,
        "usage-records": UsageRecord.objects.order_by("pk").first().pk,  # type: ignore[union-attr]
        "price-books": PriceBook.objects.order_by("pk").first().pk,  # type: ignore[union-attr]
        "budgets": budget.pk,
        "alerts": alert.pk,
        "budget-alerts": alert.pk,
        "exports": export.pk,
        "export-jobs": export.pk,
        "files": MANIFEST_NAME,
        "invoice-imports": invoice.pk,
        "reconciliation": invoice.pk,
        "eval-sets": eval_set.pk,
        "eval-runs": eval_run.pk,
        "batch-jobs": batch.pk,
        "recommendations": recommendation.pk,
        "replay-studies": replay_study.pk,
        "replays": replay_study.pk,
        "audit": AuditEntry.objects.order_by("pk").first().pk,  # type: ignore[union-attr]
    }


def _url(endpoint: Endpoint, seeded: dict[str, Any]) -> str:
    kwargs = {}
    for collection, param in endpoint.params:
        assert collection in seeded, f"{endpoint.route}: seed an object for '{collection}' in this test"
        kwargs[param] = seeded[collection]
    return reverse(endpoint.name, kwargs=kwargs) + REQUIRED_QUERY.get(endpoint.name, "")


# --- The run ---------------------------------------------------------------------------------------


def _clients(endpoint: Endpoint, users: dict[Role | None, Any]) -> dict[Role | None, Any]:
    """Anonymous, a user without a role, and one user per role: bearer tokens for the API,
    sessions for pages."""
    clients: dict[Role | None, Any] = {"anonymous": APIClient() if endpoint.is_api else Client()}  # type: ignore[dict-item]
    for role in ROLES:
        user = users[role]
        if endpoint.is_api:
            clients[role] = api_client(user)
        else:
            client = Client()
            client.force_login(user)
            clients[role] = client
    return clients


def _send(client: Any, method: str, url: str, *, is_api: bool) -> Any:
    if method == "get":
        return client.get(url)
    if is_api:
        return getattr(client, method)(url, {}, format="json")
    return getattr(client, method)(url, {} if method == "post" else "")


def _refused(response: Any, *, anonymous: bool, endpoint: Endpoint, write: bool) -> bool:
    if write and response.status_code == 405:  # a method the URL does not take at all
        return True
    # The schema view is no operation of the schema (it answers in OpenAPI's own media type).
    documented = endpoint.is_api and endpoint.name != "schema"
    if anonymous:
        if endpoint.is_api:
            return response.status_code == 401 and (not documented or _documented_error(response))
        return response.status_code == 302 and response["Location"].startswith("/login/?next=")
    return response.status_code == 403 and (not documented or _documented_error(response))


def _documented_error(response: Any) -> bool:
    """An /api/ refusal's body is the schema's ErrorDetail, as every operation documents its 401
    and 403 (the fuzz run does not send refused operations, so this is where their bodies are
    checked)."""
    try:
        jsonschema.validate(response.json(), ERROR_DETAIL)
    except (ValueError, jsonschema.ValidationError):
        return False
    return True


def _allowed(response: Any) -> bool:
    # (Logging out redirects to /login/ too, without ?next=: that one is an answer, not a refusal.)
    login_redirect = response.status_code == 302 and response.get("Location", "").startswith("/login/?next=")
    return response.status_code not in (401, 403) and response.status_code < 500 and not login_redirect


@pytest.mark.parametrize("endpoint", ENDPOINTS, ids=[e.name for e in ENDPOINTS])
def test_each_role_may_read_and_write_exactly_what_the_table_declares(
    endpoint: Endpoint, seeded: dict[str, Any], db: None
) -> None:
    access: Access = ACCESS[endpoint.name]
    url = _url(endpoint, seeded)
    wrong: list[str] = []
    for who, client in _clients(endpoint, seeded["users"]).items():
        anonymous = who == "anonymous"
        role = None if anonymous else who
        label = "anonymous" if anonymous else (role.value if role else "no role")  # type: ignore[union-attr]

        response = _send(client, "get", url, is_api=endpoint.is_api)
        if access.may_read(role, authenticated=not anonymous):
            expected = 200 if "get" in endpoint.methods else 405
            if response.status_code != expected:
                wrong.append(f"{label} GET: {response.status_code}, expected {expected}")
        elif not _refused(response, anonymous=anonymous, endpoint=endpoint, write=False):
            wrong.append(f"{label} GET: {response.status_code}, expected a refusal")

        for method in WRITES:
            if access.may_write(role, authenticated=not anonymous):
                # Allowed writes leave nothing behind: the next role meets the same objects.
                with transaction.atomic():
                    response = _send(client, method, url, is_api=endpoint.is_api)
                    transaction.set_rollback(True)
                if not _allowed(response):
                    wrong.append(f"{label} {method.upper()}: {response.status_code}, expected it allowed")
            else:
                response = _send(client, method, url, is_api=endpoint.is_api)
                if not _refused(response, anonymous=anonymous, endpoint=endpoint, write=True):
                    wrong.append(f"{label} {method.upper()}: {response.status_code}, expected a refusal")
    assert wrong == [], f"{endpoint.name} ({url})"
