"""The auditors' filters, one form for the page, the API and the CSV export."""

from __future__ import annotations

from typing import Any

from django import forms

from registry.audit.origin import Surface
from registry.audit.registration import object_types
from registry.form_fields import DateTimeField


class AuditFilterForm(forms.Form):
    object_type = forms.ChoiceField(required=False, choices=())
    object_id = forms.CharField(required=False, max_length=255, help_text="the object's primary key")
    actor = forms.CharField(
        required=False, max_length=150, help_text='a user name, "command:<name>", "task:<name>"'
    )
    surface = forms.ChoiceField(required=False, choices=[("", "any"), *Surface.choices])
    since = DateTimeField(required=False, help_text="UTC, inclusive")
    until = DateTimeField(required=False, help_text="UTC, exclusive")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fields["object_type"].choices = [("", "any"), *object_types()]  # type: ignore[attr-defined]

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        if data.get("object_id") and not data.get("object_type"):
            self.add_error("object_id", "name the object type too")
        if data.get("since") and data.get("until") and data["since"] >= data["until"]:
            self.add_error("until", "must be after since")
        return data


FILTER_NAMES = tuple(AuditFilterForm.base_fields)
