"""The OpenAPI schema passes drf-spectacular's own validation without a warning, and says what the API does.

What each endpoint answers is checked against the schema by Schemathesis (tests/stack/test_api_fuzz.py);
these are the fast checks of the schema itself.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import yaml
from django.contrib.auth.models import User
from django.core.management import call_command
from django.urls import resolve
from drf_spectacular.drainage import GENERATOR_STATS
from drf_spectacular.generators import SchemaGenerator
from rest_framework.test import APIRequestFactory, force_authenticate

from billing.exports import FILTER_FIELDS
from tests.factories import api_client, make_workflow


@pytest.fixture(scope="module")
def schema() -> dict[str, Any]:
    return SchemaGenerator().get_schema(request=None, public=True)


def _operations(schema: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    return [
        (path, method, operation)
        for path, item in schema["paths"].items()
        for method, operation in item.items()
    ]


def test_drf_spectacular_validates_the_schema_and_warns_of_nothing(tmp_path: Path) -> None:
    GENERATOR_STATS.reset()  # counts left by schemas generated earlier in this session
    # --fail-on-warn raises on any warning or error, --validate on a schema that is not valid OpenAPI.
    call_command("spectacular", "--validate", "--fail-on-warn", "--file", str(tmp_path / "schema.yml"))
    written = yaml.safe_load((tmp_path / "schema.yml").read_text())
    assert written["openapi"].startswith("3.")
    assert "/api/usage-export/" in written["paths"]  # the plain APIView is documented too


def test_every_operation_takes_a_bearer_token_or_a_session(schema: dict[str, Any]) -> None:
    schemes = schema["components"]["securitySchemes"]
    assert schemes["bearerAuth"]["type"] == "http"
    assert schemes["bearerAuth"]["scheme"] == "bearer"
    assert schemes["cookieAuth"] == {"type": "apiKey", "in": "cookie", "name": "sessionid"}
    for path, method, operation in _operations(schema):
        assert operation["security"] == [{"bearerAuth": []}, {"cookieAuth": []}], (method, path)


def test_every_operation_documents_its_error_answers(schema: dict[str, Any]) -> None:
    for path, method, operation in _operations(schema):
        responses = operation["responses"]
        assert {"401", "403"} <= responses.keys(), (method, path)
        if "{" in path:
            assert set(responses["404"]["content"]) == {"application/json"}, (method, path)
        if method == "delete":
            assert "409" in responses, (method, path)
        if "requestBody" in operation:
            assert "400" in responses, (method, path)


def test_slugs_in_paths_are_documented_as_slugs(schema: dict[str, Any]) -> None:
    slugs = [
        parameter
        for _, _, operation in _operations(schema)
        for parameter in operation.get("parameters", [])
        if parameter["in"] == "path" and parameter["name"] == "slug"
    ]
    assert len(slugs) > 20
    assert all(p["schema"] == {"type": "string", "pattern": "^[-a-zA-Z0-9_]+$"} for p in slugs)


def test_a_workflows_versions_are_one_list_in_the_schema_and_the_answer(
    schema: dict[str, Any], operator: User
) -> None:
    documented = schema["paths"]["/api/workflows/{slug}/versions/"]["get"]["responses"]["200"]
    assert documented["content"]["application/json"]["schema"] == {
        "type": "array",
        "items": {"$ref": "#/components/schemas/PolicyVersion"},
    }
    workflow = make_workflow(owner=operator)
    answer = api_client(operator).get(f"/api/workflows/{workflow.slug}/versions/").json()
    assert [v["version"] for v in answer] == [1]


def test_the_usage_export_documents_every_filter_and_format(schema: dict[str, Any]) -> None:
    operation = schema["paths"]["/api/usage-export/"]["get"]
    assert {p["name"] for p in operation["parameters"]} == {"format", *FILTER_FIELDS}
    assert set(operation["responses"]["200"]["content"]) == {
        "text/csv",
        "application/x-ndjson",
        "application/vnd.apache.parquet",
    }


def test_fields_that_can_be_empty_are_nullable(schema: dict[str, Any]) -> None:
    components = schema["components"]["schemas"]
    for component, field in [
        ("FailoverEvent", "from_provider"),
        ("FailoverEvent", "to_deployment"),
        ("UsageRecord", "cluster"),
        ("ProbeJob", "created_by"),
        ("TrainingRun", "created_by"),
        ("TrainingRun", "registered_model"),
        ("ExportJob", "created_by"),
        ("InvoiceImport", "uploaded_by"),
        ("Chaos", "updated_at"),
        ("QualityRecord", "request_id"),
        ("Budget", "current"),
        ("Workflow", "current_policy"),
    ]:
        assert components[component]["properties"][field].get("nullable") is True, (component, field)


def test_money_fields_are_never_required_because_viewers_answers_leave_them_out(
    schema: dict[str, Any],
) -> None:
    from registry.auth.costs import is_money_key

    components = schema["components"]["schemas"]
    with_money = [name for name, c in components.items() if any(map(is_money_key, c.get("properties", {})))]
    assert "InferenceRequest" in with_money or len(with_money) > 3  # the hook had work to do
    for name in with_money:
        # Every key the renderer may drop (by list or by name) may be absent.
        assert not [key for key in components[name].get("required", []) if is_money_key(key)], name


def test_concurrent_schema_requests_are_generated_one_at_a_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """drf-spectacular's generator shares class state between threads (the fuzzer's four clients
    asking at once got a 500); registry.api.schema.SchemaView generates one schema at a time."""
    inside, most, guard = 0, 0, threading.Lock()
    generate = SchemaGenerator.get_schema

    def counting(self: SchemaGenerator, *args: Any, **kwargs: Any) -> Any:
        nonlocal inside, most
        with guard:
            inside += 1
            most = max(most, inside)
        try:
            time.sleep(0.05)  # widen the window two unserialized requests would share
            return generate(self, *args, **kwargs)
        finally:
            with guard:
                inside -= 1

    monkeypatch.setattr(SchemaGenerator, "get_schema", counting)
    view = resolve("/api/schema/").func  # the view as routed, with its permission classes
    admin = User(username="admin", is_superuser=True)  # an admin without a database row

    def fetch(_: int) -> int:
        request = APIRequestFactory().get("/api/schema/")
        force_authenticate(request, user=admin)
        return view(request).status_code

    with ThreadPoolExecutor(max_workers=3) as pool:
        statuses = list(pool.map(fetch, range(3)))
    assert statuses == [200, 200, 200]
    assert most == 1
