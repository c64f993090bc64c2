from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from registry.models import Cluster
from tests.factories import api_client, make_provider


@pytest.mark.django_db
def test_it_refuses_api_calls_without_a_token_with_401() -> None:
    response = APIClient().get("/api/clusters/")
    assert response.status_code == 401
    assert response["WWW-Authenticate"].startswith("Bearer")


@pytest.mark.django_db
def test_it_rejects_a_bad_cluster_with_field_errors_and_writes_nothing(operator) -> None:  # type: ignore[no-untyped-def]
    make_provider(slug="aws")
    response = api_client(operator).post(
        "/api/clusters/",
        {"slug": "bad slug!", "provider": "nope", "accelerator_type": "", "accelerator_count": 0},
        format="json",
    )
    assert response.status_code == 400
    body = response.json()
    assert {"slug", "provider", "accelerator_type", "accelerator_count"} <= body.keys()
    assert Cluster.objects.count() == 0
