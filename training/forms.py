"""Training forms: the probe-job form, and the run launch form (a YAML/JSON config plus a few
simple fields that override it)."""

from __future__ import annotations

from typing import Any

import yaml
from django import forms
from django.db.models import QuerySet

from registry.form_fields import DecimalField, IntegerField
from registry.models import Cluster, Team
from registry.validation import InputError, config_parse
from training.run_config import MONEY_DECIMAL_PLACES, MONEY_MAX_DIGITS, demo_config


def example_config_text() -> str:
    return yaml.safe_dump(demo_config(), sort_keys=False)


class TrainingRunForm(forms.Form):
    name = forms.CharField(max_length=128)
    config = forms.CharField(
        widget=forms.Textarea(attrs={"rows": 22, "cols": 80, "spellcheck": "false"}),
        help_text="YAML or JSON; anything left out takes its default.",
    )
    learners = IntegerField(required=False, min_value=1, help_text="Overrides learners.count.")
    outer_steps = IntegerField(required=False, min_value=1, help_text="Replaces the stop condition.")
    money_budget = DecimalField(
        required=False,
        min_value=0,
        max_digits=MONEY_MAX_DIGITS,
        decimal_places=MONEY_DECIMAL_PLACES,
        help_text="Overrides money_budget.",
    )
    team = forms.ModelChoiceField(
        queryset=Team.objects.none(),
        to_field_name="slug",
        required=False,
        help_text="The team that owns the run (overrides the config's team).",
        error_messages={"invalid_choice": "no team %(value)s that you operate"},
    )

    def __init__(
        self, *args: Any, teams: QuerySet[Team] | None = None, team_required: bool = False, **kwargs: Any
    ) -> None:
        """`teams`: those the author operates; a team-scoped author must pick one of them."""
        super().__init__(*args, **kwargs)
        field: Any = self.fields["team"]
        field.queryset = teams if teams is not None else Team.objects.all()
        field.required = team_required
        field.empty_label = None if team_required else "none (a platform run)"

    def clean_config(self) -> dict[str, Any]:
        text = self.cleaned_data["config"]
        try:
            # JSON is a subset of YAML 1.2, but the JSON parser gives the clearer message for JSON
            # input; both are bounded (size, depth, finite numbers: registry.validation).
            parsed = config_parse(text)
        except InputError as exc:
            where = f" at {exc.field}" if exc.field else ""
            raise forms.ValidationError(f"not valid YAML or JSON{where}: {exc}") from exc
        if parsed is None:
            parsed = {}
        if not isinstance(parsed, dict):
            raise forms.ValidationError("the config must be a mapping")
        return parsed

    def run_config(self) -> dict[str, Any]:
        """The config with the simple fields applied on top."""
        cfg: dict[str, Any] = dict(self.cleaned_data["config"])
        if self.cleaned_data.get("learners"):
            cfg["learners"] = {**(cfg.get("learners") or {}), "count": self.cleaned_data["learners"]}
        if self.cleaned_data.get("outer_steps"):
            # Replaces any token_budget: the config takes exactly one stop condition.
            cfg["stop"] = {"outer_steps": self.cleaned_data["outer_steps"]}
        if self.cleaned_data.get("money_budget") is not None:
            cfg["money_budget"] = str(self.cleaned_data["money_budget"])
        team = self.cleaned_data.get("team")
        if team is not None:
            cfg["team"] = team.slug
        return cfg

    def add_config_errors(self, errors: dict[str, list[str]]) -> None:
        """RunConfigError field messages: `name` on its field, the rest on the config box."""
        simple = {
            "learners.count": "learners",
            "stop.outer_steps": "outer_steps",
            "money_budget": "money_budget",
            "team": "team",
        }
        for path, messages in errors.items():
            for message in messages:
                if path == "name":
                    self.add_error("name", message)
                elif path in simple and self.cleaned_data.get(simple[path]) not in (None, ""):
                    self.add_error(simple[path], f"{path}: {message}")
                else:
                    self.add_error("config", f"{path}: {message}")


class ProbeJobForm(forms.Form):
    cluster = forms.ModelChoiceField(queryset=Cluster.objects.all(), to_field_name="slug")
    steps = IntegerField(min_value=10, max_value=5000, initial=300)
