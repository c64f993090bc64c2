from __future__ import annotations

from django.apps import AppConfig


class BillingConfig(AppConfig):
    name = "billing"

    def ready(self) -> None:
        from django.db.models.signals import post_delete, post_save

        from billing.budgets.admission import admission_cache_clear
        from billing.budgets.targets import budget_cache_clear
        from billing.models import Budget, BudgetPeriod

        for handler in (budget_cache_clear, admission_cache_clear):
            for signal in (post_save, post_delete):
                signal.connect(
                    handler, sender=Budget, dispatch_uid=f"billing-{handler.__name__}-{id(signal)}"
                )
        # A period reset or removed by hand: forget what this process knew of it.
        post_delete.connect(admission_cache_clear, sender=BudgetPeriod, dispatch_uid="billing-period-deleted")
