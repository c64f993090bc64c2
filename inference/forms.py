"""Forms of the inference pages (inference.views): the chaos drill and an eval run."""

from __future__ import annotations

from typing import Any

from django import forms

from inference.models import EvalSet
from registry.form_fields import FloatField
from registry.models import Deployment, Workflow


class ChaosForm(forms.Form):
    """The failover drill: inject errors into one deployment of the route."""

    deployment = forms.ModelChoiceField(queryset=Deployment.objects.none())
    enabled = forms.BooleanField(required=False, label="Drill on")
    error_rate = FloatField(min_value=0.0, max_value=1.0, initial=0.0, label="Error rate (0..1)")

    def __init__(self, *args: Any, deployments: list[Deployment], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        field: Any = self.fields["deployment"]  # a ModelChoiceField (declared above)
        field.queryset = Deployment.objects.filter(pk__in=[d.pk for d in deployments]).order_by("slug")


class EvalRunForm(forms.Form):
    """Run one of the workflow's eval sets against one deployment of its route, now."""

    eval_set = forms.ModelChoiceField(queryset=EvalSet.objects.none())
    deployment = forms.ModelChoiceField(queryset=Deployment.objects.none())

    def __init__(self, *args: Any, workflow: Workflow, deployments: list[Deployment], **kwargs: Any) -> None:
        kwargs.setdefault("prefix", "eval")  # its field names do not clash with the chaos form's
        super().__init__(*args, **kwargs)
        sets: Any = self.fields["eval_set"]  # ModelChoiceFields (declared above)
        sets.queryset = EvalSet.objects.filter(workflow=workflow).order_by("name")
        targets: Any = self.fields["deployment"]
        targets.queryset = Deployment.objects.filter(pk__in=[d.pk for d in deployments]).order_by("slug")
