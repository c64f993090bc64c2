"""Server-rendered pages: login, overview, registry, workflows, jobs and tokens."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.utils import timezone

from billing.models import Unit
from billing.services import usage_record
from registry.models import ApiToken, Cluster, Provider, Workflow
from registry.services import provider_set_credentials
from tests.factories import make_cluster, make_deployment, make_provider, make_team, make_user, make_workflow
from training.models import ProbeJob
from training.services import probe_job_create

pytestmark = pytest.mark.django_db

SECRET = "plain-text-credential-123"


def _client(user: User) -> Client:
    client = Client()
    client.force_login(user)
    return client


def _text(response: Any) -> str:
    return response.content.decode()


@pytest.fixture
def stack_with_data(admin_user: User) -> dict[str, Any]:
    """A small stack with something on every page: spend, a job with a curve, a workflow."""
    cluster = make_cluster(slug="rack-a", provider=make_provider(slug="lab", display_name="Lab"))
    usage_record(
        unit=Unit.ACCELERATOR_HOUR,
        quantity=Decimal("2"),
        occurred_at=timezone.now() - timedelta(hours=1),
        idempotency_key="pages:1",
        subject_type="test",
        subject_id="1",
        cluster=cluster,
    )
    job = probe_job_create(cluster=cluster, created_by=admin_user, steps=20)
    ProbeJob.objects.filter(pk=job.pk).update(
        status=ProbeJob.Status.SUCCEEDED, loss_curve=[[1, 5.5], [10, 4.2], [20, 3.9]], final_loss=3.9
    )
    workflow = make_workflow(
        owner=admin_user, slug="support-bot", deployments=[make_deployment(slug="dep-a")]
    )
    return {"cluster": cluster, "job": job, "workflow": workflow}


# --- Login -------------------------------------------------------------------------------------


def test_the_login_page_renders_and_pages_redirect_there_when_logged_out() -> None:
    client = Client()
    page = client.get("/login/")
    assert page.status_code == 200
    assert 'name="username"' in _text(page) and 'name="password"' in _text(page)
    redirect = client.get("/clusters/")
    assert redirect.status_code == 302
    assert redirect["Location"] == "/login/?next=/clusters/"


def test_logging_in_with_the_right_password_opens_the_overview_and_a_wrong_one_does_not() -> None:
    make_user(None, username="ops", password="pw-for-tests-1")
    client = Client()
    response = client.post("/login/", {"username": "ops", "password": "pw-for-tests-1"})
    assert response.status_code == 302
    assert response["Location"] == "/"
    refused = Client().post("/login/", {"username": "ops", "password": "wrong"})
    assert refused.status_code == 200
    assert "Please enter a correct username and password." in _text(refused)


# --- Pages for every role ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "path",
    ["/", "/clusters/", "/providers/", "/models/", "/deployments/", "/workflows/", "/jobs/", "/tokens/"],
)
def test_every_page_renders_for_a_viewer(viewer: User, stack_with_data: dict[str, Any], path: str) -> None:
    response = _client(viewer).get(path)
    assert response.status_code == 200
    assert viewer.username in _text(response)  # the header of a logged-in page


def test_a_user_without_any_role_may_not_see_the_pages() -> None:
    assert _client(make_user(None)).get("/clusters/").status_code == 403


def test_the_overview_draws_spend_per_provider_with_the_bundled_plotly(
    auditor: User, viewer: User, stack_with_data: dict[str, Any]
) -> None:
    html = _text(_client(auditor).get("/"))
    assert '<script src="/assets/plotly.min.js"></script>' in html
    assert "cdn.plot.ly" not in html
    assert 'id="spend-chart"' in html
    assert "lab (USD)" in html  # the provider's trace, from the ledger
    assert "4.00 USD" in html  # 2 accelerator-hours at the factory price of 2.00
    assert 'data-cluster="rack-a"' in html
    assert f"probe #{stack_with_data['job'].pk}" in html
    # A viewer's overview has the clusters and jobs, not the money (registry.auth.roles.can_see_costs).
    html = _text(_client(viewer).get("/"))
    assert 'id="spend-chart"' not in html and "4.00 USD" not in html
    assert 'data-cluster="rack-a"' in html


def test_plotly_js_is_served_from_the_plotly_package() -> None:
    response = Client().get("/assets/plotly.min.js")
    assert response.status_code == 200
    assert response["Content-Type"] == "application/javascript"
    head = b"".join(response.streaming_content)[:2000]
    assert b"plotly.js" in head


def test_the_job_page_draws_the_loss_curve_and_shows_the_bill(
    viewer: User, stack_with_data: dict[str, Any]
) -> None:
    job = stack_with_data["job"]
    response = _client(viewer).get(f"/jobs/{job.pk}/")
    assert response.status_code == 200
    assert 'id="loss-chart"' in _text(response)


def test_the_workflows_list_links_to_the_workflow_page_not_the_api(
    viewer: User, stack_with_data: dict[str, Any]
) -> None:
    html = _text(_client(viewer).get("/workflows/"))
    assert 'href="/workflows/support-bot/"' in html
    assert "/api/workflows/" not in html


# --- Registry forms ------------------------------------------------------------------------------------


def test_registry_lists_link_edit_forms_only_for_writers_but_workflow_pages_for_everyone(
    viewer: User, operator: User
) -> None:
    cluster = make_cluster()
    workflow = make_workflow(owner=operator)
    edit_link = f'href="/clusters/{cluster.slug}/edit/"'
    assert edit_link not in _text(_client(viewer).get("/clusters/"))
    assert edit_link in _text(_client(operator).get("/clusters/"))
    assert f'href="/workflows/{workflow.slug}/"' in _text(_client(viewer).get("/workflows/"))


def test_a_viewer_cannot_open_or_post_the_cluster_form(viewer: User) -> None:
    provider = make_provider()
    client = _client(viewer)
    assert client.get("/clusters/new/").status_code == 403
    response = client.post(
        "/clusters/new/",
        {"provider": provider.pk, "slug": "sneaky", "accelerator_type": "cpu", "accelerator_count": 1,
         "memory_per_node_gb": 0, "capacity_type": "on-demand", "capacity": 1},
    )  # fmt: skip
    assert response.status_code == 403
    assert not Cluster.objects.exists()


def test_an_operator_sees_form_errors_for_a_bad_cluster_and_nothing_is_written(operator: User) -> None:
    provider = make_provider()
    response = _client(operator).post(
        "/clusters/new/",
        {"provider": provider.pk, "slug": "no spaces!", "accelerator_type": "", "accelerator_count": 0,
         "memory_per_node_gb": -1, "capacity_type": "reserved", "capacity": 1},
    )  # fmt: skip
    assert response.status_code in (200, 400)
    html = _text(response)
    assert 'class="errorlist' in html
    assert "This field is required." in html
    assert "Ensure this value is greater than or equal to 1." in html
    assert "Select a valid choice." in html
    assert not Cluster.objects.exists()


def test_an_operator_adds_a_cluster_through_the_form(operator: User) -> None:
    provider = make_provider()
    response = _client(operator).post(
        "/clusters/new/",
        {"provider": provider.pk, "slug": "rack-b", "region": "lab", "accelerator_type": "H100",
         "accelerator_count": 8, "memory_per_node_gb": 640, "capacity_type": "spot", "capacity": 2},
    )  # fmt: skip
    assert response.status_code == 302
    assert response["Location"] == "/clusters/"
    cluster = Cluster.objects.get(slug="rack-b")
    assert (cluster.provider, cluster.accelerator_count, cluster.queue) == (provider, 8, "cluster.rack-b")


def test_only_an_admin_opens_the_provider_forms(operator: User, admin_user: User) -> None:
    make_provider(slug="p")
    assert _client(operator).get("/providers/new/").status_code == 403
    assert _client(operator).get("/providers/p/edit/").status_code == 403
    assert _client(admin_user).get("/providers/p/edit/").status_code == 200


def test_the_provider_edit_page_never_shows_the_stored_credentials(admin_user: User) -> None:
    provider = provider_set_credentials(provider=make_provider(slug="p"), credentials=SECRET)
    client = _client(admin_user)
    html = _text(client.get("/providers/p/edit/"))
    assert SECRET not in html
    assert provider.credentials_encrypted not in html
    assert "Credentials are stored (encrypted)." in html

    # A rejected post does not echo the new secret back either.
    rejected = client.post(
        "/providers/p/edit/",
        {"slug": "p", "display_name": "", "kind": "aws", "credentials": "new-secret-456", "enabled": "on"},
    )
    assert rejected.status_code == 200
    assert "new-secret-456" not in _text(rejected)
    assert SECRET not in _text(rejected)


def test_the_provider_form_stores_replaces_and_clears_credentials(admin_user: User) -> None:
    client = _client(admin_user)
    created = client.post(
        "/providers/new/",
        {"slug": "p", "display_name": "P", "kind": "gcp", "credentials": SECRET, "enabled": "on"},
    )
    assert created.status_code == 302
    provider = Provider.objects.get(slug="p")
    assert provider.has_credentials and SECRET not in provider.credentials_encrypted

    kept = client.post(
        "/providers/p/edit/", {"slug": "p", "display_name": "P2", "kind": "gcp", "enabled": "on"}
    )
    assert kept.status_code == 302
    provider.refresh_from_db()
    assert provider.display_name == "P2" and provider.has_credentials

    client.post(
        "/providers/p/edit/",
        {"slug": "p", "display_name": "P2", "kind": "gcp", "enabled": "on", "clear_credentials": "on"},
    )
    provider.refresh_from_db()
    assert not provider.has_credentials


def test_a_workflow_made_on_its_page_opens_the_workflow_page(operator: User) -> None:
    deployment = make_deployment(slug="dep-a")
    team = make_team("t")
    response = _client(operator).post(
        "/workflows/new/",
        {"slug": "made-here", "team": "t", "description": "", "deployments": [deployment.pk]},
    )
    assert response.status_code == 302
    assert response["Location"] == "/workflows/made-here/"
    made = Workflow.objects.get(slug="made-here")
    assert (made.owner, made.team) == (operator, team)


# --- Jobs ------------------------------------------------------------------------------------------


def test_an_operator_dispatches_a_probe_job_from_the_jobs_page(
    operator: User, django_capture_on_commit_callbacks: Any
) -> None:
    cluster = make_cluster(slug="rack-c")
    with django_capture_on_commit_callbacks() as callbacks:
        response = _client(operator).post("/jobs/", {"cluster": "rack-c", "steps": 20})
    job = ProbeJob.objects.get()
    assert response.status_code == 302
    assert response["Location"] == f"/jobs/{job.pk}/"
    assert (job.cluster, job.steps, job.created_by, job.status) == (cluster, 20, operator, "pending")
    assert len(callbacks) == 1


def test_bad_probe_job_input_on_the_jobs_page_shows_errors_and_dispatches_nothing(operator: User) -> None:
    make_cluster(slug="rack-c")
    response = _client(operator).post("/jobs/", {"cluster": "rack-c", "steps": 5})
    assert response.status_code == 400
    assert "Ensure this value is greater than or equal to 10." in _text(response)
    assert not ProbeJob.objects.exists()


def test_a_viewer_cannot_dispatch_from_the_jobs_page(viewer: User) -> None:
    make_cluster(slug="rack-c")
    client = _client(viewer)
    assert "Dispatch" not in _text(client.get("/jobs/"))
    assert client.post("/jobs/", {"cluster": "rack-c", "steps": 20}).status_code == 403
    assert not ProbeJob.objects.exists()


# --- Tokens ------------------------------------------------------------------------------------------


def test_the_tokens_page_shows_a_new_token_once_and_then_only_its_prefix(viewer: User) -> None:
    client = _client(viewer)
    created = client.post("/tokens/", {"name": "laptop"})
    assert created.status_code == 200
    assert created["Cache-Control"] == "no-store"
    html = _text(created)
    token = ApiToken.objects.get(user=viewer)
    raw = html.split('<code class="secret" id="new-token">', 1)[1].split("</code>", 1)[0]
    assert raw.startswith(f"sy_{token.prefix}_")
    secret = raw.split("_", 2)[2]

    later = _text(client.get("/tokens/"))
    assert f"sy_{token.prefix}_…" in later
    assert secret not in later
    assert 'id="new-token"' not in later


def test_a_token_is_revoked_from_the_tokens_page_by_its_owner_only(viewer: User, operator: User) -> None:
    _client(viewer).post("/tokens/", {"name": "mine"})
    token = ApiToken.objects.get(user=viewer)
    assert _client(operator).post("/tokens/", {"revoke": token.pk}).status_code == 404
    token.refresh_from_db()
    assert token.revoked_at is None
    assert _client(viewer).post("/tokens/", {"revoke": token.pk}).status_code == 302
    token.refresh_from_db()
    assert token.revoked_at is not None


@pytest.mark.parametrize("value", ["abc", "", "1 OR 1=1"])
def test_a_malformed_revoke_on_the_tokens_page_is_404_not_an_error(viewer: User, value: str) -> None:
    _client(viewer).post("/tokens/", {"name": "mine"})
    response = _client(viewer).post("/tokens/", {"revoke": value})
    assert response.status_code == 404
    assert ApiToken.objects.get(user=viewer).revoked_at is None
