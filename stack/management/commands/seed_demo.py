"""Seed the demo stack (idempotent)."""

from __future__ import annotations

import os
import secrets
from typing import Any

from django.core.management.base import BaseCommand
from django.utils import timezone

from stack.demo.seed import demo_stack_seed


class Command(BaseCommand):
    help = "Create the demo providers, clusters, prices, models, deployments, workflow and admin user."

    def handle(self, *args: Any, **options: Any) -> None:
        password = os.environ.get("DEMO_ADMIN_PASSWORD") or secrets.token_urlsafe(12)
        stack = demo_stack_seed(admin_password=password, now=timezone.now())
        self.stdout.write(f"seeded clusters: {', '.join(c.slug for c in stack.clusters)}")
        self.stdout.write(f"admin login: admin / {password}")
