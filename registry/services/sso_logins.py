"""Single sign-on (registry.auth.sso; docs/registry-and-teams.md "SSO"): users by (issuer, sub), memberships from the groups claim."""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass

from django.contrib.auth.models import User
from django.contrib.auth.validators import UnicodeUsernameValidator
from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone

from registry.auth.roles import Role
from registry.models import (
    SsoIdentity,
    Team,
    TeamMembership,
)
from registry.services.errors import RegistryError
from registry.validation import text_problem

logger = logging.getLogger(__name__)


# A group entry of the identity provider's groups claim that names a team role:
# "switchyard:<team-slug>:<role>". Other groups (the IdP's own) are not Switchyard's business.
SSO_GROUP_PREFIX = "switchyard:"
# When one claim names two roles in one team (a membership holds one), the first of these wins.
SSO_ROLE_PRECEDENCE = (Role.ADMIN, Role.OPERATOR, Role.AUDITOR, Role.VIEWER)
# Bounds on what a claim may hold; a longer list or entry is a misconfigured provider.
SSO_MAX_GROUPS = 1000
SSO_MAX_GROUP_LENGTH = 200
SSO_MAX_SUBJECT_LENGTH = 255


@dataclass(frozen=True)
class MembershipSync:
    """What one login changed: (team slug, role) added, changed to, and team slugs removed;
    `ignored` lists the claim's switchyard entries that named no team or role."""

    added: tuple[tuple[str, str], ...] = ()
    changed: tuple[tuple[str, str], ...] = ()
    removed: tuple[str, ...] = ()
    ignored: tuple[str, ...] = ()


def _sso_team_roles(groups: object) -> tuple[dict[str, Role], list[str]]:
    """The claim's "switchyard:<team>:<role>" entries as team slug -> role (by precedence),
    and the entries that are malformed or name an unknown role."""
    if groups is None:
        return {}, []
    if isinstance(groups, str):  # some providers send a single group as a string
        groups = [groups]
    if not isinstance(groups, list | tuple):
        logger.warning("SSO: the groups claim is not a list (%s); no team memberships", type(groups).__name__)
        return {}, []
    if len(groups) > SSO_MAX_GROUPS:
        logger.warning(
            "SSO: the groups claim lists %d groups, more than %d; no team memberships",
            len(groups),
            SSO_MAX_GROUPS,
        )
        return {}, []
    wanted: dict[str, Role] = {}
    ignored: list[str] = []
    for entry in groups:
        if not isinstance(entry, str) or not entry.startswith(SSO_GROUP_PREFIX):
            continue
        parts = entry.split(":")
        role = Role(parts[2]) if len(parts) == 3 and parts[2] in Role.values else None
        if len(entry) > SSO_MAX_GROUP_LENGTH or role is None or not re.fullmatch(r"[-a-zA-Z0-9_]+", parts[1]):
            ignored.append(entry[:SSO_MAX_GROUP_LENGTH])
            continue
        held = wanted.get(parts[1])
        if held is None or SSO_ROLE_PRECEDENCE.index(role) < SSO_ROLE_PRECEDENCE.index(held):
            wanted[parts[1]] = role
    return wanted, ignored


def team_memberships_sync_from_claims(*, user: User, groups: object) -> MembershipSync:
    """Make the user's "sso" team memberships what the identity provider's groups claim says.

    Each "switchyard:<team-slug>:<role>" entry (role: viewer, operator, auditor, admin) gives a
    membership with source "sso" in an existing team; entries naming a team that does not
    exist or an unknown role are logged and ignored, never created. "sso" memberships that the
    claim no longer lists are removed; a missing claim removes them all (least privilege when
    a provider stops sending it). Manual memberships are left as an admin set them, also when
    the claim names their team. Rows are saved and deleted one by one, so the audit trail and
    the authorisation version (registry.auth.signals) see every change.
    """
    wanted, ignored = _sso_team_roles(groups)
    teams = {team.slug: team for team in Team.objects.filter(slug__in=list(wanted))}
    for slug in sorted(set(wanted) - set(teams)):
        ignored.append(f"{SSO_GROUP_PREFIX}{slug}:{wanted[slug].value}")
    for entry in ignored:
        logger.warning("SSO: ignored group %r of user %s (no such team or role)", entry, user.get_username())
    added: list[tuple[str, str]] = []
    changed: list[tuple[str, str]] = []
    removed: list[str] = []
    with transaction.atomic():
        # The user's row is locked first: two logins of one user at once run one after the
        # other, so they cannot both create the same membership (locking the memberships alone
        # would not stop that when there are none yet).
        list(User.objects.select_for_update().filter(pk=user.pk).values_list("pk", flat=True))
        held = {m.team.slug: m for m in TeamMembership.objects.select_related("team").filter(user=user)}
        for slug, membership in sorted(held.items()):
            if membership.source != "sso":
                continue
            if slug not in teams:
                membership.delete()
                removed.append(slug)
            elif membership.role != wanted[slug]:
                membership.role = wanted[slug]
                membership.save(update_fields=["role"])
                changed.append((slug, wanted[slug].value))
        for slug, team in sorted(teams.items()):
            if slug not in held:
                TeamMembership.objects.create(team=team, user=user, role=wanted[slug], source="sso")
                added.append((slug, wanted[slug].value))
    return MembershipSync(
        added=tuple(added), changed=tuple(changed), removed=tuple(removed), ignored=tuple(ignored)
    )


def _claim_text(claims: Mapping[str, object], name: str, *, max_length: int) -> str:
    value = claims.get(name)
    if value is None:
        return ""
    if not isinstance(value, str) or len(value) > max_length or text_problem(value) is not None:
        raise RegistryError(f"the {name} claim is not text of at most {max_length} characters", field=name)
    return value.strip()


def sso_username_from_claims(*, claims: Mapping[str, object]) -> str:
    """`preferred_username`, else `sub`, checked as Django checks a username (letters, digits
    and @.+-_, at most 150 characters)."""
    username = _claim_text(claims, "preferred_username", max_length=150) or _claim_text(
        claims, "sub", max_length=SSO_MAX_SUBJECT_LENGTH
    )
    try:
        UnicodeUsernameValidator()(username)
    except ValidationError:
        raise RegistryError(
            f"{username[:40]!r} is not a valid username", field="preferred_username"
        ) from None
    if not username or len(username) > 150:
        raise RegistryError("the identity has no usable username", field="preferred_username")
    return username


def sso_user_login(
    *, issuer: str, claims: Mapping[str, object], groups_claim: str
) -> tuple[User, MembershipSync]:
    """The user an OpenID Connect login names (found by issuer and subject, created at its first
    login with an unusable password), its email and name brought up to date, and its team
    memberships synced from `claims[groups_claim]`.

    Each login records when it synced (SsoIdentity.synced_at): an SSO user's API keys work
    for SWITCHYARD_SSO_KEY_SECONDS after it.

    A first login whose username is already taken by another account is refused: a provider's
    user named like a local admin must not become that admin."""
    subject = _claim_text(claims, "sub", max_length=SSO_MAX_SUBJECT_LENGTH)
    if not subject:
        raise RegistryError("the identity has no subject (sub claim)", field="sub")
    email = _claim_text(claims, "email", max_length=254)
    first_name = _claim_text(claims, "given_name", max_length=150)
    last_name = _claim_text(claims, "family_name", max_length=150)
    now = timezone.now()
    with transaction.atomic():
        identity = SsoIdentity.objects.select_related("user").filter(issuer=issuer, subject=subject).first()
        if identity is None:
            username = sso_username_from_claims(claims=claims)
            if User.objects.filter(username__iexact=username).exists():
                raise RegistryError(
                    f"the username {username!r} belongs to an account not linked to this identity",
                    field="preferred_username",
                )
            user = User(username=username, email=email, first_name=first_name, last_name=last_name)
            user.set_unusable_password()
            user.save()
            SsoIdentity.objects.create(user=user, issuer=issuer, subject=subject, synced_at=now)
        else:
            # Keeps the user's API keys working (api_token_authenticate's SSO bound).
            SsoIdentity.objects.filter(pk=identity.pk).update(synced_at=now)
            user = identity.user
            current = {"email": email, "first_name": first_name, "last_name": last_name}
            stale = [name for name, value in current.items() if getattr(user, name) != value]
            if stale:
                for name in stale:
                    setattr(user, name, current[name])
                user.save(update_fields=stale)
        sync = team_memberships_sync_from_claims(user=user, groups=claims.get(groups_claim))
    return user, sync
