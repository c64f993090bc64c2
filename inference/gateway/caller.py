"""Who calls /v1 and which workflow they may call: the bearer token's grant (cached while the
authorisation version stands), and the workflow's row (cached briefly; who may call it is checked
every time)."""

from __future__ import annotations

import threading
import time
from datetime import UTC
from typing import TypeVar

from django.db.models import Model, Q, QuerySet
from django.http import HttpRequest
from django.utils import timezone

from inference.gateway.responses import GatewayError
from inference.ratelimit.limits import version_check, version_folded
from registry.auth.access import TokenGrant, cached_grant_unverified, grant_cache_clear, grant_for_raw_token
from registry.auth.roles import ALL_ROLES
from registry.models import Workflow

_Row = TypeVar("_Row", bound=Model)

# A workflow's row (its slug and id) is cached this long; who may call it is checked every time.
WORKFLOW_CACHE_SECONDS = 5.0
# --- Authentication and scope ------------------------------------------------------------------------


def _raw_token(request: HttpRequest) -> str:
    """The API token: `Authorization: Bearer <token>` (OpenAI's clients) or `x-api-key: <token>`
    (Anthropic's), on any /v1 path; Authorization wins when both are sent."""
    header = request.META.get("HTTP_AUTHORIZATION")
    if header is None and "HTTP_X_API_KEY" in request.META:
        scheme, raw = "bearer", request.META["HTTP_X_API_KEY"].strip()
    else:
        scheme, _, raw = (header or "").partition(" ")
        raw = raw.strip()
    if scheme.lower() != "bearer" or not raw:
        raise GatewayError(
            401,
            "Missing API key: send Authorization: Bearer <Switchyard API token> (or x-api-key: <token>)",
            type_="invalid_request_error",
            code="invalid_api_key",
        )
    return raw


def caller_grant(request: HttpRequest) -> TokenGrant:
    """What the bearer token may do (registry.auth.access: cached per process while the
    authorisation version stands, so a revocation counts from the next request)."""
    grant = grant_for_raw_token(_raw_token(request))
    if grant is None:
        raise GatewayError(
            401, "Invalid or revoked API key", type_="invalid_request_error", code="invalid_api_key"
        )
    _not_expired(grant)
    return grant


def caller_grant_deferred(request: HttpRequest) -> tuple[TokenGrant, bytes | None]:
    """The caller's grant, and the authorisation version still to check it against (None: it
    was checked). A cached grant is taken without the version GET: the rate-limit script call
    reads the version (RateCheck.check(verify=...)), so a request costs one Redis round trip
    for both; a moved version starts the request over (StaleGrant)."""
    raw = _raw_token(request)
    cached = cached_grant_unverified(raw) if version_folded() else None
    if cached is None:
        return caller_grant(request), None
    if cached.grant.expires_at is not None and cached.grant.expired(timezone.now()):
        version_check(cached.version)  # an expiry changed since: start over
    _not_expired(cached.grant)
    return cached.grant, cached.version


def _not_expired(grant: TokenGrant) -> None:
    if grant.expires_at is not None and grant.expired(timezone.now()):
        raise GatewayError(
            401,
            f"This API key expired at {grant.expires_at.astimezone(UTC):%Y-%m-%d %H:%M:%S} UTC",
            type_="invalid_request_error",
            code="expired_api_key",
        )


_workflows: dict[str, tuple[Workflow, float]] = {}
_cache_lock = threading.Lock()


def gateway_caches_clear() -> None:
    grant_cache_clear()
    with _cache_lock:
        _workflows.clear()


def _not_found(slug: str) -> GatewayError:
    return GatewayError(
        404,
        f"The model (workflow) {slug!r} does not exist",
        type_="invalid_request_error",
        code="model_not_found",
    )


def caller_workflow(slug: str, caller: TokenGrant) -> Workflow:
    """The workflow named by `model` (its row is cached briefly: who may call it is not). Another
    team's workflow answers as an unknown one: a team key learns nothing of other teams."""
    now = time.monotonic()
    hit = _workflows.get(slug)
    if hit is not None and hit[1] > now:
        workflow = hit[0]
    else:
        found = Workflow.objects.select_related("team").filter(slug=slug).first()
        if found is None:
            raise _not_found(slug)
        workflow = found
        with _cache_lock:
            _workflows[slug] = (workflow, now + WORKFLOW_CACHE_SECONDS)
    if not caller.reaches_team(workflow.team_id):
        raise _not_found(slug)
    return workflow


def caller_authorize(caller: TokenGrant, workflow: Workflow) -> None:
    if not caller.allows_workflow(workflow.pk, workflow.team_id):
        raise GatewayError(
            403,
            f"This API key may not call workflow {workflow.slug!r}",
            type_="permission_error",
            code="workflow_not_allowed",
        )


def caller_rows(
    rows: QuerySet[_Row], caller: TokenGrant, *, team: str, workflow: str, uploader: str | None = None
) -> QuerySet[_Row]:
    """The rows a caller may see and act on among `rows`, objects it owns through /v1 (files,
    batches): those of a team it holds a role in (`team`: the rows' team field; a team key: its
    own team only) or, for a platform-wide role, of no team; and for a key limited to workflows,
    none of another workflow (`workflow`: the rows' workflow field) and, of the rows of no
    workflow, only those it made itself (`uploader`: the rows' API key field; None: none of them). The same rule as a workflow's (registry.auth.principal.roles_in); the one query
    every /v1 list, read, download, cancel and delete of such rows goes through."""
    principal = caller.principal
    teams = principal.visible_teams
    reach = Q(**{f"{team}__isnull": False}) if teams is None else Q(**{f"{team}__in": teams})
    if principal.may(ALL_ROLES, None):
        reach |= Q(**{f"{team}__isnull": True})
    rows = rows.filter(reach)
    if principal.workflow_ids is not None:
        mine = Q(**{f"{workflow}__isnull": True, uploader: caller.token_id}) if uploader else Q(pk__in=[])
        rows = rows.filter(mine | Q(**{f"{workflow}__in": principal.workflow_ids}))
    return rows
