"""Create the object store's bucket (s3://) or directory (file://) if missing."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError

from registry.store.objectstore import object_store_ensure_bucket


class Command(BaseCommand):
    help = "Make sure OBJECT_STORE_URL's bucket or directory exists."

    def handle(self, *args: Any, **options: Any) -> None:
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            self.stdout.write(object_store_ensure_bucket())
        except (BotoCoreError, ClientError, OSError) as exc:
            raise CommandError(f"object store not reachable: {exc}") from None
