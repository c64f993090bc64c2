"""Registry pages: providers, clusters, models, deployments, and workflows
(the API keys page, /tokens/, is stack.keys_page)."""

from __future__ import annotations

from django.urls import URLPattern, path

from registry import failover_views, views
from registry.models import Workflow

urlpatterns: list[URLPattern] = [
    path("failovers/", failover_views.FailoverEventListView.as_view(), name="failovers"),
    path(
        "workflows/",
        views.RegistryListView.as_view(
            model=Workflow,
            title="Workflows",
            columns=[("slug", "Slug"), ("owner", "Owner"), ("team", "Team"), ("description", "Description")],
            create_url_name="workflows-new",
            edit_url_name="workflow-page",
            link_needs_write=False,
        ),
        name="workflows",
    ),
    path("workflows/new/", views.WorkflowCreateView.as_view(), name="workflows-new"),
    # Not "workflow-detail": the API router already names /api/workflows/<slug>/ so.
    path("workflows/<slug:slug>/", views.WorkflowDetailView.as_view(), name="workflow-page"),
]

_SPECIAL_FORMS = {"providers": (views.ProviderCreateView, views.ProviderUpdateView)}

for name, page in views.REGISTRY_PAGES.items():
    create_view, update_view = _SPECIAL_FORMS.get(name, (views.RegistryCreateView, views.RegistryUpdateView))
    title = name.capitalize()
    urlpatterns += [
        path(
            f"{name}/",
            views.RegistryListView.as_view(
                model=page["model"],
                title=title,
                columns=page["columns"],
                create_url_name=f"{name}-new",
                edit_url_name=f"{name}-edit",
            ),
            name=name,
        ),
        path(
            f"{name}/new/",
            create_view.as_view(
                model=page["model"], form_class=page["form"], title=f"New {name[:-1]}", success_url_name=name
            ),
            name=f"{name}-new",
        ),
        path(
            f"{name}/<slug:slug>/edit/",
            update_view.as_view(
                model=page["model"], form_class=page["form"], title=f"Edit {name[:-1]}", success_url_name=name
            ),
            name=f"{name}-edit",
        ),
    ]
