"""On /v1, revoking a token, removing a role, deactivating a user or narrowing a token's workflows
takes effect on the very next request, in this process and (through the authorisation version
in Redis) in every other; while that Redis is unreachable, tokens are checked in the database."""

from __future__ import annotations

import json
import socket
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.contrib.auth.models import Group, User, update_last_login
from django.test import Client

from bench.mockprovider import MockProviderServer
from registry.auth import version as auth_version_module
from registry.auth.roles import Role
from registry.auth.version import AUTH_VERSION_KEY, auth_version
from registry.models import ApiToken, Workflow
from registry.services import api_token_create, api_token_revoke
from registry.shared_redis.client import redis_client
from tests.inference.helpers import priced_deployment, routed_workflow

pytestmark = pytest.mark.django_db
Start = Callable[..., MockProviderServer]
needs_redis = pytest.mark.redis  # the shared version lives in Redis (REDIS_URL)


@pytest.fixture
def workflow(viewer: User, mock_provider: Start) -> Workflow:
    return routed_workflow(viewer, [priced_deployment(mock_provider(text="ok"))])


def _ask(client: Client, workflow: Workflow) -> int:
    body = json.dumps({"model": workflow.slug, "messages": [{"role": "user", "content": "ping"}]})
    return client.post("/v1/chat/completions", body, content_type="application/json").status_code


def _token(user: User, **kwargs: Any) -> tuple[ApiToken, Client]:
    token, raw = api_token_create(user=user, name="revocation", **kwargs)
    return token, Client(HTTP_AUTHORIZATION=f"Bearer {raw}")


def test_a_revoked_token_is_refused_on_the_next_request(viewer: User, workflow: Workflow) -> None:
    token, client = _token(viewer)
    assert _ask(client, workflow) == 200  # its grant is cached now
    api_token_revoke(token=token)
    assert _ask(client, workflow) == 401


def test_a_removed_role_is_refused_on_the_next_request(viewer: User, workflow: Workflow) -> None:
    _, client = _token(viewer)
    assert _ask(client, workflow) == 200
    viewer.groups.remove(Group.objects.get(name=Role.VIEWER.value))
    assert _ask(client, workflow) == 403


def test_a_role_removed_from_the_groups_side_is_refused_on_the_next_request(
    viewer: User, workflow: Workflow
) -> None:
    _, client = _token(viewer)
    assert _ask(client, workflow) == 200
    Group.objects.get(name=Role.VIEWER.value).user_set.remove(viewer)
    assert _ask(client, workflow) == 403


def test_a_deactivated_user_is_refused_on_the_next_request(viewer: User, workflow: Workflow) -> None:
    _, client = _token(viewer)
    assert _ask(client, workflow) == 200
    viewer.is_active = False
    viewer.save()
    assert _ask(client, workflow) == 401


def test_a_token_narrowed_to_other_workflows_is_refused_on_the_next_request(
    viewer: User, workflow: Workflow, mock_provider: Start
) -> None:
    other = routed_workflow(viewer, [priced_deployment(mock_provider())])
    token, client = _token(viewer)
    assert _ask(client, workflow) == 200
    token.workflows.set([other])
    assert _ask(client, workflow) == 403
    assert _ask(client, other) == 200


def test_a_login_does_not_drop_the_cached_grants(viewer: User, workflow: Workflow) -> None:
    _, client = _token(viewer)
    assert _ask(client, workflow) == 200
    before = auth_version().read()
    update_last_login(None, viewer)  # what every login does: save(update_fields=["last_login"])
    assert auth_version().read() == before


@needs_redis
def test_another_process_bump_reaches_this_one(viewer: User, workflow: Workflow, settings: Any) -> None:
    """What another web process sees: the database changed without any signal here, then the
    version moved in Redis; this process re-reads the token on its next request."""
    token, client = _token(viewer)
    assert _ask(client, workflow) == 200
    # A change this process was not told about (a queryset UPDATE sends no signal) ...
    ApiToken.objects.filter(pk=token.pk).update(revoked_at="2026-01-01T00:00:00Z")
    assert _ask(client, workflow) == 200  # ... is not seen while the version stands,
    redis_client(settings.REDIS_URL, timeout=1.0).incr(AUTH_VERSION_KEY)  # the bump another process made,
    assert _ask(client, workflow) == 401  # and is seen on the next request after it moved.


@needs_redis
def test_a_request_started_over_with_a_fresh_grant_is_answered(
    viewer: User, workflow: Workflow, settings: Any
) -> None:
    """The version moved (another process's bump, nothing changed for this key): the request
    checked with the stale cached grant is started over with the grant read afresh, and answered
    from the body it was sent with (read once)."""
    _, client = _token(viewer)
    assert _ask(client, workflow) == 200  # its grant is cached now
    redis_client(settings.REDIS_URL, timeout=1.0).incr(AUTH_VERSION_KEY)
    assert _ask(client, workflow) == 200


@needs_redis
def test_a_revocation_after_commit_moves_the_shared_version(
    viewer: User, workflow: Workflow, django_capture_on_commit_callbacks: Any
) -> None:
    token, _ = _token(viewer)
    before = auth_version().read()
    with django_capture_on_commit_callbacks(execute=True) as callbacks:
        api_token_revoke(token=token)
    assert callbacks  # moved again once the revocation is committed
    after = auth_version().read()
    assert before is not None and after is not None
    assert int(after) >= int(before or b"0") + 2


@pytest.fixture
def unreachable_version_redis(settings: Any) -> Iterator[None]:
    """The authorisation version's Redis on a loopback port nothing listens on."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    counter = auth_version().counter
    saved = counter._redis
    counter._redis = redis_client(f"redis://127.0.0.1:{port}/0", timeout=1.0)
    try:
        yield
    finally:
        counter._redis = saved


@needs_redis
def test_while_redis_is_unreachable_tokens_are_checked_in_the_database(
    viewer: User, workflow: Workflow, request: pytest.FixtureRequest
) -> None:
    token, client = _token(viewer)
    assert _ask(client, workflow) == 200  # cached under the version Redis had
    request.getfixturevalue("unreachable_version_redis")
    assert auth_version().read() is None
    assert _ask(client, workflow) == 200  # still served: from the database
    # A revocation whose bump cannot reach Redis, and no cache drop in this process either
    # (as in another process): the next request reads the database, not a stale grant.
    ApiToken.objects.filter(pk=token.pk).update(revoked_at="2026-01-01T00:00:00Z")
    assert _ask(client, workflow) == 401


def test_without_redis_nothing_is_cached(
    viewer: User, workflow: Workflow, settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings.REDIS_URL = ""
    monkeypatch.setattr(auth_version_module, "_version", None)
    token, client = _token(viewer)
    assert _ask(client, workflow) == 200
    ApiToken.objects.filter(pk=token.pk).update(revoked_at="2026-01-01T00:00:00Z")  # no signal
    assert _ask(client, workflow) == 401
