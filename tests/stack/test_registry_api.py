"""CRUD of the registry through the REST API, addressed by slug."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.utils import timezone

from billing.models import Unit
from billing.services import usage_record
from registry.crypto import decrypt_secret
from registry.models import Cluster, Deployment, Provider, RegisteredModel
from tests.factories import api_client, make_cluster, make_deployment, make_model, make_provider

pytestmark = pytest.mark.django_db

SECRET = "AKIA-test-key:s3cr3t/with+symbols"


def _stored_credentials(provider_slug: str) -> str:
    """The credentials column as the database holds it, read without the ORM model."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT credentials_encrypted FROM stack_provider WHERE slug = %s", [provider_slug])
        (value,) = cursor.fetchone()
    return str(value)


# --- Providers and their write-only credentials ----------------------------------------------


def test_an_admin_creates_a_provider_whose_credentials_are_stored_encrypted_and_never_returned(
    admin_user: User,
) -> None:
    client = api_client(admin_user)
    response = client.post(
        "/api/providers/",
        {
            "slug": "aws-main",
            "display_name": "AWS",
            "kind": "aws",
            "region": "eu-west-1",
            "credentials": SECRET,
        },
        format="json",
    )
    assert response.status_code == 201, response.json()
    body = response.json()
    assert "credentials" not in body
    assert body["has_credentials"] is True
    assert SECRET not in response.content.decode()

    stored = _stored_credentials("aws-main")
    assert stored and SECRET not in stored
    assert decrypt_secret(stored) == SECRET

    for path in ("/api/providers/", "/api/providers/aws-main/"):
        read = client.get(path)
        assert read.status_code == 200
        assert SECRET not in read.content.decode()
        assert stored not in read.content.decode()


def test_a_provider_update_without_credentials_keeps_them_and_an_empty_string_clears_them(
    admin_user: User,
) -> None:
    client = api_client(admin_user)
    client.post("/api/providers/", {"slug": "p", "display_name": "P", "kind": "gcp", "credentials": SECRET})
    before = _stored_credentials("p")

    renamed = client.patch("/api/providers/p/", {"display_name": "Renamed"}, format="json")
    assert renamed.status_code == 200
    assert renamed.json()["has_credentials"] is True
    assert _stored_credentials("p") == before

    cleared = client.patch("/api/providers/p/", {"credentials": ""}, format="json")
    assert cleared.status_code == 200
    assert cleared.json()["has_credentials"] is False
    assert _stored_credentials("p") == ""


def test_replacing_credentials_stores_the_new_value_encrypted(admin_user: User) -> None:
    client = api_client(admin_user)
    client.post("/api/providers/", {"slug": "p", "display_name": "P", "kind": "gcp", "credentials": "old"})
    response = client.put(
        "/api/providers/p/",
        {"slug": "p", "display_name": "P", "kind": "gcp", "credentials": "new-secret"},
        format="json",
    )
    assert response.status_code == 200
    assert "new-secret" not in response.content.decode()
    assert decrypt_secret(_stored_credentials("p")) == "new-secret"


def test_a_bad_provider_gets_per_field_messages_and_nothing_is_written(admin_user: User) -> None:
    make_provider(slug="taken")
    before = Provider.objects.count()
    response = api_client(admin_user).post(
        "/api/providers/",
        {
            "slug": "taken",
            "display_name": "",
            "kind": "mainframe",
            "base_url": "not a url",
            "credentials": SECRET,
        },
        format="json",
    )
    assert response.status_code == 400
    assert {"slug", "display_name", "kind", "base_url"} <= response.json().keys()
    assert Provider.objects.count() == before


def test_deleting_an_unused_provider_removes_it(admin_user: User) -> None:
    make_provider(slug="gone")
    response = api_client(admin_user).delete("/api/providers/gone/")
    assert response.status_code == 204
    assert not Provider.objects.filter(slug="gone").exists()


# --- Clusters ----------------------------------------------------------------------------------


def test_an_operator_creates_reads_updates_and_deletes_a_cluster_by_slug(operator: User) -> None:
    make_provider(slug="onprem", kind=Provider.Kind.ON_PREM)
    client = api_client(operator)
    created = client.post(
        "/api/clusters/",
        {
            "slug": "rack-a",
            "provider": "onprem",
            "region": "lab",
            "accelerator_type": "H100",
            "accelerator_count": 8,
            "memory_per_node_gb": 640,
            "capacity_type": "spot",
            "capacity": 2,
        },
        format="json",
    )
    assert created.status_code == 201, created.json()
    body = created.json()
    assert body["queue"] == "cluster.rack-a"
    assert body["status"] == "down"  # no heartbeat yet
    assert body["provider"] == "onprem"

    assert client.get("/api/clusters/rack-a/").json()["accelerator_type"] == "H100"
    patched = client.patch("/api/clusters/rack-a/", {"capacity": 4, "status": "healthy"}, format="json")
    assert patched.status_code == 200
    cluster = Cluster.objects.get(slug="rack-a")
    assert cluster.capacity == 4
    assert cluster.status == Cluster.Status.DOWN  # status follows heartbeats, not the API

    listed = client.get("/api/clusters/").json()
    assert [c["slug"] for c in listed["results"]] == ["rack-a"]

    assert client.delete("/api/clusters/rack-a/").status_code == 204
    assert not Cluster.objects.filter(slug="rack-a").exists()


def test_a_bad_cluster_gets_per_field_messages_and_nothing_is_written(operator: User) -> None:
    make_provider(slug="aws")
    before = Cluster.objects.count()
    response = api_client(operator).post(
        "/api/clusters/",
        {
            "slug": "Bad Slug!",
            "provider": "no-such-provider",
            "accelerator_type": "",
            "accelerator_count": 0,
            "capacity_type": "reserved",
            "capacity": -1,
        },
        format="json",
    )
    assert response.status_code == 400
    body = response.json()
    assert {
        "slug",
        "provider",
        "accelerator_type",
        "accelerator_count",
        "capacity_type",
        "capacity",
    } <= body.keys()
    assert all(isinstance(messages, list) and messages for messages in body.values())
    assert Cluster.objects.count() == before


def test_a_duplicate_cluster_slug_is_a_field_error(operator: User) -> None:
    cluster = make_cluster(slug="dup")
    response = api_client(operator).post(
        "/api/clusters/",
        {"slug": "dup", "provider": cluster.provider.slug, "accelerator_type": "cpu", "accelerator_count": 1},
        format="json",
    )
    assert response.status_code == 400
    assert "slug" in response.json()
    assert Cluster.objects.filter(slug="dup").count() == 1


def test_deleting_a_cluster_that_has_usage_is_a_conflict_and_the_cluster_remains(operator: User) -> None:
    cluster = make_cluster(slug="billed")
    usage_record(
        unit=Unit.ACCELERATOR_HOUR,
        quantity=Decimal("1"),
        occurred_at=timezone.now(),
        idempotency_key="test:billed",
        subject_type="test",
        subject_id="1",
        cluster=cluster,
    )
    response = api_client(operator).delete("/api/clusters/billed/")
    assert response.status_code == 409
    assert "detail" in response.json()
    assert Cluster.objects.filter(slug="billed").exists()


def test_draining_and_resuming_a_cluster_through_the_api(operator: User) -> None:
    make_cluster(slug="drainme", price=None)
    client = api_client(operator)
    drained = client.post("/api/clusters/drainme/drain/")
    assert drained.status_code == 200
    assert drained.json()["status"] == "draining"
    assert Cluster.objects.get(slug="drainme").status == Cluster.Status.DRAINING
    resumed = client.post("/api/clusters/drainme/resume/")
    assert resumed.json()["status"] == "down"  # never heard from: down until a heartbeat


# --- Models and deployments ------------------------------------------------------------------------


def test_an_operator_manages_models_by_slug(operator: User, settings: Any) -> None:
    settings.OBJECT_STORE_URL = "s3://b/objects"
    client = api_client(operator)
    created = client.post(
        "/api/models/",
        {
            "slug": "tiny",
            "family": "gpt-byte",
            "parameter_count": 1000,
            "artifact_uri": "s3://b/objects/tiny",
        },
        format="json",
    )
    assert created.status_code == 201, created.json()
    assert client.patch("/api/models/tiny/", {"context_length": 256}, format="json").status_code == 200
    assert RegisteredModel.objects.get(slug="tiny").context_length == 256
    assert client.delete("/api/models/tiny/").status_code == 204
    assert not RegisteredModel.objects.exists()


def test_a_model_with_an_unsupported_artifact_uri_is_refused(operator: User) -> None:
    response = api_client(operator).post(
        "/api/models/",
        {"slug": "m", "family": "x", "artifact_uri": "http://example.com/m.bin", "parameter_count": -5},
        format="json",
    )
    assert response.status_code == 400
    assert {"artifact_uri", "parameter_count"} <= response.json().keys()
    assert not RegisteredModel.objects.exists()


def test_an_operator_manages_deployments_by_slug(operator: User) -> None:
    make_model(slug="tiny")
    make_provider(slug="oai", kind=Provider.Kind.OPENAI_COMPATIBLE)
    client = api_client(operator)
    created = client.post(
        "/api/deployments/",
        {"slug": "tiny-oai", "model": "tiny", "provider": "oai", "provider_model_id": "tiny-v1"},
        format="json",
    )
    assert created.status_code == 201, created.json()
    assert created.json()["model"] == "tiny"
    disabled = client.patch("/api/deployments/tiny-oai/", {"enabled": False}, format="json")
    assert disabled.status_code == 200
    assert Deployment.objects.get(slug="tiny-oai").enabled is False
    assert client.delete("/api/deployments/tiny-oai/").status_code == 204
    assert not Deployment.objects.exists()


def test_a_deployment_needs_a_model_id_or_an_endpoint(operator: User) -> None:
    make_model(slug="tiny")
    make_provider(slug="oai")
    response = api_client(operator).post(
        "/api/deployments/", {"slug": "d", "model": "tiny", "provider": "oai"}, format="json"
    )
    assert response.status_code == 400
    assert "provider_model_id" in response.json()
    assert not Deployment.objects.exists()


def test_a_model_in_use_by_a_deployment_cannot_be_deleted(operator: User) -> None:
    deployment = make_deployment()
    response = api_client(operator).delete(f"/api/models/{deployment.model.slug}/")
    assert response.status_code == 409
    assert RegisteredModel.objects.filter(pk=deployment.model.pk).exists()


def test_an_unknown_slug_is_404(operator: User) -> None:
    assert api_client(operator).get("/api/clusters/nope/").status_code == 404


# --- Schema ------------------------------------------------------------------------------------------


def test_the_openapi_schema_names_every_endpoint(viewer: User) -> None:
    response = api_client(viewer).get("/api/schema/", {"format": "json"})
    assert response.status_code == 200
    schema = response.json()
    assert schema["openapi"].startswith("3.")
    paths = schema["paths"]
    for path in (
        "/api/providers/",
        "/api/providers/{slug}/",
        "/api/clusters/",
        "/api/clusters/{slug}/drain/",
        "/api/models/",
        "/api/deployments/",
        "/api/workflows/",
        "/api/workflows/{slug}/switch/",
        "/api/workflows/{slug}/versions/",
        "/api/failover-events/",
        "/api/probe-jobs/",
        "/api/usage-records/",
        "/api/price-books/",
    ):
        assert path in paths, path
    provider_schema = schema["components"]["schemas"]["Provider"]
    assert provider_schema["properties"]["credentials"].get("writeOnly") is True
