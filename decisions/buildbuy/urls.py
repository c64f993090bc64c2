"""/api/decisions/… routes of build or buy (stack/urls.py includes them under api/decisions/)."""

from __future__ import annotations

from django.urls import URLPattern, path

from decisions.buildbuy.api import BuildOrBuyView

urlpatterns: list[URLPattern] = [
    path("training-runs/<int:pk>/build-or-buy/", BuildOrBuyView.as_view(), name="build-or-buy"),
]
