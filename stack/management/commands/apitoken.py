"""Create, list and revoke API tokens.

A composition command (stack): a key with a budget is a registry token and a billing budget made
together (stack.keys.api_key_issue), as on the keys page. `create` writes the secret alone on
stdout (so `TOKEN=$(manage.py apitoken create ...)` works) and the key's terms (team,
workflows, expiry, rate limits, budget) on stderr, where a person reads them.
"""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal, InvalidOperation
from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import CommandError, CommandParser
from django.utils import timezone

from billing.models import Budget
from billing.money import shown_text
from registry.cli import CheckedCommand
from registry.errors import MultiFieldError
from registry.models import ApiToken, Team, Workflow
from registry.services import RegistryError, api_token_limits_set, api_token_revoke
from registry.validation import InputError, datetime_utc
from stack.keys import IssuedKey, KeyBudget, api_key_issue

UNLIMITED = "unlimited"


def _limit(value: int | None) -> str:
    return UNLIMITED if value is None else str(value)


def key_terms(issued: IssuedKey) -> list[str]:
    """The key's terms as the keys page lists them beside a new secret."""
    token = issued.token
    lines = [
        f"prefix: {token.prefix}",
        f"team: {token.team.slug if token.team else 'none (platform key)'}",
        "workflows: " + (", ".join(w.slug for w in token.workflows.all()) or "every workflow of its team"),
        f"expires: {token.expires_at:%Y-%m-%d %H:%M} UTC" if token.expires_at else "expires: never",
        f"rate limits: {_limit(token.rpm_limit)} requests, {_limit(token.tpm_limit)} tokens per minute"
        + (" (fail closed)" if token.rate_limit_fail_closed else ""),
    ]
    if token.team is not None:
        lines.append(
            f"team rate limits: {_limit(token.team.rpm_limit)} requests, "
            f"{_limit(token.team.tpm_limit)} tokens per minute"
        )
    budget = issued.budget
    if budget is None:
        lines.append("budget: none")
    else:
        kind = "hard (402 once spent)" if budget.hard_limit else "soft (alerts only)"
        lines.append(
            f"budget: {shown_text(budget.limit_amount)} {budget.currency} "
            f"{budget.get_period_display().lower()}, {kind}"
        )
    return lines


def _amount(text: str) -> Decimal:
    try:
        value = Decimal(text)
    except InvalidOperation:
        raise CommandError(f"--budget: {text!r} is not an amount") from None
    if not value.is_finite() or value < 0:
        raise CommandError(f"--budget: {text!r} is not a non-negative amount")
    return value


class Command(CheckedCommand):
    help = "Manage API tokens: create (printed once), list, revoke."

    def add_arguments(self, parser: CommandParser) -> None:
        sub = parser.add_subparsers(dest="action", required=True)
        create = sub.add_parser("create", help="create a token and print it once")
        create.add_argument("--user", required=True)
        create.add_argument("--name", default="cli")
        create.add_argument("--team", default=None, help="the team (slug) the key spends for")
        create.add_argument(
            "--expires", default=None, help="expiry, ISO 8601 (UTC when no offset): 2026-12-31T00:00:00Z"
        )
        create.add_argument(
            "--workflow",
            action="append",
            default=[],
            help="limit the token to this workflow, on /v1 and /api/ alike (repeatable)",
        )
        create.add_argument("--budget", default=None, help="the key's own budget, an amount (e.g. 25.00)")
        create.add_argument(
            "--budget-period",
            default=Budget.Period.MONTHLY,
            choices=[Budget.Period.DAILY, Budget.Period.WEEKLY, Budget.Period.MONTHLY],  # custom needs dates
            help="the budget's period (default: monthly)",
        )
        create.add_argument(
            "--soft-budget",
            action="store_true",
            help="alert on the budget but keep answering (default: hard, /v1 answers 402 once spent)",
        )
        create.add_argument("--currency", default="USD", help="the budget's currency (default: USD)")
        for command in (create, limits := sub.add_parser("limits", help="set a token's /v1 rate limits")):
            command.add_argument("--rpm", type=int, default=None, help="requests per minute (none: no limit)")
            command.add_argument("--tpm", type=int, default=None, help="tokens per minute (none: no limit)")
            command.add_argument(
                "--fail-closed",
                action="store_true",
                help="refuse calls (503) while the rate limits cannot be checked (default: let them pass)",
            )
        limits.add_argument("prefix")
        listing = sub.add_parser("list", help="list a user's tokens (never their values)")
        listing.add_argument("--user", required=True)
        revoke = sub.add_parser("revoke", help="revoke a token by its prefix")
        revoke.add_argument("prefix")

    def handle(self, *args: Any, **options: Any) -> None:
        action = options["action"]
        if action == "revoke":
            token = ApiToken.objects.filter(prefix=options["prefix"]).first()
            if token is None:
                raise CommandError(f"no token with prefix {options['prefix']!r}")
            api_token_revoke(token=token)
            self.stdout.write(f"revoked {token.prefix}")
            return
        if action == "limits":
            token = ApiToken.objects.filter(prefix=options["prefix"], revoked_at__isnull=True).first()
            if token is None:
                raise CommandError(f"no active token with prefix {options['prefix']!r}")
            try:
                api_token_limits_set(
                    token=token,
                    rpm_limit=options["rpm"],
                    tpm_limit=options["tpm"],
                    rate_limit_fail_closed=options["fail_closed"],
                    # Whoever runs manage.py on the server acts as the platform.
                    may_raise=True,
                )
            except RegistryError as exc:
                raise CommandError(str(exc)) from None
            self.stdout.write(f"limits of {token.prefix}: rpm {token.rpm_limit}, tpm {token.tpm_limit}")
            return
        User = get_user_model()
        try:
            user = User.objects.get(**{User.USERNAME_FIELD: options["user"]})
        except User.DoesNotExist:
            raise CommandError(f"no user named {options['user']!r}") from None
        if action == "create":
            team = None
            if options["team"] is not None:
                team = Team.objects.filter(slug=options["team"]).first()
                if team is None:
                    raise CommandError(f"no team named {options['team']!r}")
            expires_at = None
            if options["expires"] is not None:
                try:
                    expires_at = datetime_utc(datetime.fromisoformat(options["expires"]), naive_is_utc=True)
                except (ValueError, InputError) as exc:
                    raise CommandError(f"--expires: {exc}") from None
            slugs = options["workflow"]
            workflows = list(Workflow.objects.filter(slug__in=slugs))
            missing = sorted(set(slugs) - {w.slug for w in workflows})
            if missing:
                raise CommandError(f"no workflow named {', '.join(map(repr, missing))}")
            budget = None
            if options["budget"] is not None:
                budget = KeyBudget(
                    limit_amount=_amount(options["budget"]),
                    period=options["budget_period"],
                    hard=not options["soft_budget"],
                    currency=options["currency"],
                )
            try:
                issued = api_key_issue(
                    user=user,
                    name=options["name"],
                    workflows=workflows,
                    rpm_limit=options["rpm"],
                    tpm_limit=options["tpm"],
                    rate_limit_fail_closed=options["fail_closed"],
                    team=team,
                    expires_at=expires_at,
                    budget=budget,
                )
            except (MultiFieldError, RegistryError) as exc:  # a budget's fields, or who may make the key
                raise CommandError(str(exc)) from None
            self.stdout.write(issued.secret)
            for line in key_terms(issued):
                self.stderr.write(line)
        else:
            now = timezone.now()
            for token in ApiToken.objects.filter(user=user):
                state = token.state_at(now)
                self.stdout.write(f"{token.prefix}\t{token.name}\t{state}\t{token.created_at:%Y-%m-%d %H:%M}")
