"""API tokens: created (the secret shown once, stored hashed), authenticated, limited, revoked."""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from collections.abc import Sequence
from datetime import datetime, timedelta

from django.conf import settings
from django.contrib.auth.models import AnonymousUser, User
from django.db import transaction
from django.utils import timezone

from registry.auth.roles import ALL_ROLES, Role, global_roles
from registry.auth.teams import user_team_admin_of, user_team_scope, user_teams_with_role
from registry.auth.version import auth_version_bump
from registry.models import (
    ApiToken,
    SsoIdentity,
    Team,
    Workflow,
)
from registry.services.errors import RegistryError
from registry.services.limits import rate_limit_check
from registry.validation import text_problem

TOKEN_PREFIX = "sy"  # noqa: S105 (a label, not a secret)
TOKEN_NAME_MAX_LENGTH = 100  # ApiToken.name
_TOKEN_ID = re.compile(r"[0-9A-Za-z]{1,16}")  # ApiToken.prefix: token_hex(6) since the first token


def _hash_secret(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def api_token_team_check(*, user: User, team: Team | None, workflows: Sequence[Workflow] = ()) -> None:
    """May `user` make a key for `team` (None: a platform key) scoped to `workflows`?

    A team key needs a member of that team (any role: the key acts with its user's roles, and
    every role may hold keys, as before teams) or a platform-wide user; a team-scoped user's key
    must name one of its teams. A team key's workflows are its team's."""
    allowed = user_teams_with_role(user, ALL_ROLES)
    if team is None:
        if user_team_scope(user):  # a team-scoped user: its keys spend for one of its teams
            raise RegistryError("name one of your teams: the key spends for it", field="team")
    elif allowed is not None and team.pk not in allowed:
        # Another team's key, or one of the user's teams where it only reads: as if unknown.
        raise RegistryError(f"no team {team.slug!r} where you may make keys", field="team")
    foreign = sorted(w.slug for w in workflows if team is not None and w.team_id != team.pk)
    if foreign:
        raise RegistryError(
            f"a key of team {team.slug if team else ''!r} reaches only its team's workflows, not "
            + ", ".join(foreign),
            field="workflows",
        )


def api_token_create(
    *,
    user: User,
    name: str,
    workflows: Sequence[Workflow] = (),
    rpm_limit: int | None = None,
    tpm_limit: int | None = None,
    rate_limit_fail_closed: bool = False,
    team: Team | None = None,
    expires_at: datetime | None = None,
) -> tuple[ApiToken, str]:
    """Create a token and return it with its raw value, which is never stored.

    `user` is who made it (the roles it acts with); `team` is who it spends for (the ledger's
    api key and team), checked by api_token_team_check. With `workflows`, the inference gateway
    (/v1/) lets the token call only those; with `rpm_limit` / `tpm_limit`, only so many
    requests / tokens per minute (inference.ratelimit.limits), its team's limits applying as well;
    after `expires_at` (aware, in the future) it answers 401.
    """
    rate_limit_check(rpm_limit=rpm_limit, tpm_limit=tpm_limit)
    api_token_team_check(user=user, team=team, workflows=workflows)
    if expires_at is not None:
        if expires_at.tzinfo is None:
            raise RegistryError("an expiry needs a time zone (UTC)", field="expires_at")
        if expires_at <= timezone.now():
            raise RegistryError("the expiry must be in the future", field="expires_at")
    if not name.strip():
        raise RegistryError("a token needs a name", field="name")
    if len(name.strip()) > TOKEN_NAME_MAX_LENGTH:
        raise RegistryError(f"a token's name has at most {TOKEN_NAME_MAX_LENGTH} characters", field="name")
    if (problem := text_problem(name)) is not None:
        raise RegistryError(f"the name {problem}", field="name")
    prefix = secrets.token_hex(6)
    secret = secrets.token_urlsafe(32)
    with transaction.atomic():
        token = ApiToken.objects.create(
            user=user,
            name=name.strip(),
            prefix=prefix,
            key_hash=_hash_secret(secret),
            rpm_limit=rpm_limit,
            tpm_limit=tpm_limit,
            rate_limit_fail_closed=rate_limit_fail_closed,
            team=team,
            expires_at=expires_at,
        )
        if workflows:
            token.workflows.set(workflows)
    return token, f"{TOKEN_PREFIX}_{prefix}_{secret}"


def api_token_sso_deadline(user: User) -> datetime | None:
    """Until when the keys of `user` work without a new sign-in: for a user who signs in through
    SSO, SWITCHYARD_SSO_KEY_SECONDS after its last sign-in (or silent re-authentication); None
    for any other user. A key cannot ask the provider about its user, so this is the bound
    within which a user removed at the provider loses what its keys reach."""
    try:
        identity = user.sso_identity
    except SsoIdentity.DoesNotExist:
        return None
    return identity.synced_at + timedelta(seconds=settings.SWITCHYARD_SSO_KEY_SECONDS)


def api_token_authenticate(*, raw: str) -> ApiToken | None:
    parts = raw.split("_", 2)
    if len(parts) != 3 or parts[0] != TOKEN_PREFIX:
        return None
    _, prefix, secret = parts
    if not _TOKEN_ID.fullmatch(prefix):  # never look up text no token can have (NUL: a DataError)
        return None
    # An expired token is returned (callers answer 401 saying so: ApiToken.expired).
    token = (
        ApiToken.objects.select_related("user", "team", "user__sso_identity")
        .filter(prefix=prefix, revoked_at__isnull=True)
        .first()
    )
    if token is None or not hmac.compare_digest(token.key_hash, _hash_secret(secret)):
        return None
    now = timezone.now()
    deadline = api_token_sso_deadline(token.user)
    if deadline is not None and now > deadline:  # an SSO user who has not signed in since
        return None
    # Touch at most once a minute: a token used in a hot loop must not turn
    # every request into a write.
    if token.last_used_at is None or now - token.last_used_at > timedelta(minutes=1):
        ApiToken.objects.filter(pk=token.pk).update(last_used_at=now)
    return token


def api_token_limits_may_raise(*, user: User | AnonymousUser, token: ApiToken) -> bool:
    """Whether `user` may raise or clear `token`'s limits: a platform admin, or an admin of the
    key's team. Anyone else (the key's owner among them) may only lower them."""
    if Role.ADMIN in global_roles(user):
        return True
    return token.team_id is not None and token.team_id in user_team_admin_of(user)


def api_token_limits_set(
    *,
    token: ApiToken,
    rpm_limit: int | None,
    tpm_limit: int | None,
    rate_limit_fail_closed: bool,
    may_raise: bool,
) -> ApiToken:
    """Change a token's /v1 rate limits (None: no limit). Saving moves the authorisation version
    (registry.auth.signals), so the gateway applies them from the next request.

    Without `may_raise` (api_token_limits_may_raise) a limit may only go down: a new value must
    be a number no higher than the current one (clearing a limit raises it to none)."""
    rate_limit_check(rpm_limit=rpm_limit, tpm_limit=tpm_limit)
    if not may_raise:
        for field, current, wanted in (
            ("rpm_limit", token.rpm_limit, rpm_limit),
            ("tpm_limit", token.tpm_limit, tpm_limit),
        ):
            if wanted == current:
                continue
            if wanted is None or (current is not None and wanted > current):
                raise RegistryError(
                    f"you may lower this key's limit only (now {current if current is not None else 'none'}); "
                    "a platform admin or the key's team admin may raise or clear it",
                    field=field,
                )
    token.rpm_limit, token.tpm_limit = rpm_limit, tpm_limit
    token.rate_limit_fail_closed = rate_limit_fail_closed
    token.save(update_fields=["rpm_limit", "tpm_limit", "rate_limit_fail_closed"])
    return token


def api_token_revoke(*, token: ApiToken) -> ApiToken:
    revoked = ApiToken.objects.filter(pk=token.pk, revoked_at__isnull=True).update(revoked_at=timezone.now())
    if revoked:
        # An UPDATE sends no signal: move the authorisation version here (the gateway's caches).
        auth_version_bump()
    token.refresh_from_db()
    return token
