"""Create, list and revoke API tokens."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import CommandError, CommandParser
from django.utils import timezone

from stack.registry.cli import CheckedCommand
from stack.registry.models import ApiToken, Team, Workflow
from stack.registry.services import RegistryError, api_token_create, api_token_limits_set, api_token_revoke
from stack.registry.validation import InputError, datetime_utc


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
            try:
                _, raw = api_token_create(
                    user=user,
                    name=options["name"],
                    workflows=workflows,
                    rpm_limit=options["rpm"],
                    tpm_limit=options["tpm"],
                    rate_limit_fail_closed=options["fail_closed"],
                    team=team,
                    expires_at=expires_at,
                )
            except RegistryError as exc:
                raise CommandError(str(exc)) from None
            self.stdout.write(raw)
        else:
            now = timezone.now()
            for token in ApiToken.objects.filter(user=user):
                state = token.state_at(now)
                self.stdout.write(f"{token.prefix}\t{token.name}\t{state}\t{token.created_at:%Y-%m-%d %H:%M}")
