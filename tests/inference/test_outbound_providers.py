"""Provider credentials go only where an admin sent them, and provider calls pass the outbound guard.

- A deployment's base URL must lie under its provider's endpoints (the admin-only provider record),
  on the API, the page form and at call time; an admin widens the endpoints, an operator cannot.
- A provider not allowed private networks never connects to loopback, private or metadata
  addresses; a redirect is never followed; an upstream error body stays in the server's log.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client

from bench.mockprovider import MockProviderServer
from inference.adapters.base import ChatMessage, ChatRequest, ProviderError, Target
from inference.adapters.registry import adapter_for
from inference.models import InferenceAttempt
from registry.models import Deployment, FailoverEvent, Provider
from registry.outbound import guard as outbound
from registry.services import api_token_create, provider_set_credentials
from tests.capture_server import CaptureServer
from tests.factories import api_client, make_model, make_provider
from tests.inference.helpers import priced_deployment, routed_workflow

pytestmark = pytest.mark.django_db

SECRET = "sk-live-provider-secret-0001"
CHAT = ChatRequest(messages=(ChatMessage("user", "ping"),), max_tokens=4)


@pytest.fixture(autouse=True)
def _fresh_decisions() -> Iterator[None]:
    outbound.decisions_clear()
    yield
    outbound.decisions_clear()


@pytest.fixture
def internal() -> Iterator[CaptureServer]:
    """An internal service on loopback that must never hear from a provider call."""
    server = CaptureServer(body=b'{"internal": "INTERNAL-SECRET-DATA"}').start()
    yield server
    server.stop()


def _credentialed_provider(**fields: Any) -> Provider:
    """A provider as an admin registers it: a public endpoint and an API key."""
    values: dict[str, Any] = {
        "kind": Provider.Kind.OPENAI_COMPATIBLE,
        "base_url": "https://api.provider.test/v1",
        "allow_private_network": False,
    }
    values.update(fields)
    return provider_set_credentials(provider=make_provider(**values), credentials=SECRET)


def _chat(raw: str, model: str) -> Any:
    body = {"model": model, "messages": [{"role": "user", "content": "ping"}]}
    return Client(HTTP_AUTHORIZATION=f"Bearer {raw}").post(
        "/v1/chat/completions", json.dumps(body), content_type="application/json"
    )


def _deployment_body(provider: Provider, **fields: Any) -> dict[str, Any]:
    return {
        "slug": "dep-x",
        "model": make_model().slug,
        "provider": provider.slug,
        "provider_model_id": "m",
        **fields,
    }


# --- Where credentials may go ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "base_url",
    [
        "http://127.0.0.1:9/v1",
        "https://api.provider.test.evil.example/v1",
        "https://api.provider.test:8443/v1",
        "http://api.provider.test/v1",
        "https://api.provider.test/v10",
        "https://api.provider.test/v1/../admin",
        "https://api.provider.test/v1/%2e%2e/admin",
        "https://user:pw@api.provider.test/v1",
        "https://api.provider.test/v1?redirect=http://10.0.0.1/",
    ],
)
def test_an_operator_cannot_send_a_providers_credentials_to_a_base_url_of_their_choice(
    operator: User, base_url: str
) -> None:
    provider = _credentialed_provider()
    response = api_client(operator).post(
        "/api/deployments/", _deployment_body(provider, base_url=base_url), format="json"
    )
    assert response.status_code == 400, response.content
    assert "base_url" in response.json()
    assert not Deployment.objects.filter(slug="dep-x").exists()


def test_an_operator_may_choose_a_path_under_the_providers_endpoint(operator: User) -> None:
    provider = _credentialed_provider()
    response = api_client(operator).post(
        "/api/deployments/",
        _deployment_body(provider, base_url="https://api.provider.test/v1/tenants/a"),
        format="json",
    )
    assert response.status_code == 201, response.content


def test_an_operator_can_neither_move_a_deployment_nor_move_it_to_a_credentialed_provider(
    operator: User,
) -> None:
    provider = _credentialed_provider()
    lab = make_provider(base_url="http://10.0.0.5:8000/v1")  # no credentials, private allowed
    deployment = Deployment.objects.create(
        slug="dep-y", model=make_model(), provider=lab, base_url="http://10.0.0.5:8000/v1"
    )
    client = api_client(operator)
    moved = client.patch("/api/deployments/dep-y/", {"base_url": "http://127.0.0.1:9/v1"}, format="json")
    assert moved.status_code == 400 and "base_url" in moved.json()
    # Keep the URL, change the provider: the credentialed provider's key would go to the lab URL.
    switched = client.patch("/api/deployments/dep-y/", {"provider": provider.slug}, format="json")
    assert switched.status_code == 400 and "base_url" in switched.json()
    deployment.refresh_from_db()
    assert (deployment.provider, deployment.base_url) == (lab, "http://10.0.0.5:8000/v1")


def test_only_an_admin_changes_where_a_providers_credentials_may_go(operator: User, admin_user: User) -> None:
    provider = _credentialed_provider()
    change = {"allowed_endpoints": ["https://eu.api.provider.test/v1"], "allow_private_network": True}
    assert (
        api_client(operator).patch(f"/api/providers/{provider.slug}/", change, format="json").status_code
        == 403
    )
    admin = api_client(admin_user)
    answer = admin.patch(f"/api/providers/{provider.slug}/", change, format="json")
    assert answer.status_code == 200, answer.content
    assert answer.json()["allowed_endpoints"] == ["https://eu.api.provider.test/v1"]
    provider.refresh_from_db()
    assert provider.allow_private_network is True
    created = api_client(operator).post(
        "/api/deployments/",
        _deployment_body(provider, base_url="https://eu.api.provider.test/v1/x"),
        format="json",
    )
    assert created.status_code == 201, created.content
    bad = admin.patch(
        f"/api/providers/{provider.slug}/",
        {"allowed_endpoints": ["ftp://files.test/", "https://u:p@h/"]},
        format="json",
    )
    assert bad.status_code == 400 and len(bad.json()["allowed_endpoints"]) == 2


def test_the_deployment_page_form_refuses_a_base_url_outside_the_provider(
    operator: User, admin_user: User
) -> None:
    provider = _credentialed_provider()
    model = make_model()
    page = Client()
    page.force_login(operator)
    form = {
        "slug": "dep-z",
        "model": model.pk,
        "provider": provider.pk,
        "provider_model_id": "m",
        "enabled": "on",
    }
    refused = page.post("/deployments/new/", {**form, "base_url": "http://169.254.169.254/latest"})
    assert refused.status_code == 200  # the form again, with its error
    assert "must lie under one of the provider&#x27;s endpoints" in refused.content.decode()
    assert not Deployment.objects.filter(slug="dep-z").exists()
    assert page.get(f"/providers/{provider.slug}/edit/").status_code == 403

    admin_page = Client()
    admin_page.force_login(admin_user)
    saved = admin_page.post(
        f"/providers/{provider.slug}/edit/",
        {
            "slug": provider.slug,
            "display_name": "P",
            "kind": provider.kind,
            "base_url": provider.base_url,
            "allowed_endpoints": "https://eu.api.provider.test/v1/\n\nhttps://us.api.provider.test/v1",
            "enabled": "on",
        },
    )
    assert saved.status_code == 302, saved.content.decode()[:2000]
    provider.refresh_from_db()
    assert provider.allowed_endpoints == [
        "https://eu.api.provider.test/v1",
        "https://us.api.provider.test/v1",
    ]
    assert provider.has_credentials  # an empty credentials field keeps them
    accepted = page.post("/deployments/new/", {**form, "base_url": "https://us.api.provider.test/v1/x"})
    assert accepted.status_code == 302
    assert Deployment.objects.get(slug="dep-z").base_url == "https://us.api.provider.test/v1/x"


def test_a_deployment_saved_outside_its_providers_endpoints_is_never_called(
    viewer: User, internal: CaptureServer
) -> None:
    """A row written before the rule (or left outside when an admin narrowed the provider) is
    refused when the router builds its call: the credentials never leave."""
    provider = _credentialed_provider(allow_private_network=True)
    rogue = Deployment.objects.create(
        slug="rogue", model=make_model(), provider=provider, base_url=f"{internal.url}/v1"
    )
    workflow = routed_workflow(viewer, [rogue])
    _, raw = api_token_create(user=viewer, name="t")
    response = _chat(raw, workflow.slug)
    assert response.status_code == 502
    assert internal.seen == []
    attempt = InferenceAttempt.objects.get(deployment=rogue)
    assert "outside the provider's endpoints" in attempt.error


# --- The outbound guard on provider calls -------------------------------------------------------------


def test_a_provider_not_allowed_private_networks_never_reaches_loopback(
    viewer: User, internal: CaptureServer
) -> None:
    # Even an admin-set endpoint on loopback is refused until the admin allows private networks.
    provider = _credentialed_provider(base_url=f"{internal.url}/v1")
    deployment = Deployment.objects.create(slug="lo", model=make_model(), provider=provider)
    workflow = routed_workflow(viewer, [deployment])
    _, raw = api_token_create(user=viewer, name="t")
    response = _chat(raw, workflow.slug)
    assert response.status_code == 502
    assert internal.seen == []
    assert "outbound policy refuses" in InferenceAttempt.objects.get(deployment=deployment).error

    provider.allow_private_network = True
    provider.save()
    internal.body = json.dumps(
        {"choices": [{"message": {"content": "hi"}, "finish_reason": "stop"}], "usage": {}}
    ).encode()
    assert _chat(raw, workflow.slug).status_code == 200
    assert internal.seen[0].headers["Authorization"] == f"Bearer {SECRET}"


@pytest.mark.parametrize("kind", ["openai-compatible", "bedrock"])
@pytest.mark.parametrize(
    "url", ["http://169.254.169.254/latest", "http://10.0.0.1:8000/v1", "http://[::1]:9/v1"]
)
def test_metadata_and_private_addresses_are_refused_before_connecting(url: str, kind: str) -> None:
    target = Target(
        deployment_id=1,
        slug="d",
        kind=kind,
        base_url=url,
        provider_model_id="m",
        credentials="AKIDTEST:secret" if kind == "bedrock" else SECRET,
    )
    with pytest.raises(ProviderError) as refused:
        adapter_for(target).complete(target, CHAT, timeout=5)
    assert "outbound policy refuses" in str(refused.value)
    assert refused.value.retryable is False and refused.value.status_code is None


def test_a_redirect_to_a_private_address_is_not_followed(viewer: User, settings: Any) -> None:
    # The provider sits on 127.0.0.1, which the admin allowed in settings; the internal service
    # on 127.0.0.2 is not allowed, and a redirect there must not be followed.
    settings.OUTBOUND_ALLOW_NETWORKS = ["127.0.0.1/32"]
    target = CaptureServer(host="127.0.0.2").start()
    redirector = CaptureServer(status=302, headers={"Location": f"{target.url}/v1/chat/completions"}).start()
    try:
        provider = _credentialed_provider(base_url=f"{redirector.url}/v1")
        deployment = Deployment.objects.create(slug="redir", model=make_model(), provider=provider)
        workflow = routed_workflow(viewer, [deployment])
        _, raw = api_token_create(user=viewer, name="t")
        response = _chat(raw, workflow.slug)
        assert response.status_code == 502
        assert len(redirector.seen) >= 1 and target.seen == []
        attempt = InferenceAttempt.objects.filter(deployment=deployment).first()
        assert attempt is not None and attempt.status_code == 302
    finally:
        redirector.stop()
        target.stop()


def test_an_upstream_error_body_is_logged_never_reflected(
    viewer: User, mock_provider: Callable[..., MockProviderServer], caplog: pytest.LogCaptureFixture
) -> None:
    """The failing provider's answer names internal data; the caller, the failover event (which
    every role may read) and the request's attempts keep to its status."""
    leaky = CaptureServer(
        status=500, body=b'{"error": {"message": "INTERNAL-SECRET-DATA at db.internal"}}'
    ).start()
    try:
        failing = priced_deployment(base_url=f"{leaky.url}/v1")
        healthy = priced_deployment(mock_provider(text="fine"))
        workflow = routed_workflow(viewer, [failing, healthy])
        _, raw = api_token_create(user=viewer, name="t")
        answered = _chat(raw, workflow.slug)
        assert answered.status_code == 200
        leaky_only = routed_workflow(viewer, [failing])
        failed = _chat(raw, leaky_only.slug)
        assert failed.status_code == 502
        assert "INTERNAL-SECRET-DATA" not in failed.content.decode()
        assert failed["x-switchyard-request-id"]
        assert failed.json()["error"]["type"] == "api_error"
        events = api_client(viewer).get("/api/failover-events/").content.decode()
        assert FailoverEvent.objects.filter(from_deployment=failing).exists()
        assert "INTERNAL-SECRET-DATA" not in events
        for attempt in InferenceAttempt.objects.filter(deployment=failing):
            assert "INTERNAL-SECRET-DATA" not in attempt.error
            assert attempt.error.startswith(f"HTTP 500 from {failing.slug}")
        assert "INTERNAL-SECRET-DATA" in caplog.text  # the server's log has it
    finally:
        leaky.stop()
