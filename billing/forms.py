"""The forms of billing's pages: budgets, the ledger filter, export, price and invoice uploads."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from django import forms

from billing.budgets import budget_errors
from billing.exports import FORMATS, ExportFilterForm
from billing.models import AlertChannel, Budget, Unit
from billing.reconciliation import DEFAULT_TOLERANCE, TOLERANCE_DIGITS, TOLERANCE_PLACES
from billing.selectors import PURPOSE_BY_UNIT
from registry.form_fields import CurrencyField, DecimalField, IntegerField, model_formfield
from registry.models import Provider, Team, Workflow
from registry.validation import InputError, int_parse

FORMAT_LABELS = {"csv": "CSV", "jsonl": "JSON Lines", "parquet": "Parquet"}
PRICE_FILE_FORMATS = [("", "from the file name (.json is a catalog file)"), ("csv", "CSV"), ("json", "JSON")]


class BudgetForm(forms.ModelForm[Budget]):
    thresholds_text = forms.CharField(
        label="Alert thresholds (%)",
        required=False,
        initial="50, 80, 100",
        help_text="Comma-separated percentages of the limit, e.g. 50, 80, 100.",
    )
    webhook_secret = forms.CharField(
        required=False,
        strip=False,
        widget=forms.PasswordInput(render_value=False, attrs={"autocomplete": "new-password"}),
        help_text="Write-only HMAC key: stored encrypted, never shown. Leave empty to keep the current one.",
    )
    clear_webhook_secret = forms.BooleanField(required=False, label="Clear the stored webhook secret")

    class Meta:
        model = Budget
        fields = [
            "name",
            "scope",
            "workflow",
            "provider",
            "cluster",
            "team",
            "training_run_id",
            "period",
            "custom_start",
            "custom_end",
            "limit_amount",
            "currency",
            "hard_limit",
            "email_to",
            "webhook_url",
            "active",
        ]
        formfield_callback = model_formfield
        help_texts = {
            "custom_start": "Custom periods only; UTC, e.g. 2026-01-01 00:00.",
            "custom_end": "Custom periods only; UTC, exclusive.",
        }

    def __init__(self, *args: Any, writable_teams: frozenset[int] | None = None, **kwargs: Any) -> None:
        """`writable_teams`: the teams a team-scoped author operates (None: a platform author). Such
        an author budgets its teams or their workflows only; the other scopes are the platform's."""
        super().__init__(*args, **kwargs)
        if self.instance.pk:
            self.fields["thresholds_text"].initial = ", ".join(str(t) for t in self.instance.thresholds)
        if writable_teams is not None:
            for name in ("provider", "cluster", "training_run_id"):
                del self.fields[name]
            scope: Any = self.fields["scope"]
            scope.choices = [(Budget.Scope.TEAM, "Team"), (Budget.Scope.WORKFLOW, "Workflow")]
            workflow: Any = self.fields["workflow"]
            workflow.queryset = Workflow.objects.filter(team__in=writable_teams).order_by("slug")
            slugs = Team.objects.filter(pk__in=writable_teams).order_by("slug").values_list("slug", flat=True)
            self.fields["team"] = forms.ChoiceField(
                required=False,
                choices=[("", "---------"), *((slug, slug) for slug in slugs)],
                error_messages={"invalid_choice": "no team %(value)s that you operate"},
            )

    def webhook_secret_change(self) -> str | None:
        """'' to clear, a new value to store, None to keep what is stored."""
        if self.cleaned_data.get("clear_webhook_secret"):
            return ""
        value: str = self.cleaned_data.get("webhook_secret") or ""
        return value or None

    def clean(self) -> dict[str, Any]:
        cleaned: dict[str, Any] = super().clean() or {}
        text = cleaned.get("thresholds_text") or ""
        try:
            thresholds = [int_parse(part) for part in text.replace(";", ",").split(",") if part.strip()]
        except InputError:
            self.add_error("thresholds_text", "whole percentages separated by commas, e.g. 50, 80, 100")
            return cleaned
        cleaned["thresholds"] = thresholds
        change = self.webhook_secret_change()
        has_secret = bool(change) if change is not None else bool(self.instance.webhook_secret_encrypted)
        errors = budget_errors(values=cleaned, has_secret=has_secret)
        for name, problems in errors.items():
            target = {"thresholds": "thresholds_text"}.get(name, name)
            for problem in problems:
                self.add_error(target if target in self.fields else None, problem)
        return cleaned


class LedgerFilterForm(forms.Form):
    since = forms.DateField(required=False, help_text="UTC day, inclusive")
    until = forms.DateField(required=False, help_text="UTC day, exclusive")
    provider = forms.SlugField(required=False)
    cluster = forms.SlugField(required=False)
    workflow = forms.SlugField(required=False)
    training_run = forms.CharField(required=False, max_length=64)
    team = forms.SlugField(required=False, max_length=64)
    unit = forms.ChoiceField(required=False, choices=[("", "any"), *Unit.choices])
    currency = CurrencyField(required=False)
    purpose = forms.ChoiceField(
        required=False, choices=[("", "any")] + [(p, p) for p in sorted(set(PURPOSE_BY_UNIT.values()))]
    )
    before = IntegerField(required=False, min_value=1, widget=forms.HiddenInput)


class ExportPageForm(ExportFilterForm):
    format = forms.ChoiceField(
        choices=[(f, FORMAT_LABELS[f]) for f in FORMATS], initial="csv", widget=forms.RadioSelect
    )


class PriceImportForm(forms.Form):
    file = forms.FileField()
    format = forms.ChoiceField(choices=PRICE_FILE_FORMATS, required=False)


class InvoiceUploadForm(forms.Form):
    provider = forms.ModelChoiceField(queryset=Provider.objects.all(), to_field_name="slug")
    tolerance = DecimalField(
        max_digits=TOLERANCE_DIGITS,
        decimal_places=TOLERANCE_PLACES,
        min_value=Decimal("0"),
        initial=DEFAULT_TOLERANCE,
    )
    file = forms.FileField(help_text="AWS CUR, CUR 2.0 or FOCUS columns; see the docs")


class AlertChannelForm(forms.ModelForm[AlertChannel]):
    """An alert channel. Its URL and secret are write-only: empty keeps the stored value."""

    url = forms.CharField(
        label="Webhook URL",
        required=False,
        strip=True,
        max_length=2000,
        widget=forms.PasswordInput(render_value=False, attrs={"autocomplete": "off"}),
        help_text="Stored encrypted and never shown (Slack's and Teams' URLs are their credential). "
        "Leave empty to keep the current one.",
    )
    secret = forms.CharField(
        required=False,
        strip=False,
        widget=forms.PasswordInput(render_value=False, attrs={"autocomplete": "new-password"}),
        help_text="Signed webhooks only: the HMAC key. Write-only; leave empty to keep the current one.",
    )

    class Meta:
        model = AlertChannel
        fields = [
            "name",
            "kind",
            "budget_alerts",
            "anomaly_alerts",
            "daily_digest",
            "digest_team",
            "quiet_period_seconds",
            "active",
        ]
        formfield_callback = model_formfield

    def url_change(self) -> str | None:
        return self.cleaned_data.get("url") or None

    def secret_change(self) -> str | None:
        return self.cleaned_data.get("secret") or None
