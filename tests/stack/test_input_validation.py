"""Bad input anywhere in the API or on the pages is a 4xx naming what is wrong, never a 500.

One check per kind of input (registry.validation, used by the API's parser, pagination,
query-parameter backend and fields, the middleware, the form fields and the commands); these
tests probe each kind on every endpoint of that kind (tests/stack/test_validation.py checks
that every serializer and form is built from the checked fields).
"""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from django.core.management import CommandError, call_command
from django.test import Client
from rest_framework.test import APIClient

from registry.models import ApiToken, Workflow
from stack.urls import router
from tests.factories import api_client, fabricate_run, make_deployment, make_provider, make_workflow

DEEP = 100_000  # far past Python's recursion limit


def _page_client(user: User) -> Client:
    client = Client()
    client.force_login(user)
    return client


# --- Pagination ----------------------------------------------------------------------------------------


def _list_routes() -> list[str]:
    return sorted(f"/api/{prefix}/" for prefix, viewset, _ in router.registry if hasattr(viewset, "list"))


@pytest.mark.django_db
@pytest.mark.parametrize("path", _list_routes())
def test_an_oversized_limit_is_served_as_the_largest_page_on_every_list_endpoint(
    admin_user: User, path: str
) -> None:
    # Rows in most lists: an empty list never reached the database's LIMIT (bigint out of range).
    fabricate_run()
    make_workflow(owner=admin_user)
    response = api_client(admin_user).get(path, {"limit": str(10**30), "offset": "0"})
    assert response.status_code == 200, response.content
    body = response.json()
    if isinstance(body, dict) and "results" in body:
        assert 0 < len(body["results"]) <= 1000 or body["count"] == 0


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("param", "value"),
    [
        ("limit", "abc"),
        ("limit", "0"),
        ("limit", "-5"),
        ("limit", "١٢"),
        ("offset", "-1"),
        ("offset", str(2**63)),
        ("offset", "1.5"),
    ],
)
def test_a_malformed_limit_or_offset_is_refused_naming_the_parameter(
    admin_user: User, param: str, value: str
) -> None:
    response = api_client(admin_user).get("/api/providers/", {param: value})
    assert response.status_code == 400
    assert list(response.json()) == [param]


@pytest.mark.django_db
def test_pages_of_a_list_go_on_past_the_largest_page(admin_user: User) -> None:
    for i in range(3):
        make_provider(slug=f"p{i}")
    first = api_client(admin_user).get("/api/providers/", {"limit": "2"}).json()
    assert len(first["results"]) == 2 and first["next"].endswith("limit=2&offset=2")
    assert api_client(admin_user).get("/api/providers/", {"offset": "99999"}).json()["results"] == []


# --- Ids and slugs in paths ---------------------------------------------------------------------------


def _detail_routes() -> list[str]:
    return sorted(
        f"/api/{prefix}/"
        for prefix, viewset, _ in router.registry
        if hasattr(viewset, "retrieve") and getattr(viewset, "lookup_field", "pk") == "pk"
    )


@pytest.mark.django_db
@pytest.mark.parametrize("path", _detail_routes())
@pytest.mark.parametrize("bad_id", ["abc", "²", "١٢", "1.5", str(10**30)])
def test_a_malformed_or_out_of_range_id_is_404_on_every_detail_route(
    admin_user: User, path: str, bad_id: str
) -> None:
    response = api_client(admin_user).get(f"{path}{bad_id}/")
    assert response.status_code == 404
    assert "detail" in response.json()  # JSON, whether DRF or no route answered


@pytest.mark.django_db
@pytest.mark.parametrize("path", ["/api/nothing-here/", "/api/providers/a.b/", "/api/budgets/1/nope/"])
def test_an_api_path_that_matches_no_route_answers_404_in_json(admin_user: User, path: str) -> None:
    response = api_client(admin_user).get(path)
    assert response.status_code == 404
    assert response["Content-Type"] == "application/json"
    assert response.json() == {"detail": "Not found."}


@pytest.mark.django_db
def test_a_page_that_matches_no_route_is_still_an_html_404(admin_user: User) -> None:
    response = _page_client(admin_user).get("/no-such-page/")
    assert response.status_code == 404
    assert response["Content-Type"].startswith("text/html")


@pytest.mark.django_db
@pytest.mark.parametrize(
    "action", ["batch-jobs/{id}/cancel/", "eval-sets/{id}/cases/", "budget-alerts/{id}/acknowledge/"]
)
@pytest.mark.parametrize("bad_id", ["abc", "²", str(10**30)])
def test_custom_actions_answer_404_for_a_malformed_id(admin_user: User, action: str, bad_id: str) -> None:
    response = api_client(admin_user).post(f"/api/{action.format(id=bad_id)}", {}, format="json")
    assert response.status_code == 404


@pytest.mark.django_db
@pytest.mark.parametrize(
    "path",
    [
        "/api/providers/a%00b/",
        "/api/chaos/a%00b/",
        "/api/workflows/a%01/versions/",
        "/api/usage-records/?workflow=a%00",
        "/api/eval-sets/?workflow=%00",
        "/api/providers/?x%00=1",
    ],
)
def test_nul_or_control_characters_in_a_path_or_query_are_refused_before_the_database(
    admin_user: User, path: str
) -> None:
    response = api_client(admin_user).get(path)
    assert response.status_code == 400
    assert "control character" in str(response.json())


@pytest.mark.django_db
@pytest.mark.parametrize(
    "path", ["/workflows/a%00/", "/billing/ledger/?workflow=a%00", "/inference/providers/x%00y/"]
)
def test_a_page_refuses_control_characters_in_its_address(admin_user: User, path: str) -> None:
    response = _page_client(admin_user).get(path)
    assert response.status_code == 400
    assert b"control character (U+0000)" in response.content


# --- Bodies -----------------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_nul_in_a_slug_anywhere_in_a_json_body_is_refused_naming_the_field(admin_user: User) -> None:
    deployment = make_deployment()
    body = {"slug": "wf", "route": {"deployments": [deployment.slug, "x\u0000y"]}}
    response = api_client(admin_user).post("/api/workflows/", body, format="json")
    assert response.status_code == 400
    assert response.json() == {
        "route.deployments[1]": ["contains a control character (U+0000) at position 2"]
    }
    assert not Workflow.objects.exists()


@pytest.mark.django_db
def test_nul_in_a_form_encoded_api_body_is_refused(admin_user: User) -> None:
    provider = make_provider()
    client = api_client(admin_user)
    post = client.post("/api/clusters/", {"slug": "c", "provider": "a\x00", "accelerator_count": "1"})
    assert post.status_code == 400 and "control character" in str(post.json()["provider"])
    patch = client.patch(
        f"/api/providers/{provider.slug}/",
        "display_name=a%01",
        content_type="application/x-www-form-urlencoded",
    )
    assert patch.status_code == 400 and "control character" in str(patch.json()["display_name"])


@pytest.mark.django_db
@pytest.mark.parametrize("body", ["[1, 2]", '"enabled"', "3", "null", "true"])
def test_a_body_that_is_not_a_json_object_is_refused(admin_user: User, body: str) -> None:
    client = api_client(admin_user)
    for method, path in (("post", "/api/workflows/"), ("post", "/api/price-books/")):
        response = getattr(client, method)(path, body, content_type="application/json")
        assert response.status_code == 400
        assert "must be a JSON object" in response.json()["detail"]


@pytest.mark.django_db
def test_a_deeply_nested_json_body_is_refused_not_a_recursion_error(admin_user: User) -> None:
    body = '{"name": "deep", "config": ' + "[" * DEEP + "]" * DEEP + "}"
    response = api_client(admin_user).post("/api/training-runs/", body, content_type="application/json")
    assert response.status_code == 400
    assert "nested more than" in response.json()["detail"]


@pytest.mark.django_db
def test_a_json_body_larger_than_the_limit_is_413(admin_user: User, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("registry.api.parsers.BoundedJSONParser.max_bytes", 1000)
    body = '{"slug": "w", "description": "' + "x" * 2000 + '"}'
    response = api_client(admin_user).post("/api/workflows/", body, content_type="application/json")
    assert response.status_code == 413
    assert "larger than 1000 bytes" in response.json()["detail"]


@pytest.mark.django_db
def test_a_json_text_in_a_form_field_is_bounded_too(admin_user: User) -> None:
    response = api_client(admin_user).post(
        "/api/training-runs/", {"name": "deep", "config": "[" * DEEP + "]" * DEEP}, format="multipart"
    )
    assert response.status_code == 400
    assert "nested more than" in str(response.json()["config"])


# --- Query parameters ---------------------------------------------------------------------------------------


@pytest.mark.django_db
@pytest.mark.parametrize(
    "path", ["/api/usage-records/?provder=aws", "/api/providers/?page=2", "/api/budget-alerts/?bugdet=1"]
)
def test_an_unknown_query_parameter_is_refused_naming_it_instead_of_listing_everything(
    admin_user: User, path: str
) -> None:
    response = api_client(admin_user).get(path)
    assert response.status_code == 400
    name = path.split("?")[1].split("=")[0]
    assert name in response.json() and "unknown query parameter" in response.json()[name][0]


@pytest.mark.django_db
@pytest.mark.parametrize("path", ["/api/budget-alerts/?budget=²", "/api/eval-runs/?eval_set=١"])
def test_an_id_filter_that_is_no_id_is_refused_not_a_server_error(admin_user: User, path: str) -> None:
    response = api_client(admin_user).get(path)
    assert response.status_code == 400


@pytest.mark.django_db
def test_a_filter_value_outside_its_documented_choices_is_refused_naming_them(admin_user: User) -> None:
    client = api_client(admin_user)
    response = client.get("/api/failover-events/?kind=AAA")
    assert response.status_code == 400
    assert response.json() == {"kind": ["must be one of: cluster-health, training, inference"]}
    assert client.get("/api/failover-events/?kind=inference").status_code == 200
    assert client.get("/api/failover-events/?kind=").status_code == 200  # empty: no filter


@pytest.mark.django_db
def test_known_query_parameters_still_filter(admin_user: User) -> None:
    response = api_client(admin_user).get("/api/usage-records/?provider=aws&limit=5&offset=0&format=json")
    assert response.status_code == 200


# --- Tokens ---------------------------------------------------------------------------------------------------


@pytest.mark.django_db
@pytest.mark.parametrize("token_id", ["²", "١", "abc", str(10**30), ""])
def test_revoking_a_token_by_a_malformed_id_on_the_tokens_page_is_404(viewer: User, token_id: str) -> None:
    response = _page_client(viewer).post("/tokens/", {"revoke": token_id})
    assert response.status_code == 404


@pytest.mark.django_db
@pytest.mark.parametrize("raw", ["sy_ab\x00cd_secret", "sy_\x01_x", "sy_" + "a" * 40 + "_x"])
def test_a_bearer_token_no_token_can_have_is_401_without_a_lookup(raw: str) -> None:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    assert client.get("/api/providers/").status_code == 401


@pytest.mark.django_db
def test_apitoken_create_refuses_a_name_longer_than_its_column(viewer: User) -> None:
    with pytest.raises(CommandError, match="at most 100 characters"):
        call_command("apitoken", "create", "--user", viewer.username, "--name", "n" * 101)
    assert not ApiToken.objects.exists()


# --- Forms on pages -----------------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_a_page_form_refuses_nul_in_a_slug_choice_with_a_clear_400(admin_user: User) -> None:
    make_provider(slug="aws")
    response = _page_client(admin_user).post(
        "/billing/reconciliation/", {"provider": "aws\x00", "tolerance": "0.01"}
    )
    assert response.status_code == 400
    assert b"provider: contains a control character (U+0000)" in response.content


@pytest.mark.django_db
def test_a_registry_form_refuses_numbers_in_other_digits(admin_user: User) -> None:
    provider = make_provider(slug="aws")
    response = _page_client(admin_user).post(
        "/clusters/new/",
        {
            "provider": provider.pk,
            "slug": "c1",
            "accelerator_type": "A10G",
            "accelerator_count": "١٢",
            "memory_per_node_gb": "0",
            "capacity_type": "on-demand",
            "capacity": "1",
        },
    )
    assert response.status_code == 200  # Django's CreateView re-renders an invalid form
    assert "ASCII digits" in response.content.decode()
    assert not provider.clusters.exists()
