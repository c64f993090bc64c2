"""A cluster's own object store as a trust boundary: the URL, endpoint and credentials are checked
where they enter (API, page form), the credentials are stored encrypted and never shown, and
only admins set them (registry.auth.fields), although operators change the rest of a cluster."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.test import Client

from registry.crypto import decrypt_secret
from registry.models import Cluster
from registry.store.cluster_stores import cluster_store
from storage.objectstore import FileStore
from tests.factories import api_client, make_cluster, make_provider

pytestmark = pytest.mark.django_db

KEYS = "AKIAEXAMPLEKEY42:wJalr/XUtnFEMI+K7MDENG=bPxRfiCY"


@pytest.fixture
def root(tmp_path: Path, settings: Any) -> Path:
    settings.CLUSTER_STORE_FILE_ROOT = tmp_path / "clusters"
    (tmp_path / "clusters").mkdir()
    return tmp_path / "clusters"


def _body(**fields: Any) -> dict[str, Any]:
    body = {
        "slug": "far",
        "provider": "aws",
        "accelerator_type": "H100",
        "accelerator_count": 8,
        "capacity": 2,
    }
    body.update(fields)
    return body


def _stored_keys(slug: str) -> str:
    with connection.cursor() as cursor:
        cursor.execute("SELECT object_store_credentials_encrypted FROM stack_cluster WHERE slug = %s", [slug])
        (value,) = cursor.fetchone()
    return str(value)


def test_an_admin_gives_a_cluster_its_store_whose_keys_are_stored_encrypted_and_never_returned(
    admin_user: User, root: Path
) -> None:
    make_provider(slug="aws")
    client = api_client(admin_user)
    body = _body(
        object_store_url="s3://far-checkpoints/switchyard",
        object_store_endpoint_url="https://s3.eu-west-1.example.com",
        object_store_credentials=KEYS,
    )
    created = client.post("/api/clusters/", body, format="json")
    assert created.status_code == 201, created.json()
    assert created.json()["has_object_store_credentials"] is True
    secret = KEYS.split(":")[1]
    for response in (created, client.get("/api/clusters/far/"), client.get("/api/clusters/")):
        assert secret not in response.content.decode() and "AKIAEXAMPLEKEY42" not in response.content.decode()
    stored = _stored_keys("far")
    assert secret not in stored and decrypt_secret(stored) == KEYS
    store = cluster_store(Cluster.objects.get(slug="far"))
    assert store is not None and store.url == "s3://far-checkpoints/switchyard/"
    # Kept when left out, cleared by an empty string.
    assert client.patch("/api/clusters/far/", {"capacity": 3}, format="json").status_code == 200
    assert _stored_keys("far") == stored
    assert (
        client.patch("/api/clusters/far/", {"object_store_credentials": ""}, format="json").status_code == 200
    )
    assert _stored_keys("far") == ""


def test_a_file_store_under_the_root_opens_there(admin_user: User, root: Path) -> None:
    make_provider(slug="aws")
    url = f"file://{root}/far"
    assert (
        api_client(admin_user).post("/api/clusters/", _body(object_store_url=url), format="json").status_code
        == 201
    )
    store = cluster_store(Cluster.objects.get(slug="far"))
    assert isinstance(store, FileStore) and store.root == root / "far"
    assert cluster_store(make_cluster()) is None  # no store of its own: the installation's


BAD_URLS = [
    "http://bucket/x",  # not a store scheme
    "s3://Upper_Case",  # not a bucket name
    "s3://ab",  # too short
    "s3://192.168.0.1/x",  # an address, not a bucket
    "s3://bucket/../other",  # climbing out of the prefix
    "s3://bucket/a/%2e%2e/b",  # an escaped climb
    "s3://bucket/x?versionId=1",  # a query
    "s3://bucket/x#frag",
    "s3://user:pw@bucket/x",  # credentials in the URL
    "s3://bucket:9000/x",  # a port (the endpoint is its own field)
    "s3://bucket/a b",  # not a key segment
    "s3://bucket/x\nHost: evil",  # a control character
    "file:///etc",  # outside the root
    "file://host/dir",  # not an absolute path
    "file:///{root}/../escape",  # out of the root by ..
]


@pytest.mark.parametrize("url", BAD_URLS)
def test_a_store_url_that_could_leave_its_place_is_a_field_error_and_nothing_is_written(
    admin_user: User, root: Path, url: str
) -> None:
    make_provider(slug="aws")
    response = api_client(admin_user).post(
        "/api/clusters/", _body(object_store_url=url.replace("{root}", str(root).lstrip("/"))), format="json"
    )
    assert response.status_code == 400, response.json()
    assert response.json()["object_store_url"], response.json()
    assert not Cluster.objects.filter(slug="far").exists()


def test_a_symlink_out_of_the_root_is_refused(admin_user: User, root: Path, tmp_path: Path) -> None:
    make_provider(slug="aws")
    (tmp_path / "elsewhere").mkdir()
    os.symlink(tmp_path / "elsewhere", root / "link")
    response = api_client(admin_user).post(
        "/api/clusters/", _body(object_store_url=f"file://{root}/link/sub"), format="json"
    )
    assert response.status_code == 400 and "CLUSTER_STORE_FILE_ROOT" in response.json()["object_store_url"][0]


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("object_store_endpoint_url", "ftp://s3.example.com"),
        ("object_store_endpoint_url", "https://user:pw@s3.example.com"),
        ("object_store_endpoint_url", "https://s3.example.com/?x=1"),
        ("object_store_credentials", "no-colon-here"),
        ("object_store_credentials", ":secret-without-key-id"),
        ("object_store_credentials", "AKIAEXAMPLEKEY42:"),
        ("object_store_credentials", "AKIAEXAMPLEKEY42:has a space"),
        ("object_store_credentials", "AKIAEXAMPLEKEY42:line\r\nbreak"),
        ("object_store_credentials", "AKIA/../x:secret"),
    ],
)
def test_a_bad_endpoint_or_key_pair_is_a_field_error(
    admin_user: User, root: Path, field: str, value: str
) -> None:
    make_provider(slug="aws")
    body = _body(object_store_url="s3://far-checkpoints", **{field: value})
    response = api_client(admin_user).post("/api/clusters/", body, format="json")
    assert response.status_code == 400 and response.json()[field], response.json()
    assert not Cluster.objects.filter(slug="far").exists()


def test_an_endpoint_without_an_s3_store_is_refused(admin_user: User, root: Path) -> None:
    make_provider(slug="aws")
    body = _body(object_store_endpoint_url="https://s3.example.com")
    response = api_client(admin_user).post("/api/clusters/", body, format="json")
    assert response.status_code == 400 and "object_store_endpoint_url" in response.json()


def test_an_operator_changes_a_cluster_but_not_where_it_keeps_its_state(operator: User, root: Path) -> None:
    make_provider(slug="aws")
    client = api_client(operator)
    refused = client.post("/api/clusters/", _body(object_store_url="s3://far-checkpoints"), format="json")
    assert refused.status_code == 403 and "object_store_url" in refused.json()["detail"]
    assert not Cluster.objects.filter(slug="far").exists()
    assert client.post("/api/clusters/", _body(), format="json").status_code == 201
    for change in (
        {"object_store_url": "s3://attacker-bucket"},
        {"object_store_endpoint_url": "https://collector.example.com"},
        {"object_store_credentials": KEYS},
        {"object_store_credentials": ""},
    ):
        response = client.patch("/api/clusters/far/", change, format="json")
        assert response.status_code == 403, (change, response.json())
    cluster = Cluster.objects.get(slug="far")
    assert (cluster.object_store_url, cluster.object_store_endpoint_url, _stored_keys("far")) == ("", "", "")
    # The rest of the cluster, and a body that repeats the stored store, are the operator's.
    whole = client.get("/api/clusters/far/").json()
    whole["capacity"] = 4
    assert client.put("/api/clusters/far/", whole, format="json").status_code == 200
    assert Cluster.objects.get(slug="far").capacity == 4


def test_the_cluster_form_offers_the_store_to_admins_only_and_shows_a_bad_url_as_a_form_error(
    operator: User, admin_user: User, root: Path
) -> None:
    provider = make_provider()
    as_operator, as_admin = Client(), Client()
    as_operator.force_login(operator)
    as_admin.force_login(admin_user)
    assert "object_store_url" not in as_operator.get("/clusters/new/").content.decode()
    assert 'name="object_store_url"' in as_admin.get("/clusters/new/").content.decode()
    fields = {"provider": provider.pk, "slug": "far", "accelerator_type": "H100", "accelerator_count": 8,
              "memory_per_node_gb": 0, "capacity_type": "on-demand", "capacity": 2}  # fmt: skip
    # The operator's post of the field is ignored: the cluster is made without a store.
    assert (
        as_operator.post("/clusters/new/", {**fields, "object_store_url": "s3://attacker-bucket"}).status_code
        == 302
    )
    assert Cluster.objects.get(slug="far").object_store_url == ""
    response = as_admin.post("/clusters/new/", {**fields, "slug": "far2", "object_store_url": "file:///etc"})
    assert response.status_code in (200, 400)
    assert "CLUSTER_STORE_FILE_ROOT" in response.content.decode()
    assert not Cluster.objects.filter(slug="far2").exists()
    stored = as_admin.post(
        "/clusters/new/",
        {
            **fields,
            "slug": "far3",
            "object_store_url": f"file://{root}/far3",
            "object_store_credentials": KEYS,
        },
    )
    assert stored.status_code == 302
    assert decrypt_secret(_stored_keys("far3")) == KEYS
    edit = as_admin.get("/clusters/far3/edit/")
    assert edit.status_code == 200 and f"file://{root}/far3" in edit.content.decode()
    assert KEYS.split(":")[1] not in edit.content.decode()
