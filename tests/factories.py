"""Test data builders: small functions with sensible defaults, overridable per test."""

from __future__ import annotations

import itertools
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

from django.contrib.auth.models import Group, User
from django.utils import timezone
from rest_framework.test import APIClient

from billing.models import PriceBook, Unit
from billing.services import price_book_publish, usage_record
from registry.auth.roles import Role
from registry.auth.teams import user_team_scope
from registry.models import (
    Cluster,
    Deployment,
    Provider,
    RegisteredModel,
    Team,
    TeamMembership,
    Workflow,
)
from registry.services import api_token_create, provider_endpoints_allow, workflow_create
from training.models import GlobalVersionRecord, LearnerChunk, PlacementDecision, TrainingLearner, TrainingRun

_seq = itertools.count(1)


def unique(prefix: str) -> str:
    return f"{prefix}-{next(_seq)}"


def make_user(
    role: Role | None = None, *, username: str | None = None, password: str = "pw-for-tests-1"
) -> User:
    user = User.objects.create_user(username=username or unique("user"), password=password)
    if role is not None:
        # get_or_create: transactional tests flush the groups the migration made.
        user.groups.add(Group.objects.get_or_create(name=role.value)[0])
    return user


def api_client(user: User, *, team: Team | None = None) -> APIClient:
    """An API client of `user`: a real bearer token, or, for a team-scoped user in several teams
    and no `team` named, its session (every key of a team member spends for one team, so only a
    session reaches all of its teams; a key of `team`, or of its only team, otherwise)."""
    client = APIClient()
    teams = user_team_scope(user)
    if team is None and teams:
        if len(teams) > 1:
            client.force_login(user)
            return client
        team = Team.objects.get(pk=next(iter(teams)))
    _, raw = api_token_create(user=user, name="tests", team=team)
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    return client


def make_provider(**overrides: Any) -> Provider:
    """A provider as an admin would register it for the tests' loopback model servers: allowed to
    reach private networks (pass allow_private_network=False for the outbound guard's tests)."""
    fields: dict[str, Any] = {
        "slug": unique("prov"),
        "display_name": "Test provider",
        "kind": Provider.Kind.AWS,
        "region": "us-east-1",
        "allow_private_network": True,
    }
    fields.update(overrides)
    return Provider.objects.create(**fields)


def make_cluster(*, price: Decimal | None = Decimal("2.000000"), **overrides: Any) -> Cluster:
    fields: dict[str, Any] = {
        "slug": unique("cl"),
        "accelerator_type": "A10G",
        "accelerator_count": 4,
        "capacity": 2,
    }
    fields.update(overrides)
    if "provider" not in fields:
        fields["provider"] = make_provider()
    cluster = Cluster.objects.create(**fields)
    if price is not None:
        make_price(cluster=cluster, unit_price=price)
    return cluster


def make_price(
    *,
    unit_price: Decimal,
    unit: Unit = Unit.ACCELERATOR_HOUR,
    effective_from: datetime | None = None,
    **target: Any,
) -> PriceBook:
    return price_book_publish(
        unit=unit,
        unit_price=unit_price,
        effective_from=effective_from or timezone.now() - timezone.timedelta(days=30),
        **target,
    )


def make_model(**overrides: Any) -> RegisteredModel:
    fields: dict[str, Any] = {"slug": unique("model"), "family": "gpt-byte", "context_length": 128}
    fields.update(overrides)
    return RegisteredModel.objects.create(**fields)


def make_deployment(**overrides: Any) -> Deployment:
    fields: dict[str, Any] = {"slug": unique("dep"), "provider_model_id": "m-1"}
    fields.update(overrides)
    fields.setdefault("model", make_model())
    fields.setdefault("provider", make_provider(kind=Provider.Kind.OPENAI_COMPATIBLE))
    if fields.get("base_url"):
        # The admin's part: the provider's endpoints cover the deployment's base URL.
        provider_endpoints_allow(provider=fields["provider"], urls=[fields["base_url"]])
    return Deployment.objects.create(**fields)


def make_team(slug: str | None = None, **fields: Any) -> Team:
    """The team of this slug, made on first use (tests name teams by slug, as the ledger does)."""
    slug = slug or unique("team")
    return Team.objects.get_or_create(slug=slug, defaults={"name": slug.title(), **fields})[0]


def make_member(team: Team | str, role: Role | str, *, user: User | None = None) -> User:
    """A user (a new one with no global role by default) holding `role` in `team`."""
    team = make_team(team) if isinstance(team, str) else team
    user = user or make_user()
    TeamMembership.objects.update_or_create(team=team, user=user, defaults={"role": str(role)})
    return user


def make_workflow(*, owner: User, deployments: list[Deployment] | None = None, **overrides: Any) -> Workflow:
    if isinstance(overrides.get("team"), str):
        # Tests name the owning team by slug, as the ledger does.
        overrides["team"] = make_team(overrides["team"]) if overrides["team"] else None
    return workflow_create(
        slug=overrides.pop("slug", unique("wf")),
        owner=owner,
        deployments=deployments or [make_deployment(), make_deployment()],
        **overrides,
    )


def tiny_run_config(**overrides: Any) -> dict[str, Any]:
    """A training-run config small enough to place, chunk and sync inside a unit test (its store
    is the installation's OBJECT_STORE_URL: tests/training/conftest.py points it at tmp_path)."""
    cfg: dict[str, Any] = {
        "model": {"n_layer": 1, "n_embd": 16, "n_head": 2, "block_size": 16},
        "data": {"max_train_bytes": 50_000, "max_eval_bytes": 5_000},
        "learners": {"count": 2, "quorum": 1, "batch_size": 4},
        "h": 5,
        "syncer": {"grace_seconds": 0.0},
        "stop": {"outer_steps": 50},
        "chunk_seconds": 0.5,
        "learner_timeout": 10,
        "eval_windows": 8,
    }
    if overrides.get("team"):  # the run's team must exist: made on first use
        make_team(overrides["team"])
    cfg.update(overrides)
    return cfg


def fabricate_run(name: str = "fabricated") -> TrainingRun:
    """A running run on two clusters with three versions, two chunks and 4.50 USD in the ledger."""
    now = timezone.now()
    a = make_cluster(price=Decimal("2.000000"))
    b = make_cluster(price=Decimal("3.000000"))
    run = TrainingRun.objects.create(name=name, config={"learners": {"count": 2}}, initial_eval_loss=5.0)
    run.transition(TrainingRun.State.PLACING, reason="placing")
    run.transition(TrainingRun.State.RUNNING, reason="placed")
    learners = []
    for index, (cluster, tokens) in enumerate(((a, 1000), (b, 3000))):
        learner = TrainingLearner.objects.create(
            run=run, index=index, cluster=cluster, state=TrainingLearner.State.RUNNING, tokens=tokens, steps=3
        )
        learners.append(learner)
        PlacementDecision.objects.create(
            run=run,
            learner_index=index,
            generation=0,
            cluster=cluster,
            reason=PlacementDecision.Reason.INITIAL,
            unit_price=Decimal("2.000000") if cluster == a else Decimal("3.000000"),
            candidates=[{"cluster": a.slug, "rejected": ""}, {"cluster": b.slug, "rejected": ""}],
        )
        LearnerChunk.objects.create(
            learner=learner,
            generation=0,
            seq=0,
            cluster=cluster,
            steps=3,
            tokens=tokens,
            train_losses=[5.5, 5.0 - index, 4.5 - index],
            bytes_sent=100 * (index + 1),
            finished_at=now,
        )
    for version, (loss, cost) in enumerate(((5.0, "0"), (4.0, "1.5"), (3.0, "4.5"))):
        GlobalVersionRecord.objects.create(
            run=run,
            fragment=0,
            version=version,
            published_at=now + timedelta(seconds=version),
            eval_loss=loss,
            tokens_total=1000 * version,
            learners_merged=[0, 1][: version + 1] if version else [],
            bytes_in=512 * version,
            cost_so_far=Decimal(cost),
            wall_seconds=10.0 * version,
        )
    for cluster, hours in ((a, "1.5"), (b, "0.5")):
        usage_record(
            unit=Unit.ACCELERATOR_HOUR,
            quantity=Decimal(hours),
            occurred_at=now,
            idempotency_key=f"test:{run.pk}:{cluster.slug}",
            subject_type="training_run",
            subject_id=str(run.pk),
            cluster=cluster,
        )
    return run
