"""Authentication and per-endpoint roles on the API."""

from __future__ import annotations

from decimal import Decimal

import pytest
from django.contrib.auth.models import User
from rest_framework.test import APIClient

from registry.auth.roles import Role
from registry.models import ApiToken, Cluster, Provider
from registry.services import api_token_create, api_token_revoke
from tests.factories import api_client, make_cluster, make_price, make_provider, make_user
from training.models import ProbeJob

pytestmark = pytest.mark.django_db


def _bearer(raw: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    return client


def _cluster_body(provider: Provider, slug: str = "new-cluster") -> dict[str, object]:
    return {"slug": slug, "provider": provider.slug, "accelerator_type": "cpu", "accelerator_count": 1}


@pytest.mark.parametrize(
    "path",
    ["/api/", "/api/providers/", "/api/clusters/", "/api/usage-records/", "/api/probe-jobs/", "/api/schema/"],
)
def test_a_request_without_credentials_is_401_with_a_bearer_challenge(path: str) -> None:
    response = APIClient().get(path)
    assert response.status_code == 401
    assert response["WWW-Authenticate"].startswith("Bearer")


def test_a_write_without_credentials_is_401_and_writes_nothing() -> None:
    provider = make_provider()
    response = APIClient().post("/api/clusters/", _cluster_body(provider), format="json")
    assert response.status_code == 401
    assert not Cluster.objects.exists()


@pytest.mark.parametrize(
    "raw",
    [
        "garbage",
        "sy_nope_nope",
        "sy__",
        "Token sy_abc_def",
    ],
)
def test_a_garbage_token_is_401(raw: str) -> None:
    assert _bearer(raw).get("/api/clusters/").status_code == 401


def test_a_token_with_the_right_prefix_and_a_wrong_secret_is_401(viewer: User) -> None:
    token, raw = api_token_create(user=viewer, name="t")
    forged = f"sy_{token.prefix}_{'x' * 43}"
    assert raw != forged
    assert _bearer(forged).get("/api/clusters/").status_code == 401


def test_a_revoked_token_is_401(viewer: User) -> None:
    token, raw = api_token_create(user=viewer, name="t")
    assert _bearer(raw).get("/api/clusters/").status_code == 200
    api_token_revoke(token=token)
    assert _bearer(raw).get("/api/clusters/").status_code == 401


def test_a_token_of_a_deactivated_user_is_401(viewer: User) -> None:
    _, raw = api_token_create(user=viewer, name="t")
    viewer.is_active = False
    viewer.save(update_fields=["is_active"])
    assert _bearer(raw).get("/api/clusters/").status_code == 401


def test_using_a_token_stamps_its_last_use(viewer: User) -> None:
    token, raw = api_token_create(user=viewer, name="t")
    assert token.last_used_at is None
    _bearer(raw).get("/api/clusters/")
    assert ApiToken.objects.get(pk=token.pk).last_used_at is not None


def test_a_user_without_any_role_is_403_everywhere() -> None:
    nobody = make_user(None)
    client = api_client(nobody)
    assert client.get("/api/clusters/").status_code == 403
    assert client.get("/api/providers/").status_code == 403


@pytest.mark.parametrize(
    "path", ["/api/providers/", "/api/clusters/", "/api/models/", "/api/deployments/", "/api/workflows/"]
)
def test_a_viewer_reads_the_registry(viewer: User, path: str) -> None:
    assert api_client(viewer).get(path).status_code == 200


def test_a_viewer_cannot_create_a_cluster(viewer: User) -> None:
    provider = make_provider()
    response = api_client(viewer).post("/api/clusters/", _cluster_body(provider), format="json")
    assert response.status_code == 403
    assert not Cluster.objects.exists()


def test_a_viewer_cannot_change_or_delete_a_cluster(viewer: User) -> None:
    cluster = make_cluster(slug="keep", price=None)
    client = api_client(viewer)
    assert client.patch("/api/clusters/keep/", {"capacity": 9}, format="json").status_code == 403
    assert client.delete("/api/clusters/keep/").status_code == 403
    assert client.post("/api/clusters/keep/drain/").status_code == 403
    cluster.refresh_from_db()
    assert cluster.capacity == 2
    assert cluster.status == Cluster.Status.DOWN


def test_the_ledger_is_closed_to_viewers_and_open_to_auditors(viewer: User, auditor: User) -> None:
    assert api_client(viewer).get("/api/usage-records/").status_code == 403
    assert api_client(viewer).get("/api/price-books/").status_code == 403
    assert api_client(auditor).get("/api/usage-records/").status_code == 200
    assert api_client(auditor).get("/api/price-books/").status_code == 200


def test_an_auditor_reads_the_registry_but_cannot_write_it(auditor: User) -> None:
    provider = make_provider()
    client = api_client(auditor)
    assert client.get("/api/clusters/").status_code == 200
    assert client.post("/api/clusters/", _cluster_body(provider), format="json").status_code == 403
    assert not Cluster.objects.exists()


def test_only_an_admin_may_create_a_provider(operator: User, admin_user: User) -> None:
    body = {"slug": "new-prov", "display_name": "New", "kind": "aws"}
    assert api_client(operator).post("/api/providers/", body, format="json").status_code == 403
    assert not Provider.objects.filter(slug="new-prov").exists()
    assert api_client(admin_user).post("/api/providers/", body, format="json").status_code == 201
    assert Provider.objects.filter(slug="new-prov").exists()


def test_an_operator_cannot_change_provider_credentials(operator: User) -> None:
    make_provider(slug="p")
    response = api_client(operator).patch("/api/providers/p/", {"credentials": "stolen"}, format="json")
    assert response.status_code == 403
    assert Provider.objects.get(slug="p").credentials_encrypted == ""


def test_a_superuser_counts_as_an_admin() -> None:
    root = User.objects.create_superuser(username="root", password="pw-for-tests-1")
    body = {"slug": "by-root", "display_name": "Root's", "kind": "other"}
    assert api_client(root).post("/api/providers/", body, format="json").status_code == 201


def test_an_operator_creates_clusters_and_probe_jobs(operator: User) -> None:
    provider = make_provider()
    client = api_client(operator)
    assert client.post("/api/clusters/", _cluster_body(provider, "op-made"), format="json").status_code == 201
    make_price(cluster=Cluster.objects.get(slug="op-made"), unit_price=Decimal("1.5"))
    response = client.post("/api/probe-jobs/", {"cluster": "op-made", "steps": 20}, format="json")
    assert response.status_code == 201, response.json()
    job = ProbeJob.objects.get()
    assert (job.cluster.slug, job.steps, job.created_by) == ("op-made", 20, operator)


def test_a_viewer_cannot_dispatch_a_probe_job(viewer: User) -> None:
    make_cluster(slug="c")
    response = api_client(viewer).post("/api/probe-jobs/", {"cluster": "c", "steps": 20}, format="json")
    assert response.status_code == 403
    assert not ProbeJob.objects.exists()


def test_session_authentication_works_for_reads(viewer: User) -> None:
    make_cluster(slug="seen", price=None)
    client = APIClient()
    client.force_login(viewer)
    response = client.get("/api/clusters/")
    assert response.status_code == 200
    assert [c["slug"] for c in response.json()["results"]] == ["seen"]


def test_session_authentication_still_applies_roles(viewer: User) -> None:
    client = APIClient()
    client.force_login(viewer)
    assert client.get("/api/usage-records/").status_code == 403


def test_session_writes_require_a_csrf_token(operator: User) -> None:
    provider = make_provider()
    client = APIClient(enforce_csrf_checks=True)
    client.force_login(operator)
    response = client.post("/api/clusters/", _cluster_body(provider), format="json")
    assert response.status_code == 403
    assert "CSRF" in response.json()["detail"]
    assert not Cluster.objects.exists()


def test_roles_are_django_groups_made_by_the_migration() -> None:
    from django.contrib.auth.models import Group

    assert set(Group.objects.values_list("name", flat=True)) >= {r.value for r in Role}
