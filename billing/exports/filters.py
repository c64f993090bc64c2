"""Which ledger rows and formats an export holds: the filters, their form and parser, and the query."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any

from django import forms
from django.db.models import Q, QuerySet

from billing.exports.columns import FORMATS, iso_text
from billing.models import LedgerHead, Unit, UsageRecord
from registry.errors import MultiFieldError
from registry.form_fields import DateTimeField
from registry.models import Cluster, Provider, Workflow

FILTER_FIELDS = (
    "start",
    "end",
    "provider",
    "cluster",
    "workflow",
    "team",
    "api_key",
    "training_run",
    "unit",
    "partition",
)


class ExportFilterError(MultiFieldError, ValueError):
    """Filters that do not describe an export; `errors` maps each field to its messages."""

    def __init__(self, errors: Mapping[str, list[str]]) -> None:
        super().__init__(dict(errors))


@dataclass(frozen=True)
class ExportFilters:
    """Which ledger rows an export holds. Period: start <= occurred_at < end (UTC)."""

    start: datetime | None = None
    end: datetime | None = None
    provider: str = ""  # slugs
    cluster: str = ""
    workflow: str = ""
    team: str = ""
    api_key: str = ""  # an API key's prefix
    training_run: str = ""  # subject_type "training_run" with this subject_id
    unit: str = ""
    partition: str = ""  # one ledger partition; empty: every partition, merged by time
    # The snapshot: each partition's head sequence when the export started, as sorted
    # (partition, sequence) pairs. Later appends, and partitions begun later, are not in it.
    through: tuple[tuple[str, int], ...] | None = None
    # The teams (slugs) whose rows a team-scoped caller may export, sorted; None: every row.
    # Set by the caller's scope, never by a query parameter, and stored with a job so that the
    # job exports what its creator could read.
    teams: tuple[str, ...] | None = None

    def as_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {}
        for name in FILTER_FIELDS:
            value = getattr(self, name)
            if isinstance(value, datetime):
                value = iso_text(value)
            if value not in (None, ""):
                data[name] = value
        if self.through is not None:
            data["through"] = dict(self.through)
        if self.teams is not None:
            data["teams"] = list(self.teams)
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ExportFilters:
        """Filters as stored on a job (already validated when the job was made)."""
        values: dict[str, Any] = {}
        for name in FILTER_FIELDS:
            if data.get(name) not in (None, ""):
                values[name] = data[name]
        for name in ("start", "end"):
            if name in values:
                values[name] = datetime.fromisoformat(values[name])
        through = data.get("through")
        if through is None and data.get("through_sequence") is not None:
            # A job stored before partitions were merged: one partition, one head.
            through = {data.get("partition") or "main": data["through_sequence"]}
        teams = data.get("teams")
        return cls(
            **values,
            through=_through(through) if through is not None else None,
            teams=tuple(sorted(str(t) for t in teams)) if teams is not None else None,
        )

    def team_scope(self) -> frozenset[str] | None:
        """The teams (slugs) whose rows these filters can reach; None: any team's (every row).
        An empty set reaches no team's rows."""
        if self.teams is not None:
            scope = frozenset(self.teams)
            return scope & {self.team} if self.team else scope
        return frozenset({self.team}) if self.team else None

    def for_teams(self, slugs: Iterable[str] | None) -> ExportFilters:
        """These filters limited to the rows of the teams named by `slugs` (None: unchanged)."""
        if slugs is None:
            return self
        return replace(self, teams=tuple(sorted(set(slugs))))

    def pinned(self) -> ExportFilters:
        """These filters with every partition's head fixed, so the export cannot change under us.

        One query reads every head: a consistent snapshot. A row at or below its
        partition's head sequence was committed with that head, so it is visible.
        """
        if self.through is not None:
            return self
        # A partition whose head is still at 0 holds no row (writers make every partition's
        # head up front): it has nothing to export or to verify, so it is not pinned.
        heads = LedgerHead.objects.filter(last_sequence__gt=0).order_by("partition")
        if self.partition:
            heads = heads.filter(partition=self.partition)
        return replace(self, through=_through(dict(heads.values_list("partition", "last_sequence"))))

    def heads(self) -> dict[str, int]:
        """The pinned head sequence of each partition this export covers (pin first)."""
        if self.through is None:
            raise ValueError("the export is not pinned yet")
        return {p: s for p, s in self.through if not self.partition or p == self.partition}

    def file_stem(self) -> str:
        start = f"{self.start:%Y%m%dT%H%M%SZ}" if self.start else "beginning"
        end = f"{self.end:%Y%m%dT%H%M%SZ}" if self.end else "now"
        return f"switchyard-usage-{start}-{end}"


class ExportFilterForm(forms.Form):
    """Validates export filters for the page, the API, the job API and the command alike."""

    start = DateTimeField(required=False, help_text="UTC, inclusive: 2026-05-01 or 2026-05-01T00:00:00Z")
    end = DateTimeField(required=False, help_text="UTC, exclusive")
    provider = forms.ModelChoiceField(
        Provider.objects.order_by("slug"),
        to_field_name="slug",
        required=False,
        empty_label="any provider",
        error_messages={"invalid_choice": "no provider with slug %(value)s"},
    )
    cluster = forms.ModelChoiceField(
        Cluster.objects.order_by("slug"),
        to_field_name="slug",
        required=False,
        empty_label="any cluster",
        error_messages={"invalid_choice": "no cluster with slug %(value)s"},
    )
    workflow = forms.ModelChoiceField(
        Workflow.objects.order_by("slug"),
        to_field_name="slug",
        required=False,
        empty_label="any workflow",
        error_messages={"invalid_choice": "no workflow with slug %(value)s"},
    )
    team = forms.CharField(required=False, max_length=64)
    api_key = forms.RegexField(
        r"^[0-9A-Za-z]{1,16}\Z",
        required=False,
        label="API key prefix",
        error_messages={"invalid": "an API key's prefix: 1 to 16 letters or digits (sy_<prefix>_…)"},
    )
    training_run = forms.CharField(required=False, max_length=64, label="Training run id")
    unit = forms.ChoiceField(
        required=False,
        choices=[("", "any unit"), *Unit.choices],
        error_messages={"invalid_choice": "unknown unit %(value)s; one of " + ", ".join(Unit.values)},
    )
    partition = forms.CharField(
        required=False,
        max_length=32,
        label="Ledger partition",
        help_text="one hash chain only; empty: every partition, merged by time",
    )

    def clean_partition(self) -> str:
        partition: str = self.cleaned_data.get("partition") or ""
        if partition and not LedgerHead.objects.filter(partition=partition).exists():
            raise forms.ValidationError(f"no ledger partition {partition}")
        return partition

    def clean(self) -> dict[str, Any]:
        cleaned: dict[str, Any] = super().clean() or {}
        start, end = cleaned.get("start"), cleaned.get("end")
        if start is not None and end is not None and end <= start:
            self.add_error("end", "end must be after start")
        return cleaned

    def filters(self) -> ExportFilters:
        data = self.cleaned_data
        return ExportFilters(
            start=data["start"].astimezone(UTC) if data.get("start") else None,
            end=data["end"].astimezone(UTC) if data.get("end") else None,
            provider=data["provider"].slug if data.get("provider") else "",
            cluster=data["cluster"].slug if data.get("cluster") else "",
            workflow=data["workflow"].slug if data.get("workflow") else "",
            team=data.get("team") or "",
            api_key=data.get("api_key") or "",
            training_run=data.get("training_run") or "",
            unit=data.get("unit") or "",
            partition=data.get("partition") or "",
        )


def export_filters_parse(*, params: Mapping[str, Any], ignore: Iterable[str] = ()) -> ExportFilters:
    """Filters from query parameters or a JSON object; ExportFilterError names each bad field.

    Unknown names are refused: a misspelt filter must not silently export everything.
    """
    skip = set(ignore)
    unknown = sorted(k for k in params if k not in FILTER_FIELDS and k not in skip)
    form = ExportFilterForm(data={k: params[k] for k in params if k in FILTER_FIELDS})
    valid = form.is_valid()
    errors: dict[str, list[str]] = {name: [str(m) for m in msgs] for name, msgs in form.errors.items()}
    for name in unknown:
        errors[name] = [f"unknown filter; use {', '.join(FILTER_FIELDS)}"]
    if errors or not valid:
        raise ExportFilterError(errors)
    return form.filters()


def export_formats_clean(formats: Sequence[str]) -> list[str]:
    """The formats asked for, de-duplicated in order; ExportFilterError if none or one is unknown."""
    cleaned = list(dict.fromkeys(formats))
    if not cleaned:
        raise ExportFilterError({"formats": ["choose at least one of " + ", ".join(FORMATS)]})
    bad = [f for f in cleaned if f not in FORMATS]
    if bad:
        raise ExportFilterError({"formats": [f"unknown format {bad[0]!r}; one of " + ", ".join(FORMATS)]})
    return cleaned


def _through(heads: Mapping[str, Any]) -> tuple[tuple[str, int], ...]:
    return tuple(sorted((str(p), int(s)) for p, s in heads.items()))


def export_queryset(*, filters: ExportFilters) -> QuerySet[UsageRecord]:
    """The ledger rows an export holds, merged by time: occurred_at, then partition and sequence.

    Within one partition with one occurred_at the order is the chain's; the
    tie-break makes the order total, so every pass of an export reads the same rows
    in the same order.
    """
    rows = UsageRecord.objects.all()
    if filters.partition:
        rows = rows.filter(partition=filters.partition)
    if filters.start is not None:
        rows = rows.filter(occurred_at__gte=filters.start)
    if filters.end is not None:
        rows = rows.filter(occurred_at__lt=filters.end)
    for name in ("provider", "cluster", "workflow"):
        if getattr(filters, name):
            rows = rows.filter(**{f"{name}__slug": getattr(filters, name)})
    if filters.team:
        rows = rows.filter(team=filters.team)
    if filters.teams is not None:
        rows = rows.filter(team__in=filters.teams)
    if filters.api_key:
        rows = rows.filter(api_key__prefix=filters.api_key)
    if filters.training_run:
        rows = rows.filter(subject_type="training_run", subject_id=filters.training_run)
    if filters.unit:
        rows = rows.filter(unit=filters.unit)
    if filters.through is not None:
        snapshot = Q(pk__in=[])  # no partition pinned: no rows
        for partition, sequence in filters.heads().items():
            snapshot |= Q(partition=partition, sequence__lte=sequence)
        rows = rows.filter(snapshot)
    return rows.order_by("occurred_at", "partition", "sequence")
