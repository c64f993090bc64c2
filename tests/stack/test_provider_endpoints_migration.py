"""Migration 0005 fills each provider's endpoints from the base URLs its deployments used, so no
deployment stops working, and allows private networks only where one of them was private."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

from registry.outbound.endpoints import deployment_endpoint_problem

BEFORE = ("stack", "0004_failover_training_inference_fields")
AFTER = ("stack", "0005_provider_endpoints")


@pytest.fixture
def _back_to_the_latest_migrations() -> Any:
    """Leave the test database fully migrated: later tests need every column."""
    yield
    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    executor.migrate(executor.loader.graph.leaf_nodes())


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("_back_to_the_latest_migrations")
def test_the_migration_keeps_existing_deployments_under_their_providers_endpoints() -> None:
    executor = MigrationExecutor(connection)
    executor.migrate([BEFORE])
    apps: Any = executor.loader.project_state([BEFORE]).apps
    Provider = apps.get_model("stack", "Provider")
    Deployment = apps.get_model("stack", "Deployment")
    Model = apps.get_model("stack", "RegisteredModel")
    model = Model.objects.create(slug="m", family="f")
    hosted = Provider.objects.create(slug="openai", display_name="O", kind="openai-compatible",
                                     base_url="https://api.openai.test/v1")  # fmt: skip
    lab = Provider.objects.create(slug="lab", display_name="L", kind="on-prem")
    for slug, provider, url in [
        ("a", hosted, ""),
        ("b", hosted, "https://api.openai.test/v1/tenant"),
        ("c", lab, "http://127.0.0.1:8100/v1/"),
        ("d", lab, "http://10.1.2.3:8000/v1"),
    ]:
        Deployment.objects.create(slug=slug, model=model, provider=provider, base_url=url)

    executor = MigrationExecutor(connection)
    executor.migrate([AFTER])
    apps = executor.loader.project_state([AFTER]).apps
    Provider = apps.get_model("stack", "Provider")
    hosted, lab = Provider.objects.get(slug="openai"), Provider.objects.get(slug="lab")
    assert (hosted.allowed_endpoints, hosted.allow_private_network) == ([], False)
    assert lab.allowed_endpoints == ["http://10.1.2.3:8000/v1", "http://127.0.0.1:8100/v1"]
    assert lab.allow_private_network is True
    for slug, provider in (("b", hosted), ("c", lab), ("d", lab)):
        url = apps.get_model("stack", "Deployment").objects.get(slug=slug).base_url
        assert deployment_endpoint_problem(provider=provider, base_url=url) is None, slug
