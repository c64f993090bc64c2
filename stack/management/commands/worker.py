"""Start a Celery worker for one cluster's queue, or the control worker."""

from __future__ import annotations

import os
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from registry.models import Cluster
from registry.queues import CONTROL_QUEUE, cluster_queue
from registry.worker_signals import WORKER_CLUSTER_ENV, worker_devices
from stack.celery import app


class Command(BaseCommand):
    help = (
        "Run a Celery worker. --cluster SLUG consumes cluster.<slug> and sends heartbeats; "
        "--control runs the syncer and housekeeping."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        target = parser.add_mutually_exclusive_group(required=True)
        target.add_argument("--cluster", help="slug of a registered cluster")
        target.add_argument("--control", action="store_true", help="consume the control queue")
        parser.add_argument(
            "--concurrency",
            type=int,
            default=1,
            help="worker processes (default 1: one process per accelerator group)",
        )
        parser.add_argument("--loglevel", default="info")

    def handle(self, *args: Any, **options: Any) -> None:
        concurrency: int = options["concurrency"]
        if concurrency < 1:
            raise CommandError("--concurrency must be at least 1")
        if options["control"]:
            queue, name = CONTROL_QUEUE, "control@%h"
        else:
            slug: str = options["cluster"]
            if not Cluster.objects.filter(slug=slug).exists():
                raise CommandError(f"no cluster with slug {slug!r} is registered; add it first")
            try:  # the devices it will offer: a bad SWITCHYARD_WORKER_DEVICES stops it here
                worker_devices()
            except ValueError as exc:
                raise CommandError(str(exc)) from None
            queue, name = cluster_queue(slug), f"{slug}@%h"
            os.environ[WORKER_CLUSTER_ENV] = slug
        argv = [
            "worker",
            "--queues",
            queue,
            "--concurrency",
            str(concurrency),
            # A single process needs no pool of children: the solo pool runs
            # tasks in the worker's own process, next to the heartbeat thread.
            "--pool",
            "solo" if concurrency == 1 else "prefork",
            "--hostname",
            name,
            "--loglevel",
            options["loglevel"],
            "--without-gossip",
            "--without-mingle",
        ]
        app.worker_main(argv=argv)
