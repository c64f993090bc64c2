"""The API keys page: each user's keys; a new key is shown once, with its limits and budget.

A composition page (it makes a registry key and a billing budget through stack.keys), so it
lives here rather than in the registry. Revoking and changing rate limits stay registry
services."""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import messages
from django.contrib.auth.models import AnonymousUser, User
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import get_object_or_404, render
from django.urls import reverse
from django.utils import timezone
from django.views import View

from billing.models import Budget
from registry import services
from registry.auth.principal import principal_of_user
from registry.auth.roles import ALL_ROLES
from registry.auth.teams import user_teams_with_role
from registry.errors import DomainError, MultiFieldError
from registry.form_fields import CurrencyField, DateTimeField, DecimalField
from registry.forms import ApiTokenLimitsForm
from registry.models import ApiToken, Team, TeamMembership
from registry.selectors import workflows_visible
from registry.validation import id_parse
from registry.views import RoleRequiredMixin
from stack.keys import IssuedKey, KeyBudget, api_key_issue

KEY_PERIODS = [(p.value, p.label) for p in Budget.Period if p != Budget.Period.CUSTOM]


def teams_for_keys(user: User | AnonymousUser) -> Any:
    """The teams this user may make keys for (any member of the team; every team for platform roles)."""
    allowed = user_teams_with_role(user, ALL_ROLES)  # as api_token_team_check: any member
    rows = Team.objects.order_by("slug")
    return rows if allowed is None else rows.filter(pk__in=allowed)


def _role_labels(user: User | AnonymousUser) -> list[str]:
    """The user's roles as it holds them: global ones, then "<role> of <team>" per membership
    (a role holds in its team only)."""
    labels = sorted(role.label for role in principal_of_user(user).global_roles)
    memberships = TeamMembership.objects.filter(user_id=user.pk or 0).select_related("team")
    labels += sorted(f"{m.get_role_display()} of {m.team.slug}" for m in memberships)
    return labels


class ApiKeyForm(ApiTokenLimitsForm):
    name = forms.CharField(max_length=100)
    team = forms.ModelChoiceField(
        Team.objects.none(),
        to_field_name="slug",
        required=False,
        empty_label="no team (platform key)",
        error_messages={"invalid_choice": "no team %(value)s where you may make keys"},
    )
    workflows: forms.ModelMultipleChoiceField[Any] = forms.ModelMultipleChoiceField(
        queryset=None,
        to_field_name="slug",
        required=False,
        help_text="empty: every workflow of the key's team",
        error_messages={"invalid_choice": "no workflow %(value)s"},
    )
    expires_at = DateTimeField(required=False, label="Expires at", help_text="UTC; empty: never")
    budget_limit_amount = DecimalField(
        required=False, min_value=0, max_digits=24, decimal_places=9, label="Budget", help_text="empty: none"
    )
    budget_currency = CurrencyField(required=False, initial="USD", label="Budget currency")
    budget_period = forms.ChoiceField(
        choices=KEY_PERIODS, required=False, initial=Budget.Period.MONTHLY, label="Budget period"
    )
    budget_hard = forms.BooleanField(
        required=False, initial=True, label="Refuse calls (402) once it is spent"
    )
    field_order = [
        "name",
        "team",
        "workflows",
        "expires_at",
        "rpm_limit",
        "tpm_limit",
        "rate_limit_fail_closed",
        "budget_limit_amount",
        "budget_currency",
        "budget_period",
        "budget_hard",
    ]

    def __init__(self, *args: Any, user: User | AnonymousUser, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        team_field: Any = self.fields["team"]
        team_field.queryset = teams_for_keys(user)
        workflow_field: Any = self.fields["workflows"]
        workflow_field.queryset = workflows_visible(user=user).order_by("slug")

    def budget(self) -> KeyBudget | None:
        data = self.cleaned_data
        if data.get("budget_limit_amount") is None:
            return None
        return KeyBudget(
            limit_amount=data["budget_limit_amount"],
            period=data.get("budget_period") or Budget.Period.MONTHLY,
            hard=data["budget_hard"],
            currency=data.get("budget_currency") or "USD",
        )


class TokenView(RoleRequiredMixin, View):
    """Each user manages their own keys; a new key is shown once."""

    write_roles = ALL_ROLES

    def get(self, request: HttpRequest) -> HttpResponse:
        return self._render(request, ApiKeyForm(user=request.user), issued=None)

    def post(self, request: HttpRequest) -> HttpResponse:
        if "revoke" in request.POST:
            token_id = id_parse(request.POST["revoke"])
            if token_id is None:  # "²" passes str.isdigit() but is no id: a missing token, not a 500
                raise Http404("no such token")
            token = get_object_or_404(ApiToken, pk=token_id, user_id=request.user.pk)
            services.api_token_revoke(token=token)
            messages.success(request, f"Token {token.name} revoked.")
            return HttpResponseRedirect(reverse("tokens"))
        if "limits" in request.POST:
            return self._limits(request)
        form = ApiKeyForm(request.POST, user=request.user)
        if not form.is_valid():
            return self._render(request, form, issued=None, status=400)
        data = form.cleaned_data
        try:
            issued = api_key_issue(
                user=request.user,  # type: ignore[arg-type]
                name=data["name"],
                team=data.get("team"),
                workflows=list(data.get("workflows") or ()),
                rpm_limit=data["rpm_limit"],
                tpm_limit=data["tpm_limit"],
                rate_limit_fail_closed=data["rate_limit_fail_closed"],
                expires_at=data.get("expires_at"),
                budget=form.budget(),
            )
        except DomainError as exc:
            errors = exc.errors if isinstance(exc, MultiFieldError) else {exc.field or "__all__": [str(exc)]}
            for field, messages_ in errors.items():
                for message in messages_:
                    form.add_error(field if field in form.fields else None, message)
            return self._render(request, form, issued=None, status=400)
        return self._render(request, ApiKeyForm(user=request.user), issued=issued)

    def _limits(self, request: HttpRequest) -> HttpResponse:
        """Change one of the user's keys' rate limits (the row's form)."""
        token_id = id_parse(request.POST["limits"])
        if token_id is None:
            raise Http404("no such token")
        token = get_object_or_404(ApiToken, pk=token_id, user_id=request.user.pk, revoked_at__isnull=True)
        form = ApiTokenLimitsForm(request.POST)
        if form.is_valid():
            try:
                services.api_token_limits_set(
                    token=token,
                    may_raise=services.api_token_limits_may_raise(user=request.user, token=token),
                    **form.cleaned_data,
                )
            except DomainError as exc:
                form.add_error(exc.field if exc.field in form.fields else None, str(exc))
        if form.errors:
            return self._render(
                request,
                ApiKeyForm(user=request.user),
                issued=None,
                status=400,
                limits_form=form,
                editing=token,
            )
        messages.success(request, f"Rate limits of token {token.name} changed.")
        return HttpResponseRedirect(reverse("tokens"))

    def _render(
        self,
        request: HttpRequest,
        form: ApiKeyForm,
        issued: IssuedKey | None,
        status: int = 200,
        limits_form: ApiTokenLimitsForm | None = None,
        editing: ApiToken | None = None,
    ) -> HttpResponse:
        now = timezone.now()
        tokens = ApiToken.objects.filter(user_id=request.user.pk).select_related("team")  # type: ignore[misc]
        budgets = {b.api_key_id: b for b in Budget.objects.filter(api_key__in=tokens, active=True)}
        response = render(
            request,
            "stack/tokens.html",
            {
                "form": form,
                "issued": issued,
                "new_token": issued.secret if issued is not None else None,
                "tokens": [(t, budgets.get(t.pk), t.state_at(now)) for t in tokens],
                "roles": _role_labels(request.user),
                "limits_form": limits_form,
                "editing": editing,
            },
            status=status,
        )
        # The page may carry a secret: keep it out of every cache.
        response["Cache-Control"] = "no-store"
        return response
