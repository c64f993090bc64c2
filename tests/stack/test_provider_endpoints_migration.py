"""Migration 0005 fills each provider's endpoints from the base URLs its deployments used, so no
deployment stops working, and allows private networks only where one of them was private."""

from __future__ import annotations

from registry.outbound.endpoints import deployment_endpoint_problem
from tests.migration_db import migrate_to

BEFORE = ("stack", "0004_failover_training_inference_fields")
AFTER = ("stack", "0005_provider_endpoints")


def test_the_migration_keeps_existing_deployments_under_their_providers_endpoints(scratch_db: str) -> None:
    alias = scratch_db  # the test database is not used, only the scratch one
    apps = migrate_to(alias, BEFORE)
    Provider = apps.get_model("stack", "Provider")
    Deployment = apps.get_model("stack", "Deployment")
    Model = apps.get_model("stack", "RegisteredModel")
    model = Model.objects.using(alias).create(slug="m", family="f")
    hosted = Provider.objects.using(alias).create(slug="openai", display_name="O", kind="openai-compatible",
                                                  base_url="https://api.openai.test/v1")  # fmt: skip
    lab = Provider.objects.using(alias).create(slug="lab", display_name="L", kind="on-prem")
    for slug, provider, url in [
        ("a", hosted, ""),
        ("b", hosted, "https://api.openai.test/v1/tenant"),
        ("c", lab, "http://127.0.0.1:8100/v1/"),
        ("d", lab, "http://10.1.2.3:8000/v1"),
    ]:
        Deployment.objects.using(alias).create(slug=slug, model=model, provider=provider, base_url=url)

    apps = migrate_to(alias, AFTER)
    Provider = apps.get_model("stack", "Provider")
    hosted, lab = (
        Provider.objects.using(alias).get(slug="openai"),
        Provider.objects.using(alias).get(slug="lab"),
    )
    assert (hosted.allowed_endpoints, hosted.allow_private_network) == ([], False)
    assert lab.allowed_endpoints == ["http://10.1.2.3:8000/v1", "http://127.0.0.1:8100/v1"]
    assert lab.allow_private_network is True
    for slug, provider in (("b", hosted), ("c", lab), ("d", lab)):
        url = apps.get_model("stack", "Deployment").objects.using(alias).get(slug=slug).base_url
        assert deployment_endpoint_problem(provider=provider, base_url=url) is None, slug
