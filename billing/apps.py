from __future__ import annotations

from django.apps import AppConfig


class BillingConfig(AppConfig):
    name = "billing"

    def ready(self) -> None:
        from django.db.models.signals import post_delete, post_save

        # The tasks register in every process, so that sends by name (registry.queues.task_send) find them.
        from billing import tasks  # noqa: F401
        from billing.budgets.targets import budget_cache_clear
        from billing.models import Budget

        for handler in (budget_cache_clear,):
            for signal in (post_save, post_delete):
                signal.connect(
                    handler, sender=Budget, dispatch_uid=f"billing-{handler.__name__}-{id(signal)}"
                )
