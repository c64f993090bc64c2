"""Revoking a token, removing a role and deactivating a user take effect on the next request on
/api/ and on the pages (the /v1 gateway's cache is tested in tests/inference/test_gateway_revocation.py)."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Group, User
from django.test import Client
from rest_framework.test import APIClient

from registry.auth.roles import Role
from registry.models import ApiToken
from registry.services import api_token_create, api_token_revoke
from tests.factories import make_deployment, make_workflow

pytestmark = pytest.mark.django_db


def _api(user: User) -> tuple[APIClient, ApiToken]:
    token, raw = api_token_create(user=user, name="surfaces")
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    return client, token


def test_api_refuses_a_revoked_token_on_the_next_request(viewer: User) -> None:
    client, token = _api(viewer)
    assert client.get("/api/workflows/").status_code == 200
    api_token_revoke(token=token)
    assert client.get("/api/workflows/").status_code == 401


def test_api_refuses_a_removed_role_and_a_deactivated_user_on_the_next_request(viewer: User) -> None:
    client, _ = _api(viewer)
    assert client.get("/api/workflows/").status_code == 200
    viewer.groups.remove(Group.objects.get(name=Role.VIEWER.value))
    assert client.get("/api/workflows/").status_code == 403
    viewer.groups.add(Group.objects.get(name=Role.VIEWER.value))
    assert client.get("/api/workflows/").status_code == 200
    viewer.is_active = False
    viewer.save()
    assert client.get("/api/workflows/").status_code == 401


def test_api_follows_a_tokens_new_workflow_list_on_the_next_request(operator: User) -> None:
    client, token = _api(operator)
    a = make_workflow(owner=operator, deployments=[make_deployment()])
    b = make_workflow(owner=operator, deployments=[make_deployment()])
    assert client.get(f"/api/workflows/{b.slug}/").status_code == 200
    token.workflows.set([a])
    assert client.get(f"/api/workflows/{b.slug}/").status_code == 404
    assert client.get(f"/api/workflows/{a.slug}/").status_code == 200


def test_pages_refuse_a_removed_role_and_a_deactivated_user_on_the_next_request(viewer: User) -> None:
    browser = Client()
    browser.force_login(viewer)
    assert browser.get("/workflows/").status_code == 200
    viewer.groups.remove(Group.objects.get(name=Role.VIEWER.value))
    assert browser.get("/workflows/").status_code == 403
    viewer.groups.add(Group.objects.get(name=Role.VIEWER.value))
    viewer.is_active = False
    viewer.save()
    response = browser.get("/workflows/")
    assert response.status_code == 302 and response["Location"].startswith("/login/")
