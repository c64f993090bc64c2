"""What an API token may reach: its user's roles and the workflows it is limited to.

One answer for every surface: the REST API (registry.api.authentication asks
`token_for_raw_token`; registry.auth.scoping filters by `token_workflow_scope`), and the /v1
gateway, which asks `grant_for_raw_token` on every request. Grants are cached per process, but
only while the authorisation version (registry.auth.version) has not moved, so revoking a
token, removing a role or deactivating a user takes effect on the next request.
"""

from __future__ import annotations

import copy
import hashlib
import threading
import time
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.utils import timezone

from registry.auth.principal import Principal, principal_of_key, request_key, token_workflow_scope
from registry.auth.version import auth_version, grant_cache_register
from registry.models import ApiToken, Workflow
from registry.services import api_token_authenticate, api_token_sso_deadline

TOKEN_MAX_LENGTH = 256
# A backstop only: a grant is re-read from the database at least this often even when the
# version says nothing changed (a change made while Redis was unreachable could not move it).
GRANT_MAX_AGE_SECONDS = 30.0


@dataclass(frozen=True)
class TokenGrant:
    """What one token may do, as read from the database at one authorisation version: its
    principal (registry.auth.principal: the user's global roles and its role in each team,
    narrowed to the key's team and workflows) and the key's limits."""

    token_id: int
    user_id: int
    principal: Principal
    # The key's own /v1 rate limits (inference.ratelimit.limits); None: none.
    rpm_limit: int | None = None
    tpm_limit: int | None = None
    rate_limit_fail_closed: bool = False
    # The key's team: it reaches only that team's workflows, and the team's limits apply to it
    # too. None: a platform key, which acts with its user's global roles only.
    team_id: int | None = None
    team_rpm_limit: int | None = None
    team_tpm_limit: int | None = None
    expires_at: datetime | None = None
    # For a user who signs in through SSO: when its keys stop working without a new sign-in
    # (registry.services.tokens.api_token_sso_deadline); a cached grant is not used past it.
    sso_deadline: datetime | None = None

    def expired(self, at: datetime) -> bool:
        return self.expires_at is not None and self.expires_at <= at

    @property
    def workflow_ids(self) -> frozenset[int] | None:
        """The workflows the key is limited to; None: not limited."""
        return self.principal.workflow_ids

    @property
    def visible_teams(self) -> frozenset[int] | None:
        """The teams whose workflows the key may call; None: every team."""
        return self.principal.visible_teams

    def sees_costs(self, team_id: int | None) -> bool:
        """May the caller see the money of a call to a workflow of team `team_id`?"""
        return self.principal.sees_costs(team_id)

    def allows_workflow(self, workflow_id: int, team_id: int | None) -> bool:
        return self.principal.allows_workflow(workflow_id, team_id)

    def reaches_team(self, team_id: int | None) -> bool:
        """Is a workflow of team `team_id` in sight of the key? Another team's workflow answers
        as if it did not exist; a key whose user holds no role anywhere is refused (403) by
        `allows_workflow` instead."""
        teams = self.principal.visible_teams
        return teams is None or not teams or team_id in teams


def token_grant(token: ApiToken) -> TokenGrant:
    team = token.team
    return TokenGrant(
        token_id=token.pk,
        user_id=token.user_id,
        principal=principal_of_key(token, token_workflow_scope(token)),
        rpm_limit=token.rpm_limit,
        tpm_limit=token.tpm_limit,
        rate_limit_fail_closed=token.rate_limit_fail_closed,
        team_id=token.team_id,
        team_rpm_limit=team.rpm_limit if team is not None else None,
        team_tpm_limit=team.tpm_limit if team is not None else None,
        expires_at=token.expires_at,
        sso_deadline=api_token_sso_deadline(token.user),
    )


def token_allows_workflow(*, token: ApiToken, workflow: Workflow) -> bool:
    """May this token call `workflow`? Its (active) user must hold a role, a token limited
    to workflows only the workflows it lists, and a team key only its team's."""
    return token_grant(token).allows_workflow(workflow.pk, workflow.team_id)


def request_token(request: Any) -> ApiToken | None:
    """The API token a request authenticated with (DRF sets `request.auth`); None for a session."""
    return request_key(request)


def request_workflow_scope(request: Any) -> frozenset[int] | None:
    """The workflows this request is limited to; None when it is not limited."""
    token = request_token(request)
    return token_workflow_scope(token) if token is not None else None


# --- The gateway's per-process cache ------------------------------------------------------------


@dataclass(frozen=True)
class _Cached:
    grant: TokenGrant
    version: bytes
    at: float
    token: ApiToken  # the row the grant was read from, with its user: /api/ hands out copies

    def usable(self) -> bool:
        """Read recently enough (GRANT_MAX_AGE_SECONDS), and not past its SSO key deadline."""
        if time.monotonic() - self.at >= GRANT_MAX_AGE_SECONDS:
            return False
        deadline = self.grant.sso_deadline
        return deadline is None or timezone.now() <= deadline


_grants: dict[bytes, _Cached] = {}
_grants_lock = threading.Lock()


def grant_cache_clear() -> None:
    with _grants_lock:
        _grants.clear()


grant_cache_register(grant_cache_clear)


def _well_formed(raw: str) -> bool:
    # A token is printable ASCII: anything else (a NUL would be a database error) is no token.
    return 0 < len(raw) <= TOKEN_MAX_LENGTH and raw.isascii() and raw.isprintable()


@dataclass(frozen=True)
class UnverifiedGrant:
    """A cached grant used before its authorisation version was read again: the caller must
    compare `version` with the shared one (inference.ratelimit.limits reads it in the same Redis call as
    the rate limits) and start over with grant_for_raw_token when they differ."""

    grant: TokenGrant
    version: bytes


def cached_grant_unverified(raw: str) -> UnverifiedGrant | None:
    """The cached grant of `raw` and the version it was read at, without asking Redis (None:
    nothing cached, or cached too long ago). Saves the version GET when the caller reads the
    version with another Redis call it makes anyway."""
    if not _well_formed(raw):
        return None
    hit = _grants.get(hashlib.sha256(raw.encode()).digest())
    if hit is None or not hit.usable():
        return None  # read again (an SSO key past its deadline: refused) by grant_for_raw_token
    return UnverifiedGrant(hit.grant, hit.version)


def grant_for_raw_token(raw: str) -> TokenGrant | None:
    """The grant of a raw bearer token; None when it is no token, revoked, or its user inactive.

    The version is read before the database, so a grant is never cached under a version newer
    than what it was read from. Without a trustworthy version (no Redis, or Redis unreachable)
    every call reads the database (two queries)."""
    found = _lookup(raw)
    return found.grant if found is not None else None


def token_for_raw_token(raw: str) -> tuple[ApiToken, TokenGrant] | None:
    """The key row (with its user) and the grant of a raw bearer token, for /api/'s bearer
    authentication (DRF's request.auth and request.user): from the gateway's cache, on the same
    terms (grant_for_raw_token), so /api/ reads no key, user or role row while nothing changed.
    The rows are the caller's own copies: a request that changed one would change no other's."""
    found = _lookup(raw)
    if found is None:
        return None
    token = copy.copy(found.token)
    token.user = copy.copy(found.token.user)
    return token, found.grant


def _lookup(raw: str) -> _Cached | None:
    if not _well_formed(raw):
        return None
    version = auth_version().read()
    key = hashlib.sha256(raw.encode()).digest()  # the cache holds no secrets
    if version is not None:
        hit = _grants.get(key)
        if hit is not None and hit.version == version and hit.usable():
            return hit
    token = api_token_authenticate(raw=raw)
    if token is None or not token.user.is_active:
        return None
    found = _Cached(token_grant(token), version or b"", time.monotonic(), token)
    if version is not None:
        with _grants_lock:
            if len(_grants) > 10_000:
                _grants.clear()
            _grants[key] = found
    return found
