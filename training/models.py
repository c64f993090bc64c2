"""Training: probe jobs and DiLoCo training runs across registered clusters.

TrainingRun (one multi-cluster Decoupled DiLoCo job)
  config            the validated, normalised config (what training.run_config.run_config_validate returns)
  state             pending → placing → running ⇄ recovering → succeeded | failed | cancelled |
                    budget_exhausted (TRANSITIONS below is the whole graph; every change goes
                    through TrainingRun.transition(), which writes a TrainingRunTransition row)
  state_changed_at  when the state last changed; `reason` says why (human-readable)
  started_at        first time the run reached `running`; finished_at when it reached a final state
  money_budget      Decimal or null (no limit), in `currency`; spend comes from the ledger
                    (subject_type "training_run", subject_id str(run.pk)), never stored here
  registered_model  the stack RegisteredModel made from the final parameters (succeeded runs)
  initial_eval_loss / final_eval_loss   eval loss of the global parameters at version 0 / at the end
  syncer_seen_at    last time a syncer tick ran for the run (the supervisor re-kicks a silent syncer)
  artifact_uri      where the final (or, for budget_exhausted, last checkpoint) parameters are

TrainingLearner (one of the run's M learners; one row per learner index)
  cluster, generation (bumped on every re-placement: chunk messages of an older generation are
  no-ops), state placed/running/lost/done/released, tokens and steps trained (all generations),
  last_report_at (last finished chunk), worker_hostname, tokens_at_last_push (for tokens_lost).

PlacementDecision    why learner i (generation g) went to a cluster: reason initial/pinned/failover,
                     the unit price and PriceBook that drove it, every candidate considered.
LearnerChunk         (learner, generation, seq) unique: one Celery task's worth of inner steps
                     (the idempotency and billing unit; UsageRecord key
                     "training_run:<run>/learner:<i>/g<gen>/c<seq>").
GlobalVersionRecord  (run, fragment, version) unique: one published global version, recorded once
                     by the syncer with the run's cost so far; the eval loss of the global
                     parameters is filled in by the evaluator, on a cluster's queue.
ModelVersion         one version of the run's RegisteredModel: the global parameters at every
                     k-th global version (config `register_every_versions`) and the final ones,
                     (run, key) unique so a re-run syncer registers a version once; eval loss,
                     tokens and cost so far; where its weights are (a switchyard artifact, or an
                     open-weights directory). TrainingRun.started_from names the version a run
                     started from: the lineage, as real foreign keys both ways.
"""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal

from django.conf import settings
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models, transaction
from django.utils import timezone

from registry.models import Cluster, RegisteredModel, Team


class ProbeJob(models.Model):
    """A short real torch job that proves a cluster's dispatch, health and billing."""

    class Status(models.TextChoices):
        PENDING = "pending", "Pending"
        RUNNING = "running", "Running"
        SUCCEEDED = "succeeded", "Succeeded"
        FAILED = "failed", "Failed"

    cluster = models.ForeignKey(Cluster, on_delete=models.PROTECT, related_name="probe_jobs")
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+"
    )
    steps = models.PositiveIntegerField(
        default=300, validators=[MinValueValidator(10), MaxValueValidator(5000)]
    )
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.PENDING)
    created_at = models.DateTimeField(default=timezone.now, editable=False)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    attempts = models.PositiveIntegerField(default=0)
    worker_hostname = models.CharField(max_length=255, blank=True)
    device = models.CharField(max_length=16, blank=True)
    loss_curve = models.JSONField(default=list, blank=True)  # [[step, loss], ...]
    final_loss = models.FloatField(null=True, blank=True)
    accelerator_seconds = models.DecimalField(max_digits=18, decimal_places=3, default=Decimal("0"))
    error = models.TextField(blank=True)

    class Meta:
        ordering = ["-created_at"]
        indexes = [
            # Overview's "recent jobs" and the jobs page.
            models.Index(fields=["-created_at"], name="probe_recent_idx"),
        ]

    def __str__(self) -> str:
        return f"probe #{self.pk} on {self.cluster.slug} ({self.status})"

    @property
    def is_finished(self) -> bool:
        return self.status in (self.Status.SUCCEEDED, self.Status.FAILED)


class InvalidTransition(ValueError):
    """A state change the run's graph does not allow."""


class TrainingRun(models.Model):
    class State(models.TextChoices):
        PENDING = "pending", "Pending"
        PLACING = "placing", "Placing"
        RUNNING = "running", "Running"
        RECOVERING = "recovering", "Recovering"
        SUCCEEDED = "succeeded", "Succeeded"
        FAILED = "failed", "Failed"
        CANCELLED = "cancelled", "Cancelled"
        BUDGET_EXHAUSTED = "budget_exhausted", "Budget exhausted"

    name = models.CharField(max_length=128)
    config = models.JSONField(default=dict)
    state = models.CharField(max_length=20, choices=State.choices, default=State.PENDING)
    state_changed_at = models.DateTimeField(default=timezone.now)
    reason = models.CharField(max_length=1000, blank=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(default=timezone.now, editable=False)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    money_budget = models.DecimalField(max_digits=20, decimal_places=9, null=True, blank=True)
    currency = models.CharField(max_length=3, default="USD")
    # The team that owns the run (its config's `team`): its members see it, its team budgets
    # count and stop it, and its chunk bills carry the team. None: a platform run.
    team = models.ForeignKey(
        Team, null=True, blank=True, on_delete=models.PROTECT, related_name="training_runs"
    )
    registered_model = models.ForeignKey(
        RegisteredModel, null=True, blank=True, on_delete=models.SET_NULL, related_name="training_runs"
    )
    artifact_uri = models.CharField(max_length=512, blank=True)
    started_from = models.ForeignKey(
        "ModelVersion", null=True, blank=True, on_delete=models.PROTECT, related_name="runs_started"
    )
    initial_eval_loss = models.FloatField(null=True, blank=True)
    final_eval_loss = models.FloatField(null=True, blank=True)
    syncer_seen_at = models.DateTimeField(null=True, blank=True)
    # The syncer re-enqueues itself; only the chain holding this token goes on, so a chain the
    # supervisor restarted never runs beside the old one.
    syncer_token = models.CharField(max_length=32, blank=True)
    # Bytes of the run's objects in the store (versions, deltas, checkpoints, exports), as the
    # last retention sweep listed them (training.services.retention); None before the first.
    store_bytes = models.BigIntegerField(null=True, blank=True)
    # Version evaluation runs on a cluster's queue, one evaluator per run at a time
    # (training.services.evaluation): it holds the run until this instant, renewed per version;
    # a lapsed hold (a lost task) lets the next syncer tick send another.
    evaluator_until = models.DateTimeField(null=True, blank=True)
    # Where the evaluator was last sent (a cluster slug, or "control" when no cluster was live),
    # and the token of the one that holds the run: only it renews and releases the hold.
    evaluator_queue = models.CharField(max_length=80, blank=True)
    evaluator_token = models.CharField(max_length=32, blank=True)

    LIVE_STATES = (State.PLACING, State.RUNNING, State.RECOVERING)
    FINAL_STATES = (State.SUCCEEDED, State.FAILED, State.CANCELLED, State.BUDGET_EXHAUSTED)
    # The whole state graph: running ⇄ recovering while learners are lost and re-placed.
    TRANSITIONS: dict[str, frozenset[str]] = {
        State.PENDING: frozenset({State.PLACING, State.FAILED, State.CANCELLED}),
        State.PLACING: frozenset({State.RUNNING, State.FAILED, State.CANCELLED}),
        State.RUNNING: frozenset(
            {State.RECOVERING, State.SUCCEEDED, State.FAILED, State.CANCELLED, State.BUDGET_EXHAUSTED}
        ),
        State.RECOVERING: frozenset(
            {State.RUNNING, State.SUCCEEDED, State.FAILED, State.CANCELLED, State.BUDGET_EXHAUSTED}
        ),
        State.SUCCEEDED: frozenset(),
        State.FAILED: frozenset(),
        State.CANCELLED: frozenset(),
        State.BUDGET_EXHAUSTED: frozenset(),
    }

    class Meta:
        ordering = ["-created_at"]
        indexes = [
            # The supervisor scans live runs every few seconds; the runs page lists by state.
            models.Index(fields=["state"], name="trainrun_state_idx"),
        ]

    def __str__(self) -> str:
        return f"run #{self.pk} {self.name} ({self.state})"

    @property
    def team_slug(self) -> str:
        """The slug its ledger rows and team budgets name: the owning team's (the config's
        `team` for a run stored before runs had a team row)."""
        team = self.team
        if team is not None:
            return team.slug
        return str((self.config or {}).get("team") or "")

    @property
    def is_finished(self) -> bool:
        return self.state in self.FINAL_STATES

    @classmethod
    def allowed(cls, old: str, new: str) -> bool:
        return new in cls.TRANSITIONS.get(old, frozenset())

    def transition(self, new: str, *, reason: str = "", now: datetime | None = None) -> TrainingRunTransition:
        """Move to `new` if the graph allows it from the state in the database.

        The row is locked and re-read so that two processes (a chunk seeing a spent budget and
        the syncer finishing the run) cannot both win; the loser gets InvalidTransition.
        """
        at = now if now is not None else timezone.now()
        with transaction.atomic():
            current = TrainingRun.objects.select_for_update().only("state").get(pk=self.pk).state
            if not self.allowed(current, new):
                self.state = current
                raise InvalidTransition(f"run {self.pk}: {current} → {new} is not allowed")
            fields = {"state": new, "state_changed_at": at, "reason": reason[:1000]}
            if new == self.State.RUNNING and self.started_at is None:
                fields["started_at"] = at
            if new in self.FINAL_STATES:
                fields["finished_at"] = at
            TrainingRun.objects.filter(pk=self.pk).update(**fields)
            for k, v in fields.items():
                setattr(self, k, v)
            return TrainingRunTransition.objects.create(
                run=self, from_state=current, to_state=new, at=at, reason=reason[:1000]
            )


class TrainingRunTransition(models.Model):
    """One state change of a run (append-only; the run page's timeline)."""

    run = models.ForeignKey(TrainingRun, on_delete=models.CASCADE, related_name="transitions")
    from_state = models.CharField(max_length=20)
    to_state = models.CharField(max_length=20)
    at = models.DateTimeField()
    reason = models.CharField(max_length=1000, blank=True)

    class Meta:
        ordering = ["run", "at", "id"]

    def __str__(self) -> str:
        return f"run #{self.run_id}: {self.from_state} → {self.to_state}"


class TrainingLearner(models.Model):
    class State(models.TextChoices):
        PLACED = "placed", "Placed"
        RUNNING = "running", "Running"
        LOST = "lost", "Lost"
        DONE = "done", "Done"
        RELEASED = "released", "Released"

    run = models.ForeignKey(TrainingRun, on_delete=models.CASCADE, related_name="learners")
    index = models.PositiveIntegerField()
    cluster = models.ForeignKey(Cluster, null=True, blank=True, on_delete=models.PROTECT, related_name="+")
    generation = models.PositiveIntegerField(default=0)
    state = models.CharField(max_length=16, choices=State.choices, default=State.PLACED)
    state_changed_at = models.DateTimeField(default=timezone.now)
    tokens = models.BigIntegerField(default=0)
    steps = models.BigIntegerField(default=0)
    # Tokens trained up to this learner's last pushed delta: the failover's tokens_lost is
    # `tokens - tokens_at_last_push` (work that never reached the syncer).
    tokens_at_last_push = models.BigIntegerField(default=0)
    last_push_at = models.DateTimeField(null=True, blank=True)
    last_report_at = models.DateTimeField(null=True, blank=True)
    worker_hostname = models.CharField(max_length=255, blank=True)
    last_error = models.TextField(blank=True)

    class Meta:
        ordering = ["run", "index"]
        constraints = [models.UniqueConstraint(fields=["run", "index"], name="uniq_learner_index")]
        indexes = [
            # Placement counts learners occupying each cluster across live runs.
            models.Index(fields=["cluster", "state"], name="learner_cluster_state_idx"),
        ]

    def __str__(self) -> str:
        return f"run #{self.run_id} learner {self.index} g{self.generation}"


class PlacementDecision(models.Model):
    class Reason(models.TextChoices):
        INITIAL = "initial", "Initial"
        PINNED = "pinned", "Pinned"
        FAILOVER = "failover", "Failover"

    run = models.ForeignKey(TrainingRun, on_delete=models.CASCADE, related_name="placements")
    learner_index = models.PositiveIntegerField()
    generation = models.PositiveIntegerField()
    cluster = models.ForeignKey(Cluster, on_delete=models.PROTECT, related_name="+")
    reason = models.CharField(max_length=16, choices=Reason.choices)
    unit_price = models.DecimalField(max_digits=24, decimal_places=9, null=True, blank=True)
    currency = models.CharField(max_length=3, default="USD")
    price_book = models.ForeignKey(
        "billing.PriceBook", null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    # Every cluster considered: [{"cluster", "price", "status", "free", "rejected": why or ""}]
    candidates = models.JSONField(default=list)
    decided_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["run", "decided_at", "id"]
        constraints = [
            models.UniqueConstraint(
                fields=["run", "learner_index", "generation"], name="uniq_placement_per_generation"
            )
        ]

    def __str__(self) -> str:
        return f"run #{self.run_id} learner {self.learner_index} g{self.generation} → {self.cluster_id}"


class LearnerChunk(models.Model):
    """One Celery task of a learner: the unit of idempotency and of billing."""

    learner = models.ForeignKey(TrainingLearner, on_delete=models.CASCADE, related_name="chunks")
    generation = models.PositiveIntegerField()
    seq = models.PositiveIntegerField()
    cluster = models.ForeignKey(Cluster, on_delete=models.PROTECT, related_name="+")
    worker_hostname = models.CharField(max_length=255, blank=True)
    started_at = models.DateTimeField(default=timezone.now)
    finished_at = models.DateTimeField(null=True, blank=True)
    steps = models.PositiveIntegerField(default=0)
    tokens = models.BigIntegerField(default=0)
    train_losses = models.JSONField(default=list, blank=True)
    # Seconds the chunk held its accelerators and how many it used (the run's learners.ranks:
    # one device per rank); billed quantity = seconds / 3600 × accelerators accelerator-hours.
    accelerator_seconds = models.DecimalField(max_digits=18, decimal_places=3, default=Decimal("0"))
    accelerators = models.PositiveIntegerField(default=1)
    # The device ordinals of its worker the chunk owns while it runs, rank r on devices[r]
    # (training.services.chunks); [] on a worker that offers none (CPU).
    devices = models.JSONField(default=list, blank=True)
    # Progress written at every push, so a killed chunk still says how far it got.
    progress_at = models.DateTimeField(null=True, blank=True)
    deltas_pushed = models.PositiveIntegerField(default=0)
    bytes_sent = models.BigIntegerField(default=0)
    # Global versions coming down: down-deltas, or full fp32 copies on a rejoin.
    bytes_received = models.BigIntegerField(default=0)

    class StateSource(models.TextChoices):
        MEMORY = "memory", "this worker's memory"  # the same process ran the previous chunk
        CHECKPOINT = "checkpoint", "learner checkpoint"  # restored from checkpoint_key
        REJOIN = "rejoin", "newest global version"  # no checkpoint: fresh optimizer state

    state_source = models.CharField(max_length=16, choices=StateSource.choices, blank=True)
    checkpoint_key = models.CharField(max_length=500, blank=True)
    # The checkpoint came from another store than this cluster's (the learner moved between
    # clusters with stores of their own): the bytes copied in, and the cluster whose store held
    # it (None: the installation's store). Billed as that cluster's egress (training.services.transfers).
    checkpoint_moved_bytes = models.BigIntegerField(default=0)
    checkpoint_moved_from = models.ForeignKey(
        Cluster, null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    # The bytes of the checkpoint this chunk wrote at its end (what moving the learner would carry).
    checkpoint_bytes = models.BigIntegerField(default=0)
    billed = models.BooleanField(default=False)
    error = models.TextField(blank=True)

    class RankStart(models.TextChoices):
        STARTED = "started", "helpers started for this chunk"
        KEPT = "kept", "the group this worker kept from the learner's previous chunk"

    # A learner of several ranks: how this chunk got its ranks 1..N-1 and the seconds that took
    # (training.engine.distributed keeps a learner's group between its chunks); "" for one rank.
    ranks_start = models.CharField(max_length=8, choices=RankStart.choices, blank=True)
    ranks_start_seconds = models.FloatField(null=True, blank=True)
    # Why the chunk stopped before its time was up ("" when it ran its chunk_seconds): the run
    # ended, the learner moved, or "interrupted: ..." (a spot interruption notice: it pushed its
    # delta and wrote its checkpoint first, so nothing it trained is lost).
    stopped_by = models.CharField(max_length=200, blank=True)

    class Meta:
        ordering = ["learner", "generation", "seq"]
        constraints = [
            models.UniqueConstraint(fields=["learner", "generation", "seq"], name="uniq_learner_chunk")
        ]

    def __str__(self) -> str:
        return f"learner {self.learner_id} g{self.generation} chunk {self.seq}"

    @property
    def billing_key(self) -> str:
        learner = self.learner
        return f"training_run:{learner.run_id}/learner:{learner.index}/g{self.generation}/c{self.seq}"


class GlobalVersionRecord(models.Model):
    """A published global version, recorded exactly once per (run, fragment, version)."""

    run = models.ForeignKey(TrainingRun, on_delete=models.CASCADE, related_name="versions")
    fragment = models.PositiveIntegerField()
    version = models.PositiveIntegerField()
    published_at = models.DateTimeField()
    # Filled by the evaluator on a cluster's queue after the version is recorded (null meanwhile;
    # training.services.evaluation). `eval_note` says why a version was not evaluated.
    eval_loss = models.FloatField(null=True, blank=True)
    eval_note = models.CharField(max_length=200, blank=True)
    eval_attempts = models.PositiveSmallIntegerField(default=0)
    tokens_merged = models.BigIntegerField(default=0)
    tokens_total = models.BigIntegerField(default=0)
    learners_merged = models.JSONField(default=list)
    staleness = models.JSONField(default=list)
    bytes_in = models.BigIntegerField(default=0)
    cost_so_far = models.DecimalField(max_digits=24, decimal_places=9, default=Decimal("0"))
    wall_seconds = models.FloatField(default=0.0)

    class Meta:
        ordering = ["run", "published_at", "fragment", "version"]
        constraints = [
            models.UniqueConstraint(fields=["run", "fragment", "version"], name="uniq_global_version")
        ]

    def __str__(self) -> str:
        return f"run #{self.run_id} f{self.fragment} v{self.version}"


class ModelVersion(models.Model):
    """A version of a registered model: a run's global parameters at one point of its training.

    Registered by the syncer at every k-th global version and once more when the run succeeds
    (training.services.lineage); `key` is the fragments' versions joined ("12-12"), or "final",
    so registering twice is a no-op.
    """

    class Layout(models.TextChoices):
        SWITCHYARD = "switchyard", "Switchyard artifact (byte-level GPT)"
        OPEN_WEIGHTS = "open-weights", "Open weights (config.json + model.safetensors)"

    registered_model = models.ForeignKey(RegisteredModel, on_delete=models.PROTECT, related_name="versions")
    number = models.PositiveIntegerField(help_text="1, 2, ... within the registered model")
    run = models.ForeignKey(TrainingRun, on_delete=models.PROTECT, related_name="model_versions")
    key = models.CharField(max_length=255)
    global_version = models.PositiveIntegerField(help_text="the least advanced fragment's version")
    fragment_versions = models.JSONField(default=list)
    final = models.BooleanField(default=False)
    eval_loss = models.FloatField(null=True, blank=True)
    tokens = models.BigIntegerField(default=0)
    cost = models.DecimalField(max_digits=24, decimal_places=9, default=Decimal("0"))
    currency = models.CharField(max_length=3, default="USD")
    artifact_uri = models.CharField(max_length=512)
    layout = models.CharField(max_length=16, choices=Layout.choices)
    created_at = models.DateTimeField(default=timezone.now, editable=False)

    class Meta:
        ordering = ["registered_model", "number"]
        constraints = [
            models.UniqueConstraint(fields=["run", "key"], name="uniq_model_version_per_run"),
            models.UniqueConstraint(fields=["registered_model", "number"], name="uniq_model_version_number"),
        ]

    def __str__(self) -> str:
        return f"{self.registered_model.slug}@{self.number}"
