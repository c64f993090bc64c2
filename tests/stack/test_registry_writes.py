"""Registry objects are created and changed through one service per entity (registry.services),
whichever surface asks: the API, the page forms and the Django admin refuse what the service
refuses, on the same field, and what they save is in the audit trail."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import User
from django.contrib.contenttypes.models import ContentType
from django.test import Client

from registry.audit.models import AuditEntry
from registry.models import Cluster, Deployment, Provider, RegisteredModel, Workflow
from registry.services import (
    RegistryError,
    cluster_update,
    deployment_create,
    deployment_update,
    provider_create,
    provider_update,
    registered_model_create,
    workflow_update,
)
from registry.store.objectstore import STORE_URI_REFUSED
from tests.factories import (
    api_client,
    make_cluster,
    make_deployment,
    make_model,
    make_provider,
    make_workflow,
)

pytestmark = pytest.mark.django_db

OUTSIDE = "https://elsewhere.example/v1"


def _superuser_client() -> Client:
    client = Client()
    client.force_login(User.objects.create_superuser("root-writes", "root@example.com", "pw-for-tests-1"))
    return client


def _audit_actions(obj: Any) -> list[str]:
    ct = ContentType.objects.get_for_model(obj)
    return [
        e.action for e in AuditEntry.objects.filter(content_type=ct, object_pk=str(obj.pk)).order_by("id")
    ]


def _provider() -> Provider:
    return make_provider(kind=Provider.Kind.OPENAI_COMPATIBLE, base_url="https://api.provider.test/v1")


def test_the_deployment_service_names_the_field_a_rule_refuses() -> None:
    provider, model = _provider(), make_model()
    with pytest.raises(RegistryError) as missing:
        deployment_create(slug="d-1", model=model, provider=provider)
    assert missing.value.field == "provider_model_id"
    with pytest.raises(RegistryError) as outside:
        deployment_create(slug="d-1", model=model, provider=provider, base_url=OUTSIDE)
    assert outside.value.field == "base_url"
    assert not Deployment.objects.filter(slug="d-1").exists()

    deployment = deployment_create(slug="d-1", model=model, provider=provider, provider_model_id="m")
    with pytest.raises(RegistryError):
        deployment_update(deployment, base_url=OUTSIDE)
    deployment.refresh_from_db()
    assert deployment.base_url == ""
    with pytest.raises(TypeError):
        deployment_update(deployment, created_at=None)  # not a field a caller sets

    claude = make_provider(kind=Provider.Kind.ANTHROPIC, base_url="https://api.anthropic.com")
    with pytest.raises(RegistryError) as responses:
        deployment_create(
            slug="d-2", model=model, provider=claude, provider_model_id="c", speaks_responses=True
        )
    assert responses.value.field == "speaks_responses"
    assert deployment_update(deployment, speaks_responses=True).speaks_responses  # OpenAI-compatible


def test_the_admin_refuses_a_deployment_the_service_refuses_and_saves_one_it_accepts() -> None:
    provider, model = _provider(), make_model()
    client = _superuser_client()
    form = {
        "slug": "d-admin",
        "model": model.pk,
        "provider": provider.pk,
        "provider_model_id": "m",
        "enabled": "on",
    }
    refused = client.post("/admin/stack/deployment/add/", {**form, "base_url": OUTSIDE})
    assert refused.status_code == 200  # the form again, with its error
    assert "must lie under one of the provider" in refused.content.decode()
    assert not Deployment.objects.filter(slug="d-admin").exists()

    saved = client.post(
        "/admin/stack/deployment/add/", {**form, "base_url": "https://api.provider.test/v1/x"}
    )
    assert saved.status_code == 302, saved.content.decode()[:2000]
    deployment = Deployment.objects.get(slug="d-admin")
    assert deployment.base_url == "https://api.provider.test/v1/x"

    changed = client.post(
        f"/admin/stack/deployment/{deployment.pk}/change/", {**form, "provider_model_id": ""}
    )
    assert changed.status_code == 200
    assert "provider&#x27;s model id" in changed.content.decode()
    deployment.refresh_from_db()
    assert deployment.provider_model_id == "m"
    assert _audit_actions(deployment) == [AuditEntry.Action.CREATE]


def test_a_deployment_saved_through_the_api_and_the_page_is_in_the_audit_trail(operator: User) -> None:
    provider, model = _provider(), make_model()
    created = api_client(operator).post(
        "/api/deployments/",
        {"slug": "d-api", "model": model.slug, "provider": provider.slug, "provider_model_id": "m"},
        format="json",
    )
    assert created.status_code == 201, created.content
    deployment = Deployment.objects.get(slug="d-api")
    page = Client()
    page.force_login(operator)
    edited = page.post(
        "/deployments/d-api/edit/",
        {"slug": "d-api", "model": model.pk, "provider": provider.pk, "provider_model_id": "m-2"},
    )
    assert edited.status_code == 302, edited.content.decode()[:2000]
    deployment.refresh_from_db()
    assert deployment.provider_model_id == "m-2"
    assert _audit_actions(deployment) == [AuditEntry.Action.CREATE, AuditEntry.Action.UPDATE]


def test_the_provider_service_names_every_field_it_refuses_and_keeps_credentials_apart() -> None:
    with pytest.raises(RegistryError) as refused:
        provider_create(
            slug="p-1",
            display_name="P",
            kind="other",
            base_url="ftp://x/",
            allowed_endpoints=["https://u:p@h/"],
        )
    assert set(refused.value.field_errors()) == {"base_url", "allowed_endpoints"}
    assert not Provider.objects.filter(slug="p-1").exists()

    provider = provider_create(
        slug="p-1",
        display_name="P",
        kind="other",
        allowed_endpoints=["https://a.test/v1/"],
        credentials="k-1",
    )
    assert provider.allowed_endpoints == ["https://a.test/v1"] and provider.has_credentials
    provider_update(provider, display_name="Q")  # no credentials given: they stay
    provider.refresh_from_db()
    assert (provider.display_name, provider.has_credentials) == ("Q", True)
    provider_update(provider, credentials="")
    provider.refresh_from_db()
    assert not provider.has_credentials


def test_the_admin_saves_a_provider_and_its_credentials_through_the_service() -> None:
    client = _superuser_client()
    form = {"slug": "p-admin", "display_name": "P", "kind": "other", "enabled": "on", "credentials": "k-1"}
    refused = client.post("/admin/stack/provider/add/", {**form, "allowed_endpoints": "ftp://files.test/"})
    assert refused.status_code == 200
    assert "ftp://files.test/" in refused.content.decode()
    assert not Provider.objects.filter(slug="p-admin").exists()

    saved = client.post("/admin/stack/provider/add/", {**form, "allowed_endpoints": "https://a.test/v1/"})
    assert saved.status_code == 302, saved.content.decode()[:2000]
    provider = Provider.objects.get(slug="p-admin")
    assert provider.allowed_endpoints == ["https://a.test/v1"]
    assert provider.has_credentials
    # Created, then its credentials stored (masked in the trail), as on the API and the page.
    assert _audit_actions(provider) == [AuditEntry.Action.CREATE, AuditEntry.Action.UPDATE]


def test_a_models_artifact_outside_the_store_is_refused_on_every_surface(operator: User) -> None:
    with pytest.raises(RegistryError) as refused:
        registered_model_create(slug="m-1", family="f", artifact_uri="/etc/passwd")
    assert refused.value.field == "artifact_uri"
    body = {"slug": "m-1", "family": "f", "artifact_uri": "/etc/passwd"}
    api = api_client(operator).post("/api/models/", body, format="json")
    assert api.status_code == 400 and api.json() == {"artifact_uri": [STORE_URI_REFUSED]}
    page = Client()
    page.force_login(operator)
    form = {**body, "parameter_count": 0, "tokenizer": "bytes", "context_length": 0}
    on_page = page.post("/models/new/", form)
    assert on_page.status_code == 200 and STORE_URI_REFUSED in on_page.content.decode().replace("&#x27;", "'")
    in_admin = _superuser_client().post("/admin/stack/registeredmodel/add/", form)
    assert in_admin.status_code == 200 and STORE_URI_REFUSED in in_admin.content.decode().replace(
        "&#x27;", "'"
    )
    assert not RegisteredModel.objects.filter(slug="m-1").exists()


def test_the_admin_changes_a_cluster_through_the_service_and_leaves_its_status_to_heartbeats() -> None:
    cluster = make_cluster(price=None, status=Cluster.Status.HEALTHY)
    form = {
        "provider": cluster.provider_id,
        "slug": cluster.slug,
        "region": "eu",
        "accelerator_type": "A10G",
        "accelerator_count": 4,
        "memory_per_node_gb": 0,
        "capacity_type": "on-demand",
        "capacity": 3,
        "status": "down",  # read-only in the admin: ignored
    }
    changed = _superuser_client().post(f"/admin/stack/cluster/{cluster.pk}/change/", form)
    assert changed.status_code == 302, changed.content.decode()[:2000]
    cluster.refresh_from_db()
    assert (cluster.capacity, cluster.region, cluster.status) == (3, "eu", Cluster.Status.HEALTHY)
    with pytest.raises(TypeError):
        cluster_update(cluster, status=Cluster.Status.DOWN)  # draining and heartbeats set it


def test_the_workflow_service_checks_its_settings_and_never_sets_its_owner(operator: User) -> None:
    workflow = make_workflow(owner=operator, deployments=[make_deployment()])
    with pytest.raises(RegistryError) as refused:
        workflow_update(workflow, retain_prompts=True)
    assert refused.value.field == "prompt_retention_days"
    workflow.refresh_from_db()
    assert workflow.retain_prompts is False
    with pytest.raises(TypeError):
        workflow_update(workflow, owner=operator)
    workflow_update(workflow, retain_prompts=True, prompt_retention_days=7, rpm_limit=60)
    workflow.refresh_from_db()
    assert (workflow.retain_prompts, workflow.prompt_retention_days, workflow.rpm_limit) == (True, 7, 60)


def test_the_admin_changes_a_workflows_settings_through_the_service_and_never_adds_one(
    operator: User,
) -> None:
    workflow = make_workflow(owner=operator, deployments=[make_deployment()])
    client = _superuser_client()
    assert client.get("/admin/stack/workflow/add/").status_code == 403
    form = {
        "slug": workflow.slug,
        "description": "d",
        "rpm_limit": "60",
        "tpm_limit": "",
        "response_cache_seconds": "0",
        "response_cache_entries": "1000",
    }
    changed = client.post(f"/admin/stack/workflow/{workflow.pk}/change/", form)
    assert changed.status_code == 302, changed.content.decode()[:2000]
    workflow.refresh_from_db()
    assert (workflow.description, workflow.rpm_limit, workflow.owner) == ("d", 60, operator)
    assert _audit_actions(workflow)[-1] == AuditEntry.Action.UPDATE
    assert Workflow.objects.count() == 1
