from __future__ import annotations

from django.apps import AppConfig


class BillingConfig(AppConfig):
    name = "billing"

    def ready(self) -> None:
        from django.db.models.signals import post_delete, post_save

        from billing.budgets.targets import budget_cache_clear
        from billing.models import Budget

        for handler in (budget_cache_clear,):
            for signal in (post_save, post_delete):
                signal.connect(
                    handler, sender=Budget, dispatch_uid=f"billing-{handler.__name__}-{id(signal)}"
                )
