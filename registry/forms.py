"""Forms for the registry pages."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar, TypeVar

from django import forms
from django.contrib.auth.models import User
from django.db.models import Model, QuerySet

from registry import services
from registry.auth.roles import Role
from registry.failover_codes import FailoverCode
from registry.form_fields import DecimalField, IntegerField, model_formfield
from registry.models import (
    MAX_PROMPT_RETENTION_DAYS,
    Cluster,
    Deployment,
    FailoverEvent,
    Provider,
    RegisteredModel,
    Team,
    Workflow,
)
from registry.services import RATE_LIMIT_MAX, RegistryError
from registry.services.records import rule_validator

M = TypeVar("M", bound=Model)


class ServiceModelForm(forms.ModelForm[M]):
    """A registry object's form: it translates the input, and save() hands the fields to the
    entity's service (`create`, `update`), which checks the rules and writes. The page turns a
    refusal (RegistryError) into a form error (RegistryFormMixin.form_valid); the Django admin,
    which cannot show an error raised while it saves, asks the service's `check` in clean
    (`check_on_clean`, registry.admin)."""

    check_on_clean = False
    # A service's rules on single fields, run as the fields are cleaned (beside their other errors).
    field_checks: ClassVar[dict[str, Callable[[Any], None]]] = {}

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        for name, check in self.field_checks.items():
            if name in self.fields:  # self.fields is this form's own copy
                self.fields[name].validators = [*self.fields[name].validators, rule_validator(check)]

    def create(self, fields: dict[str, Any]) -> M:
        raise NotImplementedError

    def update(self, fields: dict[str, Any]) -> M:
        raise NotImplementedError

    def check(self) -> None:
        """The service's check of `self.instance` as it would be saved."""

    def service_fields(self) -> dict[str, Any]:
        """The model's fields among the form's (not its own inputs, such as credentials)."""
        model_fields = {field.name for field in self.instance._meta.get_fields()}
        return {
            name: self.cleaned_data[name]
            for name in self._meta.fields or ()
            if name in model_fields and name in self.cleaned_data
        }

    def add_refusal(self, exc: RegistryError) -> None:
        """The refusal's messages on their fields (the form as a whole for a field it lacks)."""
        for field, messages in exc.field_errors().items():
            self.add_error(field if field in self.fields else None, messages)

    def full_clean(self) -> None:
        super().full_clean()  # the instance now holds the input (ModelForm's _post_clean)
        if self.check_on_clean and self.is_bound and not self.errors:
            try:
                self.check()
            except RegistryError as exc:
                self.add_refusal(exc)

    def save(self, commit: bool = True) -> M:
        if not commit:
            return super().save(commit=False)
        fields = self.service_fields()
        self.instance = self.create(fields) if self.instance.pk is None else self.update(fields)
        return self.instance


class EndpointListField(forms.CharField):
    """URL prefixes, one a line, as the list Provider.allowed_endpoints stores."""

    widget = forms.Textarea(attrs={"rows": 3})

    def prepare_value(self, value: Any) -> Any:
        if isinstance(value, list):
            return "\n".join(str(v) for v in value)
        return value

    def to_python(self, value: Any) -> list[str]:  # type: ignore[override]
        text = super().to_python(value) or ""
        return [line.strip() for line in str(text).splitlines() if line.strip()]


class ProviderForm(ServiceModelForm[Provider]):
    field_checks = {
        "base_url": services.provider_base_url_check,
        "allowed_endpoints": services.provider_endpoints_check,
    }
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
        fields = list(services.PROVIDER_FIELDS)
        formfield_callback = model_formfield

    def credentials_change(self) -> str | None:
        """'' to clear, a new value to store, None to keep what is stored."""
        if self.cleaned_data.get("clear_credentials"):
            return ""
        value: str = self.cleaned_data.get("credentials") or ""
        return value or None

    def create(self, fields: dict[str, Any]) -> Provider:
        return services.provider_create(credentials=self.credentials_change(), **fields)

    def update(self, fields: dict[str, Any]) -> Provider:
        return services.provider_update(self.instance, credentials=self.credentials_change(), **fields)

    def check(self) -> None:
        services.provider_check(self.instance)


class ClusterForm(ServiceModelForm[Cluster]):
    field_checks = {
        "object_store_url": services.cluster_store_url_check,
        "object_store_endpoint_url": services.cluster_store_endpoint_check,
        "object_store_credentials": services.cluster_store_credentials_check,
    }
    object_store_credentials = forms.CharField(
        required=False,
        strip=False,
        max_length=400,
        label="Object store credentials",
        widget=forms.PasswordInput(render_value=False, attrs={"autocomplete": "new-password"}),
        help_text="ACCESS_KEY_ID:SECRET_ACCESS_KEY. Write-only: stored encrypted and never shown again. "
        "Leave empty to keep the current value.",
    )
    clear_object_store_credentials = forms.BooleanField(
        required=False, label="Clear stored store credentials"
    )

    class Meta:
        model = Cluster
        fields = list(services.CLUSTER_FIELDS)
        formfield_callback = model_formfield

    def credentials_change(self) -> str | None:
        """'' to clear, a new value to store, None to keep what is stored."""
        if self.cleaned_data.get("clear_object_store_credentials"):
            return ""
        value: str = self.cleaned_data.get("object_store_credentials") or ""
        return value or None

    def create(self, fields: dict[str, Any]) -> Cluster:
        return services.cluster_create(object_store_credentials=self.credentials_change(), **fields)

    def update(self, fields: dict[str, Any]) -> Cluster:
        return services.cluster_update(
            self.instance, object_store_credentials=self.credentials_change(), **fields
        )

    def check(self) -> None:
        services.cluster_check(self.instance)


class RegisteredModelForm(ServiceModelForm[RegisteredModel]):
    field_checks = {"artifact_uri": services.registered_model_artifact_uri_check}

    class Meta:
        model = RegisteredModel
        fields = ["slug", "family", "parameter_count", "artifact_uri", "tokenizer", "context_length"]
        formfield_callback = model_formfield

    def create(self, fields: dict[str, Any]) -> RegisteredModel:
        return services.registered_model_create(**fields)

    def update(self, fields: dict[str, Any]) -> RegisteredModel:
        return services.registered_model_update(self.instance, **fields)

    def check(self) -> None:
        services.registered_model_check(self.instance)


class DeploymentForm(ServiceModelForm[Deployment]):
    class Meta:
        model = Deployment
        fields = list(services.DEPLOYMENT_FIELDS)
        formfield_callback = model_formfield

    def create(self, fields: dict[str, Any]) -> Deployment:
        return services.deployment_create(**fields)

    def update(self, fields: dict[str, Any]) -> Deployment:
        return services.deployment_update(self.instance, **fields)

    def check(self) -> None:
        services.deployment_check(self.instance)


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
        """The service's retention rule, asked here because ModelForm's model validation comes
        next and would answer the same rule's check constraint with a bare "Constraint … is
        violated" (the view then creates it through services.workflow_create)."""
        data = super().clean() or {}
        try:
            services.workflow_retention_check(
                retain_prompts=bool(data.get("retain_prompts")),
                prompt_retention_days=data.get("prompt_retention_days"),
            )
        except RegistryError as exc:
            self.add_error(exc.field if exc.field in self.fields else None, str(exc))
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
    """Keep the workflow's gateway prompts for replays (opt-in), for 1..365 days (the days are
    required when prompts are kept: services.workflow_retention_set says so)."""

    retain_prompts = forms.BooleanField(required=False, label="Keep prompts and answers for replays")
    prompt_retention_days = IntegerField(
        required=False, min_value=1, max_value=MAX_PROMPT_RETENTION_DAYS, label="Retention (days)"
    )
    # The response cache (inference.cache): 0 seconds is off.
    response_cache_seconds = IntegerField(
        required=False,
        min_value=0,
        max_value=services.MAX_CACHE_SECONDS,
        initial=0,
        label="Response cache (seconds, 0: off)",
    )
    response_cache_entries = IntegerField(
        required=False,
        min_value=0,
        max_value=services.MAX_CACHE_ENTRIES,
        initial=1000,
        label="Most cached answers",
    )
    # Semantic matching (inference.cache.semantic): empty threshold is exact match only.
    semantic_cache_threshold = DecimalField(
        required=False,
        min_value=services.SEMANTIC_THRESHOLD_RANGE[0],
        max_value=services.SEMANTIC_THRESHOLD_RANGE[1],
        max_digits=5,
        decimal_places=4,
        label="Semantic match from cosine similarity (empty: exact repeats only)",
    )
    semantic_cache_deployment = forms.ModelChoiceField(
        queryset=Deployment.objects.filter(supports_embeddings=True, enabled=True),
        required=False,
        to_field_name="slug",
        label="Embeddings deployment for semantic matching",
    )


class WorkflowChangeForm(ServiceModelForm[Workflow]):
    """A workflow's settings as the Django admin changes them (its route changes through a new
    policy version, on the workflow page or the API)."""

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
            "response_cache_seconds",
            "response_cache_entries",
            "semantic_cache_threshold",
            "semantic_cache_deployment",
        ]
        formfield_callback = model_formfield

    def update(self, fields: dict[str, Any]) -> Workflow:
        return services.workflow_update(self.instance, **fields)

    def check(self) -> None:
        services.workflow_check(self.instance)


class SwitchPrimaryForm(forms.Form):
    deployment = forms.ModelChoiceField(queryset=Deployment.objects.filter(enabled=True))
    reason = forms.CharField(max_length=500)


class ApiTokenLimitsForm(forms.Form):
    """A token's /v1 rate limits (inference.ratelimit.limits); empty means no limit."""

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
