"""The project's URL map: every app's pages and API, the gateway, admin and health."""

from __future__ import annotations

from django.conf import settings
from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import include, path
from rest_framework.routers import APIRootView, DefaultRouter

from billing import api as billing_api
from billing.api import UsageExportView
from billing.views.exports import export_public_keys_view
from decisions.recommendations import api as recommendation_api
from decisions.replay import api as decisions_api
from inference import api as inference_api
from registry.api import viewsets as registry_api
from registry.api.permissions import RolePermission
from registry.api.schema import SchemaView
from registry.audit import api as audit_api
from stack import keys_page, views
from stack.metrics import metrics_view
from training import api as training_api
from training.urls import probe_urlpatterns


class _APIRootView(APIRootView):
    """The list of endpoints: no team's rows, so team members read it as well."""

    shared_with_teams = True


class _Router(DefaultRouter):
    APIRootView = _APIRootView


router = _Router()
registry_api.register(router)
billing_api.register(router)
training_api.register(router)
inference_api.register(router)
audit_api.register(router)
recommendation_api.register(router)
decisions_api.register(router)

urlpatterns = [
    path("", views.OverviewView.as_view(), name="overview"),
    path(
        "login/",
        auth_views.LoginView.as_view(extra_context={"sso_enabled": settings.OIDC_ENABLED}),
        name="login",
    ),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("assets/plotly.min.js", views.plotly_js, name="plotly-js"),
    path("healthz", views.healthz, name="healthz"),
    # Prometheus scrapes: a bearer token and/or allowed networks (stack.metrics), not roles.
    path("metrics", metrics_view, name="metrics"),
    path("teams/", views.TeamListView.as_view(), name="teams"),
    path("teams/<slug:slug>/", views.TeamDetailView.as_view(), name="team-page"),
    # The public keys that verify export manifests (no login: they are public).
    path(".well-known/switchyard-export-keys.json", export_public_keys_view, name="export-public-keys"),
    path("tokens/", keys_page.TokenView.as_view(), name="tokens"),
    path("", include("registry.urls")),
    path("jobs/", include(probe_urlpatterns)),
    path("billing/", include("billing.urls")),
    path("training/", include("training.urls")),
    path("inference/", include("inference.urls")),
    path("audit/", include("registry.audit.urls")),
    path("decisions/", include("decisions.urls")),
    # OpenAI-compatible gateway: `model` names a workflow (inference.gateway.views).
    path("v1/", include("inference.gateway.urls")),
    path("admin/", admin.site.urls),
    # drf-spectacular serves the schema to anyone by default; like every other
    # /api/ call it needs a token or a session (401 without).
    path("api/schema/", SchemaView.as_view(permission_classes=[RolePermission]), name="schema"),
    path("api/usage-export/", UsageExportView.as_view(), name="usage-export"),
    path("api/decisions/", include("decisions.buildbuy.urls")),
    path("api/", include(router.urls)),
]
if settings.OIDC_ENABLED:
    # Single sign-on (registry.auth.sso): /oidc/authenticate/ starts it, /oidc/callback/ ends it.
    urlpatterns.append(path("oidc/", include("mozilla_django_oidc.urls")))
