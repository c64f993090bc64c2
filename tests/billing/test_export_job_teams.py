"""Which export jobs a caller lists: a team-scoped caller those whose teams are all among the
teams where it reads the ledger; a job of every row, or of no team, only platform-wide callers.
The same on SQLite and PostgreSQL (run with and without DATABASE_URL), in the API and the pages."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse

from billing.exports import ExportFilters, export_job_create
from billing.models import ExportJob
from registry.auth.roles import Role
from tests.factories import api_client, make_member, make_team, make_user

pytestmark = pytest.mark.django_db


@pytest.fixture
def jobs(settings: Any, tmp_path: Path, django_capture_on_commit_callbacks: Any) -> dict[str, ExportJob]:
    settings.OBJECT_STORE_URL = f"file://{tmp_path}"
    make_team("alpha"), make_team("bravo")
    platform = make_user(Role.ADMIN)

    def job(filters: ExportFilters) -> ExportJob:
        with django_capture_on_commit_callbacks(execute=False):  # listed, not run
            return export_job_create(created_by=platform, filters=filters, formats=["csv"])

    return {
        "alpha": job(ExportFilters().for_teams(["alpha"])),
        "alpha+bravo": job(ExportFilters().for_teams(["alpha", "bravo"])),
        "no team": job(ExportFilters().for_teams([])),  # `teams: []`: reaches no team's rows
        "every row": job(ExportFilters()),
        "alpha filter": job(ExportFilters(team="alpha")),  # the platform's, of alpha's rows only
        "bravo filter in alpha scope": job(ExportFilters(team="bravo").for_teams(["alpha"])),
    }


def _listed(client: Any) -> set[int]:
    response = client.get("/api/export-jobs/")
    assert response.status_code == 200, response.content
    return {row["id"] for row in response.json()["results"]}


def _ids(jobs: dict[str, ExportJob], *names: str) -> set[int]:
    return {jobs[name].pk for name in names}


def test_a_team_member_lists_only_jobs_whose_teams_are_all_its_own(jobs: dict[str, ExportJob]) -> None:
    member = make_member("alpha", Role.ADMIN)
    assert _listed(api_client(member)) == _ids(jobs, "alpha", "alpha filter")


def test_a_member_of_both_teams_lists_their_jobs_but_never_the_platforms(jobs: dict[str, ExportJob]) -> None:
    member = make_member("alpha", Role.AUDITOR)
    make_member("bravo", Role.AUDITOR, user=member)
    assert _listed(api_client(member)) == _ids(jobs, "alpha", "alpha+bravo", "alpha filter")


def test_a_platform_wide_caller_lists_every_job(jobs: dict[str, ExportJob]) -> None:
    assert _listed(api_client(make_user(Role.AUDITOR))) == {job.pk for job in jobs.values()}


def test_a_team_role_that_reads_no_ledger_lists_nothing_of_that_team(jobs: dict[str, ExportJob]) -> None:
    member = make_member("alpha", Role.ADMIN)
    make_member("bravo", Role.VIEWER, user=member)  # a viewer of bravo reads none of its ledger
    client = Client()
    client.force_login(member)
    page = client.get(reverse("billing-export"))
    assert page.status_code == 200
    listed = {job.pk for job in page.context["jobs"]}
    assert listed == _ids(jobs, "alpha", "alpha filter")
    assert client.get(reverse("billing-export-job", args=[jobs["alpha+bravo"].pk])).status_code == 404
    assert client.get(reverse("billing-export-job", args=[jobs["no team"].pk])).status_code == 404
    assert client.get(reverse("billing-export-job", args=[jobs["alpha"].pk])).status_code == 200


def test_a_job_remembers_its_teams_in_a_column_not_only_in_its_filters(jobs: dict[str, ExportJob]) -> None:
    teams = {name: sorted(job.teams.values_list("slug", flat=True)) for name, job in jobs.items()}
    assert teams == {
        "alpha": ["alpha"],
        "alpha+bravo": ["alpha", "bravo"],
        "no team": [],
        "every row": [],
        "alpha filter": ["alpha"],
        "bravo filter in alpha scope": [],
    }


def test_an_api_job_of_a_team_member_is_listed_to_it(
    settings: Any, tmp_path: Path, django_capture_on_commit_callbacks: Any
) -> None:
    settings.OBJECT_STORE_URL = f"file://{tmp_path}"
    member: User = make_member("alpha", Role.ADMIN)
    client = api_client(member)
    with django_capture_on_commit_callbacks(execute=False):
        made = client.post("/api/export-jobs/", {"formats": ["csv"]}, format="json")
    assert made.status_code == 201, made.content
    assert _listed(client) == {made.json()["id"]}
    assert _listed(api_client(make_member("bravo", Role.ADMIN))) == set()
