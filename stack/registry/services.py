"""Writes to the registry. Views, API viewsets, tasks and commands call these."""

from __future__ import annotations

import hashlib
import hmac
import logging
import re
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal

from django.conf import settings
from django.contrib.auth.models import User
from django.contrib.auth.validators import UnicodeUsernameValidator
from django.core.exceptions import ValidationError
from django.db import transaction
from django.db.models import Max, Q
from django.utils import timezone

from stack.registry.auth_version import auth_version_bump
from stack.registry.crypto import encrypt_secret
from stack.registry.endpoints import endpoint_under, endpoint_url_problem
from stack.registry.errors import DomainError
from stack.registry.failover_codes import FailoverCode
from stack.registry.models import (
    MAX_PROMPT_RETENTION_DAYS,
    ApiToken,
    Cluster,
    Deployment,
    FailoverEvent,
    Provider,
    RoutingPolicyEntry,
    RoutingPolicyVersion,
    SsoIdentity,
    Team,
    TeamMembership,
    WorkerHeartbeat,
    Workflow,
)
from stack.registry.roles import ALL_ROLES, Role
from stack.registry.selectors import workflow_current_policy
from stack.registry.teams import user_team_scope, user_teams_with_role
from stack.registry.validation import text_problem

logger = logging.getLogger(__name__)


class RegistryError(DomainError, ValueError):
    """A registry change that is not allowed; the message is shown to the user."""


# --- Teams ----------------------------------------------------------------------


def team_membership_set(*, team: Team, user: User, role: str) -> TeamMembership:
    """Make `user` a member of `team` with `role`, or change the role of a member. A row set
    here is a manual one (a later single-sign-on login does not rewrite it)."""
    if role not in Role.values:
        raise RegistryError(f"unknown role {role!r}; one of {', '.join(Role.values)}", field="role")
    membership, _ = TeamMembership.objects.update_or_create(
        team=team, user=user, defaults={"role": role, "source": "manual"}
    )
    return membership


def team_membership_remove(*, team: Team, user: User) -> bool:
    """Take `user` out of `team`; False when they were not a member."""
    deleted, _ = TeamMembership.objects.filter(team=team, user=user).delete()
    return deleted > 0


# --- Providers ------------------------------------------------------------------


def provider_set_credentials(*, provider: Provider, credentials: str | None) -> Provider:
    """Store (encrypted) or clear a provider's credentials. None leaves them as they are."""
    if credentials is None:
        return provider
    provider.credentials_encrypted = encrypt_secret(credentials) if credentials else ""
    provider.save(update_fields=["credentials_encrypted"])
    return provider


def provider_endpoints_allow(
    *, provider: Provider, urls: Sequence[str], private_network: bool | None = None
) -> Provider:
    """An admin's act: let deployments of `provider` use these endpoints (URL prefixes), and
    optionally let the outbound guard reach private networks for it. The demo seed and the
    benchmarks, which register loopback model servers, call this."""
    allowed = list(provider.allowed_endpoints or [])
    for url in urls:
        problem = endpoint_url_problem(url)
        if problem is not None:
            raise RegistryError(f"{url[:100]}: {problem}", field="allowed_endpoints")
        prefixes = [provider.base_url, *allowed] if provider.base_url else allowed
        if not any(endpoint_under(url, prefix) for prefix in prefixes):
            allowed.append(url.rstrip("/"))
    fields = []
    if allowed != list(provider.allowed_endpoints or []):
        provider.allowed_endpoints = allowed
        fields.append("allowed_endpoints")
    if private_network is not None and provider.allow_private_network != private_network:
        provider.allow_private_network = private_network
        fields.append("allow_private_network")
    if fields:
        provider.save(update_fields=fields)
    return provider


# --- Failover events ----------------------------------------------------------------


def failover_event_record(
    *,
    kind: FailoverEvent.Kind,
    code: FailoverCode | str,
    reason: str,
    detected_at: datetime,
    from_provider: Provider | None = None,
    to_provider: Provider | None = None,
    from_cluster: Cluster | None = None,
    to_cluster: Cluster | None = None,
    from_deployment: Deployment | None = None,
    to_deployment: Deployment | None = None,
    subject: str = "",
    recovered_at: datetime | None = None,
    time_lost: timedelta | None = None,
    extra_cost: Decimal = Decimal("0"),
    currency: str = "USD",
    details: dict[str, object] | None = None,
    training_run_id: int | None = None,
    tokens_lost: int | None = None,
    status_code: int | None = None,
) -> FailoverEvent:
    """The only writer of FailoverEvent rows."""
    if from_cluster is not None and from_provider is None:
        from_provider = from_cluster.provider
    if to_cluster is not None and to_provider is None:
        to_provider = to_cluster.provider
    if from_deployment is not None and from_provider is None:
        from_provider = from_deployment.provider
    if to_deployment is not None and to_provider is None:
        to_provider = to_deployment.provider
    if time_lost is None and recovered_at is not None:
        time_lost = recovered_at - detected_at
    if code not in FailoverCode.values:
        raise ValueError(f"unknown failover code {code!r}")
    return FailoverEvent.objects.create(
        kind=kind,
        code=code,
        reason=reason[:500],
        detected_at=detected_at,
        recovered_at=recovered_at,
        time_lost=time_lost,
        from_provider=from_provider,
        to_provider=to_provider,
        from_cluster=from_cluster,
        to_cluster=to_cluster,
        from_deployment=from_deployment,
        to_deployment=to_deployment,
        subject=subject,
        extra_cost=extra_cost,
        currency=currency,
        details=details or {},
        training_run_id=training_run_id,
        tokens_lost=tokens_lost,
        status_code=status_code,
    )


def failover_event_recover(
    *, event: FailoverEvent, recovered_at: datetime, to_cluster: Cluster | None = None
) -> FailoverEvent:
    """Close an open event: when it recovered and how long was lost."""
    event.recovered_at = recovered_at
    event.time_lost = recovered_at - event.detected_at
    fields = ["recovered_at", "time_lost"]
    if to_cluster is not None:
        event.to_cluster = to_cluster
        event.to_provider = to_cluster.provider
        fields += ["to_cluster", "to_provider"]
    event.save(update_fields=fields)
    return event


# --- Cluster health -------------------------------------------------------------------


def cluster_heartbeat(*, cluster_slug: str, hostname: str, pid: int, started_at: datetime) -> Cluster | None:
    """Record that a worker of the cluster is alive; a silent cluster turns healthy.

    Returns None when the cluster no longer exists (the worker keeps running, it
    just has nothing to report to).
    """
    now = timezone.now()
    with transaction.atomic():
        cluster = Cluster.objects.select_for_update().filter(slug=cluster_slug).first()
        if cluster is None:
            return None
        WorkerHeartbeat.objects.update_or_create(
            cluster=cluster,
            hostname=hostname,
            defaults={"pid": pid, "started_at": started_at, "last_seen_at": now},
        )
        cluster.last_heartbeat_at = now
        fields = ["last_heartbeat_at"]
        if cluster.status in (Cluster.Status.DOWN, Cluster.Status.DEGRADED):
            _cluster_recovered(cluster=cluster, now=now)
            cluster.status = Cluster.Status.HEALTHY
            cluster.status_changed_at = now
            fields += ["status", "status_changed_at"]
        cluster.save(update_fields=fields)
    return cluster


def _cluster_recovered(*, cluster: Cluster, now: datetime) -> None:
    open_events = FailoverEvent.objects.filter(
        kind=FailoverEvent.Kind.CLUSTER_HEALTH, from_cluster=cluster, recovered_at__isnull=True
    )
    for event in open_events:
        failover_event_recover(event=event, recovered_at=now)


@dataclass(frozen=True)
class HealthTransition:
    cluster_slug: str
    old: str
    new: str


def cluster_health_check(*, now: datetime | None = None) -> list[HealthTransition]:
    """Derive each cluster's status from its last heartbeat.

    healthy → degraded after DEGRADED_AFTER_SECONDS of silence, → down after
    DOWN_AFTER_SECONDS; going down records a cluster-health FailoverEvent.
    Draining clusters are left alone: an operator owns that state.
    """
    now = now or timezone.now()
    degraded_before = now - timedelta(seconds=settings.DEGRADED_AFTER_SECONDS)
    down_before = now - timedelta(seconds=settings.DOWN_AFTER_SECONDS)
    transitions: list[HealthTransition] = []
    candidates = Cluster.objects.filter(status__in=[Cluster.Status.HEALTHY, Cluster.Status.DEGRADED]).filter(
        Q(last_heartbeat_at__isnull=True) | Q(last_heartbeat_at__lt=degraded_before)
    )
    for cluster_id in candidates.values_list("id", flat=True):
        with transaction.atomic():
            # Re-read under a lock: a heartbeat may have landed since the scan.
            cluster = Cluster.objects.select_for_update().select_related("provider").get(id=cluster_id)
            last = cluster.last_heartbeat_at
            if cluster.status not in (Cluster.Status.HEALTHY, Cluster.Status.DEGRADED):
                continue
            if last is not None and last >= degraded_before:
                continue
            new = Cluster.Status.DOWN if last is None or last < down_before else Cluster.Status.DEGRADED
            if new == cluster.status:
                continue
            old = cluster.status
            cluster.status = new
            cluster.status_changed_at = now
            cluster.save(update_fields=["status", "status_changed_at"])
            if new == Cluster.Status.DOWN:
                silent = "never" if last is None else f"{(now - last).total_seconds():.0f}s"
                failover_event_record(
                    kind=FailoverEvent.Kind.CLUSTER_HEALTH,
                    code=FailoverCode.HEARTBEAT_TIMEOUT,
                    reason=f"{old} → down: no worker heartbeat for {silent}",
                    detected_at=now,
                    from_cluster=cluster,
                    subject=f"cluster:{cluster.slug}",
                    details={"previous_status": old, "last_heartbeat_at": last.isoformat() if last else None},
                )
            transitions.append(HealthTransition(cluster.slug, old, new))
            logger.warning("cluster %s: %s → %s", cluster.slug, old, new)
    return transitions


def cluster_set_draining(*, cluster: Cluster, draining: bool) -> Cluster:
    now = timezone.now()
    fields = ["status", "status_changed_at"]
    if draining:
        cluster.status = Cluster.Status.DRAINING
    else:
        # Back to what the heartbeats say: healthy only if one arrived recently,
        # so resuming a silent cluster does not claim it is alive.
        last = cluster.last_heartbeat_at
        recent = last is not None and (now - last).total_seconds() <= settings.DEGRADED_AFTER_SECONDS
        cluster.status = Cluster.Status.HEALTHY if recent else Cluster.Status.DOWN
        # Resuming ends an interruption notice too: the provider gave the capacity back.
        cluster.interruption_noticed_at = cluster.interruption_deadline = None
        fields += ["interruption_noticed_at", "interruption_deadline"]
    cluster.status_changed_at = now
    cluster.save(update_fields=fields)
    return cluster


# AWS gives a spot instance two minutes' notice (EC2 "spot instance interruption notices"),
# Google Cloud 30 s (preemption notice); a notice without a deadline assumes the longer one.
INTERRUPTION_DEFAULT_SECONDS = 120
# A deadline further out than this is not an interruption but a maintenance window: drain instead.
INTERRUPTION_MAX_SECONDS = 3600


def cluster_interruption_notice(
    *, cluster: Cluster, deadline: datetime | None = None, now: datetime | None = None
) -> Cluster:
    """A spot cluster will be reclaimed at `deadline`: drain it now, so that placement avoids it,
    its learners push their deltas and stop, and the training supervisor moves them elsewhere.

    Refuses (RegistryError, with the field) a cluster that is not spot capacity and a deadline
    that is past or more than an hour away. A second notice keeps the earlier deadline when it is
    sooner (a notice never buys time).
    """
    now = now or timezone.now()
    if cluster.capacity_type != Cluster.CapacityType.SPOT:
        raise RegistryError(
            f"cluster {cluster.slug} is {cluster.capacity_type} capacity; only a spot cluster is interrupted "
            "(drain it instead)",
            field="cluster",
        )
    if deadline is None:
        deadline = now + timedelta(seconds=INTERRUPTION_DEFAULT_SECONDS)
    if deadline <= now:
        raise RegistryError("the deadline has passed; give a time in the future", field="deadline")
    if deadline > now + timedelta(seconds=INTERRUPTION_MAX_SECONDS):
        raise RegistryError(
            f"at most {INTERRUPTION_MAX_SECONDS // 60} minutes ahead (a later reclaim is maintenance: drain)",
            field="deadline",
        )
    with transaction.atomic():
        locked = Cluster.objects.select_for_update().get(pk=cluster.pk)
        if locked.interruption_deadline is not None and locked.interruption_deadline < deadline:
            deadline = locked.interruption_deadline
        if locked.interruption_noticed_at is None:
            locked.interruption_noticed_at = now
        locked.interruption_deadline = deadline
        if locked.status != Cluster.Status.DRAINING:
            locked.status = Cluster.Status.DRAINING
            locked.status_changed_at = now
        locked.save(
            update_fields=["interruption_noticed_at", "interruption_deadline", "status", "status_changed_at"]
        )
    logger.warning("cluster %s: spot interruption notice, reclaimed at %s", locked.slug, deadline.isoformat())
    return locked


# --- Workflows and routing policies ------------------------------------------------------


def _validate_route(deployments: Sequence[Deployment]) -> None:
    if not deployments:
        raise RegistryError("a route needs at least one deployment", field="deployments")
    if len({d.pk for d in deployments}) != len(deployments):
        raise RegistryError("a deployment appears twice in the route", field="deployments")


def workflow_policy_change(
    *,
    workflow: Workflow,
    deployments: Sequence[Deployment],
    author: User,
    reason: str,
    strategy: str = RoutingPolicyVersion.Strategy.PRIORITY,
    quality_floor: Decimal | None = None,
    max_cost_per_request: Decimal | None = None,
    weights: Sequence[int] | None = None,
) -> RoutingPolicyVersion:
    """Create the next immutable policy version of a workflow."""
    _validate_route(deployments)
    if not reason.strip():
        raise RegistryError("say why the route changes", field="reason")
    if weights is not None and len(weights) != len(deployments):
        raise RegistryError("one weight per deployment", field="weights")
    with transaction.atomic():
        # Lock the workflow so two concurrent changes get versions n+1 and n+2.
        Workflow.objects.select_for_update().filter(pk=workflow.pk).first()
        latest = workflow.policy_versions.aggregate(m=Max("version"))["m"] or 0
        policy = RoutingPolicyVersion.objects.create(
            workflow=workflow,
            version=latest + 1,
            strategy=strategy,
            quality_floor=quality_floor,
            max_cost_per_request=max_cost_per_request,
            author=author,
            reason=reason.strip(),
        )
        RoutingPolicyEntry.objects.bulk_create(
            RoutingPolicyEntry(
                policy=policy,
                deployment=d,
                position=i,
                weight=weights[i] if weights is not None else 1,
            )
            for i, d in enumerate(deployments)
        )
    return policy


def workflow_retention_check(*, retain_prompts: bool, prompt_retention_days: int | None) -> None:
    """Keeping prompts needs a retention period of 1..MAX_PROMPT_RETENTION_DAYS days (the
    database's check constraint says the same; this names the field)."""
    if prompt_retention_days is not None and not 1 <= prompt_retention_days <= MAX_PROMPT_RETENTION_DAYS:
        raise RegistryError(
            f"must be between 1 and {MAX_PROMPT_RETENTION_DAYS} days", field="prompt_retention_days"
        )
    if retain_prompts and prompt_retention_days is None:
        raise RegistryError("required when prompts are kept (1 to 365 days)", field="prompt_retention_days")


def workflow_retention_set(
    *, workflow: Workflow, retain_prompts: bool, prompt_retention_days: int | None
) -> Workflow:
    """Opt a workflow in to keeping its prompts (for replays) or out. Opting out deletes the
    kept prompts at once (inference's Workflow post_save receiver, in this transaction)."""
    workflow_retention_check(retain_prompts=retain_prompts, prompt_retention_days=prompt_retention_days)
    workflow.retain_prompts = retain_prompts
    workflow.prompt_retention_days = prompt_retention_days
    workflow.save(update_fields=["retain_prompts", "prompt_retention_days"])
    return workflow


def workflow_create(
    *,
    slug: str,
    owner: User,
    deployments: Sequence[Deployment],
    description: str = "",
    team: Team | None = None,
    strategy: str = RoutingPolicyVersion.Strategy.PRIORITY,
    quality_floor: Decimal | None = None,
    max_cost_per_request: Decimal | None = None,
    rpm_limit: int | None = None,
    tpm_limit: int | None = None,
    retain_prompts: bool = False,
    prompt_retention_days: int | None = None,
) -> Workflow:
    _validate_route(deployments)
    _rate_limit_check(rpm_limit=rpm_limit, tpm_limit=tpm_limit)
    workflow_retention_check(retain_prompts=retain_prompts, prompt_retention_days=prompt_retention_days)
    with transaction.atomic():
        workflow = Workflow.objects.create(
            slug=slug,
            owner=owner,
            description=description,
            team=team,
            rpm_limit=rpm_limit,
            tpm_limit=tpm_limit,
            retain_prompts=retain_prompts,
            prompt_retention_days=prompt_retention_days,
        )
        workflow_policy_change(
            workflow=workflow,
            deployments=deployments,
            author=owner,
            reason="created",
            strategy=strategy,
            quality_floor=quality_floor,
            max_cost_per_request=max_cost_per_request,
        )
    return workflow


def workflow_switch_primary(
    *, workflow: Workflow, deployment: Deployment, author: User, reason: str
) -> RoutingPolicyVersion:
    """Make `deployment` the first choice; the rest of the route keeps its order."""
    if not deployment.enabled:
        raise RegistryError(f"deployment {deployment.slug} is disabled", field="deployment")
    current = workflow_current_policy(workflow=workflow)
    if current is None:
        order = [deployment]
        strategy: str = RoutingPolicyVersion.Strategy.PRIORITY
        floor = max_cost = None
    else:
        existing = current.ordered_deployments()
        if existing and existing[0].pk == deployment.pk:
            raise RegistryError(f"{deployment.slug} is already the primary deployment", field="deployment")
        order = [deployment] + [d for d in existing if d.pk != deployment.pk]
        strategy = current.strategy
        floor, max_cost = current.quality_floor, current.max_cost_per_request
    return workflow_policy_change(
        workflow=workflow,
        deployments=order,
        author=author,
        reason=reason,
        strategy=strategy,
        quality_floor=floor,
        max_cost_per_request=max_cost,
    )


# --- API tokens ---------------------------------------------------------------------------

TOKEN_PREFIX = "sy"  # noqa: S105 (a label, not a secret)
TOKEN_NAME_MAX_LENGTH = 100  # ApiToken.name
_TOKEN_ID = re.compile(r"[0-9A-Za-z]{1,16}")  # ApiToken.prefix: token_hex(6) since the first token


def _hash_secret(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


RATE_LIMIT_MAX = 2_147_483_647  # the PositiveIntegerField columns of rpm_limit and tpm_limit


def _rate_limit_check(*, rpm_limit: int | None, tpm_limit: int | None) -> None:
    for field, value in (("rpm_limit", rpm_limit), ("tpm_limit", tpm_limit)):
        if value is not None and not 0 <= value <= RATE_LIMIT_MAX:
            raise RegistryError(f"a rate limit is a whole number from 0 to {RATE_LIMIT_MAX}", field=field)


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
    requests / tokens per minute (inference.ratelimit), its team's limits applying as well;
    after `expires_at` (aware, in the future) it answers 401.
    """
    _rate_limit_check(rpm_limit=rpm_limit, tpm_limit=tpm_limit)
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


def api_token_authenticate(*, raw: str) -> ApiToken | None:
    parts = raw.split("_", 2)
    if len(parts) != 3 or parts[0] != TOKEN_PREFIX:
        return None
    _, prefix, secret = parts
    if not _TOKEN_ID.fullmatch(prefix):  # never look up text no token can have (NUL: a DataError)
        return None
    # An expired token is returned (callers answer 401 saying so: ApiToken.expired).
    token = (
        ApiToken.objects.select_related("user", "team").filter(prefix=prefix, revoked_at__isnull=True).first()
    )
    if token is None or not hmac.compare_digest(token.key_hash, _hash_secret(secret)):
        return None
    now = timezone.now()
    # Touch at most once a minute: a token used in a hot loop must not turn
    # every request into a write.
    if token.last_used_at is None or now - token.last_used_at > timedelta(minutes=1):
        ApiToken.objects.filter(pk=token.pk).update(last_used_at=now)
    return token


def api_token_limits_set(
    *, token: ApiToken, rpm_limit: int | None, tpm_limit: int | None, rate_limit_fail_closed: bool
) -> ApiToken:
    """Change a token's /v1 rate limits (None: no limit). Saving moves the authorisation version
    (stack.registry.signals), so the gateway applies them from the next request."""
    _rate_limit_check(rpm_limit=rpm_limit, tpm_limit=tpm_limit)
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


# --- Single sign-on (stack.registry.sso; README "SSO") ------------------------------

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
    the authorisation version (stack.registry.signals) see every change.
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

    A first login whose username is already taken by another account is refused: a provider's
    user named like a local admin must not become that admin."""
    subject = _claim_text(claims, "sub", max_length=SSO_MAX_SUBJECT_LENGTH)
    if not subject:
        raise RegistryError("the identity has no subject (sub claim)", field="sub")
    email = _claim_text(claims, "email", max_length=254)
    first_name = _claim_text(claims, "given_name", max_length=150)
    last_name = _claim_text(claims, "family_name", max_length=150)
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
            SsoIdentity.objects.create(user=user, issuer=issuer, subject=subject)
        else:
            user = identity.user
            current = {"email": email, "first_name": first_name, "last_name": last_name}
            stale = [name for name, value in current.items() if getattr(user, name) != value]
            if stale:
                for name in stale:
                    setattr(user, name, current[name])
                user.save(update_fields=stale)
        sync = team_memberships_sync_from_claims(user=user, groups=claims.get(groups_claim))
    return user, sync


__all__ = [
    "RegistryError",
    "api_token_authenticate",
    "api_token_create",
    "api_token_limits_set",
    "api_token_revoke",
    "api_token_team_check",
    "cluster_health_check",
    "cluster_heartbeat",
    "cluster_interruption_notice",
    "cluster_set_draining",
    "failover_event_record",
    "failover_event_recover",
    "provider_set_credentials",
    "sso_user_login",
    "sso_username_from_claims",
    "team_memberships_sync_from_claims",
    "workflow_create",
    "workflow_policy_change",
    "workflow_switch_primary",
]
