"""Forms for the registry pages."""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib.auth.models import User
from django.db.models import QuerySet

from stack.registry import services
from stack.registry.failover_codes import FailoverCode
from stack.registry.form_fields import IntegerField, model_formfield
from stack.registry.models import (
    MAX_PROMPT_RETENTION_DAYS,
    Cluster,
    Deployment,
    FailoverEvent,
    Provider,
    RegisteredModel,
    Team,
    Workflow,
)
from stack.registry.objectstore import store_uri_problem
from stack.registry.roles import Role
from stack.registry.services import RATE_LIMIT_MAX


class EndpointListField(forms.CharField):
    """URL prefixes, one a line, as the list Provider.allowed_endpoints stores."""

    widget = forms.Textarea(attrs={"rows": 3})

    def prepare_value(self, value: Any) -> Any:
        if isinstance(value, list):
            return "\n".join(str(v) for v in value)
        return value

    def to_python(self, value: Any) -> list[str]:  # type: ignore[override]
        text = super().to_python(value) or ""
        return [line.strip().rstrip("/") for line in str(text).splitlines() if line.strip()]


class ProviderForm(forms.ModelForm[Provider]):
    allowed_endpoints = EndpointListField(
        required=False,
        label="Allowed endpoints",
        help_text="One URL prefix a line (scheme, host, port, path). Deployments of this provider may use "
        "a base URL under the provider's base URL or one of these; each receives the credentials.",
    )
    credentials = forms.CharField(
        required=False,
        strip=False,
        widget=forms.PasswordInput(render_value=False, attrs={"autocomplete": "new-password"}),
        help_text="Write-only: stored encrypted and never shown again. Leave empty to keep the current value.",
    )
    clear_credentials = forms.BooleanField(required=False, label="Clear stored credentials")

    class Meta:
        model = Provider
        fields = [
            "slug",
            "display_name",
            "kind",
            "region",
            "base_url",
            "allowed_endpoints",
            "allow_private_network",
            "enabled",
        ]
        formfield_callback = model_formfield

    def credentials_change(self) -> str | None:
        """'' to clear, a new value to store, None to keep what is stored."""
        if self.cleaned_data.get("clear_credentials"):
            return ""
        value: str = self.cleaned_data.get("credentials") or ""
        return value or None


class ClusterForm(forms.ModelForm[Cluster]):
    class Meta:
        model = Cluster
        fields = [
            "provider",
            "slug",
            "region",
            "accelerator_type",
            "accelerator_count",
            "memory_per_node_gb",
            "capacity_type",
            "capacity",
        ]
        formfield_callback = model_formfield


class RegisteredModelForm(forms.ModelForm[RegisteredModel]):
    class Meta:
        model = RegisteredModel
        fields = ["slug", "family", "parameter_count", "artifact_uri", "tokenizer", "context_length"]
        formfield_callback = model_formfield

    def clean_artifact_uri(self) -> str:
        value: str = self.cleaned_data["artifact_uri"]
        if value and (problem := store_uri_problem(value)):
            raise forms.ValidationError(problem)
        return value


class DeploymentForm(forms.ModelForm[Deployment]):
    class Meta:
        model = Deployment
        fields = [
            "slug",
            "model",
            "provider",
            "provider_model_id",
            "base_url",
            "hosting_cluster",
            "enabled",
            "supports_tools",
            "supports_json_schema",
            "supports_vision",
            "supports_embeddings",
            "max_context_tokens",
        ]
        formfield_callback = model_formfield

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        if not data.get("provider_model_id") and not data.get("base_url"):
            self.add_error("provider_model_id", "Give the provider's model id or a local endpoint base URL.")
        return data


def _retention_clean(form: forms.BaseForm, data: dict[str, Any]) -> None:
    """The retention rule (days required, 1..365, when prompts are kept) as a form error."""
    try:
        services.workflow_retention_check(
            retain_prompts=bool(data.get("retain_prompts")),
            prompt_retention_days=data.get("prompt_retention_days"),
        )
    except services.RegistryError as exc:
        form.add_error(exc.field if exc.field in form.fields else None, str(exc))


class WorkflowForm(forms.ModelForm[Workflow]):
    deployments = forms.ModelMultipleChoiceField(
        queryset=Deployment.objects.filter(enabled=True),
        help_text="The route, in the order chosen (first is primary).",
    )

    # The owning team, by slug (the pages narrow the choices to the teams the user writes in).
    team = forms.ModelChoiceField(queryset=Team.objects.all(), to_field_name="slug", required=False)

    class Meta:
        model = Workflow
        fields = [
            "slug",
            "team",
            "description",
            "rpm_limit",
            "tpm_limit",
            "retain_prompts",
            "prompt_retention_days",
        ]
        formfield_callback = model_formfield

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        _retention_clean(self, data)
        return data

    def __init__(self, *args: Any, teams: QuerySet[Team], team_required: bool, **kwargs: Any) -> None:
        """`teams`: those the author may create workflows in; a team-scoped author must pick one."""
        super().__init__(*args, **kwargs)
        field: Any = self.fields["team"]  # a ModelChoiceField
        field.queryset = teams
        field.to_field_name = "slug"
        field.required = team_required
        field.empty_label = None if team_required else "none (a platform workflow)"
        field.error_messages["invalid_choice"] = "no team %(value)s in which you may create workflows"


class WorkflowRetentionForm(forms.Form):
    """Keep the workflow's gateway prompts for replays (opt-in), for 1..365 days."""

    retain_prompts = forms.BooleanField(required=False, label="Keep prompts and answers for replays")
    prompt_retention_days = IntegerField(
        required=False, min_value=1, max_value=MAX_PROMPT_RETENTION_DAYS, label="Retention (days)"
    )

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        _retention_clean(self, data)
        return data


class SwitchPrimaryForm(forms.Form):
    deployment = forms.ModelChoiceField(queryset=Deployment.objects.filter(enabled=True))
    reason = forms.CharField(max_length=500)


class ApiTokenLimitsForm(forms.Form):
    """A token's /v1 rate limits (inference.ratelimit); empty means no limit."""

    rpm_limit = IntegerField(
        required=False, min_value=0, max_value=RATE_LIMIT_MAX, label="Requests per minute"
    )
    tpm_limit = IntegerField(required=False, min_value=0, max_value=RATE_LIMIT_MAX, label="Tokens per minute")
    rate_limit_fail_closed = forms.BooleanField(
        required=False, label="Refuse calls (503) while the rate limits cannot be checked"
    )


class TeamFilterForm(forms.Form):
    """`?team=slug` on the dashboards: one of the teams the caller sees; empty: all of them."""

    team = forms.ModelChoiceField(
        queryset=Team.objects.none(),
        to_field_name="slug",
        required=False,
        empty_label="all my teams",
        error_messages={"invalid_choice": "no team %(value)s that you can see"},
    )

    def __init__(self, *args: Any, teams: QuerySet[Team], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        field: Any = self.fields["team"]  # a ModelChoiceField
        field.queryset = teams


class TeamMemberForm(forms.Form):
    """Add a member to a team or change a member's role (a team admin's or platform admin's form)."""

    username = forms.CharField(max_length=150)
    role = forms.ChoiceField(choices=Role.choices)

    def clean_username(self) -> User:
        name: str = self.cleaned_data["username"]
        user = User.objects.filter(username=name, is_active=True).first()
        if user is None:
            raise forms.ValidationError(f"no active user {name}")
        return user


class FailoverFilterForm(forms.Form):
    """The failover list's filters (GET): a kind and a code of the taxonomy, each optional."""

    kind = forms.ChoiceField(choices=[("", "any kind"), *FailoverEvent.Kind.choices], required=False)
    code = forms.ChoiceField(choices=[("", "any code"), *FailoverCode.choices], required=False)
