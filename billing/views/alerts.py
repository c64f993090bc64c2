"""Alert pages under /billing/: the alert channels (with their recent deliveries) and the spend
anomalies, each anomaly with the figures that made it fire."""

from __future__ import annotations

from decimal import Decimal

from django.contrib import messages
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import get_object_or_404, render
from django.urls import reverse
from django.views import View

from billing.alerts import AlertChannelInvalid, alert_channel_save
from billing.alerts.anomalies import BASELINE_DAYS, MAD_TO_SIGMA, MIN_RELATIVE_SPREAD, K
from billing.forms import AlertChannelForm
from billing.models import AlertChannel, AlertDelivery, SpendAnomaly
from registry.auth.principal import principal_of_user
from registry.auth.roles import LEDGER_READERS, OPERATORS
from registry.views import RoleRequiredMixin


class AlertChannelListView(RoleRequiredMixin, View):
    platform_only = True  # channels and anomalies span every team (a team's digest names one)
    read_roles = LEDGER_READERS
    write_roles = OPERATORS

    def get(self, request: HttpRequest) -> HttpResponse:
        return render(
            request,
            "billing/alert_channels.html",
            {
                "channels": AlertChannel.objects.all(),
                "deliveries": AlertDelivery.objects.select_related("channel")[:50],
                "can_write": principal_of_user(request.user).may(OPERATORS, None),
            },
        )


class AlertChannelFormView(RoleRequiredMixin, View):
    platform_only = True  # channels and anomalies span every team (a team's digest names one)
    read_roles = OPERATORS
    write_roles = OPERATORS

    def get(self, request: HttpRequest, pk: int | None = None) -> HttpResponse:
        channel = get_object_or_404(AlertChannel, pk=pk) if pk is not None else AlertChannel()
        return self._render(request, AlertChannelForm(instance=channel), channel)

    def post(self, request: HttpRequest, pk: int | None = None) -> HttpResponse:
        channel = get_object_or_404(AlertChannel, pk=pk) if pk is not None else AlertChannel()
        form = AlertChannelForm(request.POST, instance=channel)
        if form.is_valid():
            try:
                alert_channel_save(
                    channel=form.save(commit=False), url=form.url_change(), secret=form.secret_change()
                )
            except AlertChannelInvalid as exc:
                for name, problems in exc.errors.items():
                    for problem in problems:
                        form.add_error(name if name in form.fields else None, problem)
            else:
                messages.success(request, f"Alert channel {channel.name} saved.")
                return HttpResponseRedirect(reverse("billing-alert-channels"))
        return self._render(request, form, channel, status=400)

    def _render(
        self, request: HttpRequest, form: AlertChannelForm, channel: AlertChannel, status: int = 200
    ) -> HttpResponse:
        response = render(
            request,
            "billing/alert_channel_form.html",
            {
                "form": form,
                "channel": channel,
                "title": "Edit alert channel" if channel.pk else "New alert channel",
            },
            status=status,
        )
        response["Cache-Control"] = "no-store"
        return response


class SpendAnomalyListView(RoleRequiredMixin, View):
    platform_only = True  # channels and anomalies span every team (a team's digest names one)
    read_roles = LEDGER_READERS

    def get(self, request: HttpRequest) -> HttpResponse:
        return render(request, "billing/anomalies.html", {"anomalies": SpendAnomaly.objects.all()[:200]})


class SpendAnomalyDetailView(RoleRequiredMixin, View):
    platform_only = True  # channels and anomalies span every team (a team's digest names one)
    read_roles = LEDGER_READERS

    def get(self, request: HttpRequest, pk: int) -> HttpResponse:
        anomaly = get_object_or_404(SpendAnomaly, pk=pk)
        spread = max(MAD_TO_SIGMA * anomaly.mad, MIN_RELATIVE_SPREAD * anomaly.median)
        return render(
            request,
            "billing/anomaly_detail.html",
            {
                "anomaly": anomaly,
                "baseline": [(day, Decimal(total)) for day, total in anomaly.baseline],
                "baseline_days": BASELINE_DAYS,
                "k": K,
                "mad_to_sigma": MAD_TO_SIGMA,
                "min_relative_spread": MIN_RELATIVE_SPREAD,
                "spread": spread,
                "floor_used": spread != MAD_TO_SIGMA * anomaly.mad,
                "modified_z": (anomaly.rate - anomaly.median) / spread if spread else None,
            },
        )
