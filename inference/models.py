"""Inference records: requests and their attempts, eval sets and quality scores, batch jobs,
and the chaos settings used for failover drills.

InferenceRequest and InferenceAttempt rows are written only by inference.recording (the journal
and its fold); QualityRecord only through inference.services.quality_record_create.
"""

from __future__ import annotations

from decimal import Decimal

from django.conf import settings
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models
from django.utils import timezone

from registry.models import ApiToken, Deployment, RoutingPolicyVersion, Team, Workflow


class Endpoint(models.TextChoices):
    CHAT = "chat", "Chat completion"
    COMPLETION = "completion", "Completion"
    BATCH = "batch", "Batch"
    EVAL = "eval", "Eval"
    EMBEDDING = "embedding", "Embedding"


class InferenceRequest(models.Model):
    """One routed request: which policy version chose the route, who answered, what it cost."""

    class Status(models.TextChoices):
        SUCCEEDED = "succeeded", "Succeeded"
        FAILED = "failed", "Failed"

    workflow = models.ForeignKey(Workflow, on_delete=models.PROTECT, related_name="inference_requests")
    policy_version = models.ForeignKey(
        RoutingPolicyVersion, null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    # The deployment that answered; null when every attempt failed.
    deployment = models.ForeignKey(
        Deployment, null=True, blank=True, on_delete=models.PROTECT, related_name="inference_requests"
    )
    status = models.CharField(max_length=16, choices=Status.choices)
    endpoint = models.CharField(max_length=16, choices=Endpoint.choices, default=Endpoint.CHAT)
    stream = models.BooleanField(default=False)
    tokens_in = models.PositiveIntegerField(default=0)
    tokens_out = models.PositiveIntegerField(default=0)
    latency_ms = models.FloatField(default=0.0)
    ttft_ms = models.FloatField(null=True, blank=True, help_text="time to first token (streaming)")
    # Sum of the billed attempts' ledger amounts (UsageRecord.amount), so the ledger total
    # equals the sum of request costs exactly.
    cost = models.DecimalField(max_digits=20, decimal_places=9, default=Decimal("0"))
    currency = models.CharField(max_length=3, default="USD")
    # Answered from the response cache (inference.cache): cost is 0 and this is what the cached
    # answer cost when it was bought. NULL for every request a deployment answered.
    cost_avoided = models.DecimalField(max_digits=20, decimal_places=9, null=True, blank=True)
    attempts = models.PositiveSmallIntegerField(default=0)
    error = models.TextField(blank=True)
    # Client-supplied request id / idempotency key: a batch retry with the same key is
    # answered from this row instead of calling (and billing) again.
    client_request_id = models.CharField(max_length=128, null=True, blank=True, unique=True)
    # The answer's text, kept only for requests with a client_request_id: batch and eval
    # retries re-read it; a /v1 Idempotency-Key's answer only for a workflow that keeps prompts
    # and only until answer_kept_until (inference.idempotency).
    response_text = models.TextField(blank=True)
    # The whole answer document (OpenAI chat or completion shape: tool calls, refusal, usage
    # details) the provider sent, kept with response_text under the same rule, so that a replay
    # is the answer itself and not its text alone. NULL for a streamed answer (its text is kept).
    response_doc = models.JSONField(null=True, blank=True)
    # A /v1 Idempotency-Key request: sha256 of its body, so a retry naming the same key with
    # another body is refused rather than answered with this request's answer.
    request_digest = models.CharField(max_length=64, blank=True, default="")
    # Until when a /v1 replay may hand out response_text; NULL: not kept (or purged).
    answer_kept_until = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(default=timezone.now, editable=False)
    # The journal entry (attempts and billed units) of a request whose ledger rows are still to
    # be written; NULL once folded (inference.recording.journal). Holds "error" when its fold
    # failed and waits for an operator.
    ledger_pending = models.JSONField(null=True, blank=True, editable=False)

    class Meta:
        ordering = ["-created_at"]
        indexes = [
            models.Index(fields=["workflow", "created_at"], name="infreq_workflow_idx"),
            models.Index(fields=["deployment", "created_at"], name="infreq_deployment_idx"),
            # The folder's scan (journal_fold): only the few pending rows are in this index.
            models.Index(
                fields=["id"],
                name="infreq_ledger_pending_idx",
                condition=models.Q(ledger_pending__isnull=False),
            ),
            # The idempotent answers' purge: only the few answers still kept are in this index.
            models.Index(
                fields=["answer_kept_until"],
                name="infreq_answer_kept_idx",
                condition=models.Q(answer_kept_until__isnull=False),
            ),
        ]

    def __str__(self) -> str:
        return f"request {self.pk} ({self.workflow_id}, {self.status})"


class InferenceAttempt(models.Model):
    """One call (or skip) of one deployment while serving a request, in order."""

    class Outcome(models.TextChoices):
        OK = "ok", "OK"
        RETRYABLE = "retryable", "Retryable error"
        NON_RETRYABLE = "non_retryable", "Non-retryable error"
        CIRCUIT_OPEN = "circuit_open", "Circuit open (skipped)"
        SKIPPED_QUALITY = "skipped_quality", "Below quality floor (skipped)"
        BUDGET = "budget", "Budget exhausted"
        OVER_COST = "over_cost", "Over the policy's cost limit (skipped)"
        UNSUPPORTED = "unsupported", "Cannot serve the request's features (skipped)"

    request = models.ForeignKey(InferenceRequest, on_delete=models.CASCADE, related_name="attempt_rows")
    position = models.PositiveSmallIntegerField()
    deployment = models.ForeignKey(Deployment, on_delete=models.PROTECT, related_name="+")
    status_code = models.PositiveSmallIntegerField(null=True, blank=True)
    outcome = models.CharField(max_length=16, choices=Outcome.choices)
    latency_ms = models.FloatField(default=0.0)
    tokens_in = models.PositiveIntegerField(default=0)
    tokens_out = models.PositiveIntegerField(default=0)
    cost = models.DecimalField(max_digits=20, decimal_places=9, default=Decimal("0"))
    error = models.TextField(blank=True)

    class Meta:
        ordering = ["request", "position"]
        constraints = [
            models.UniqueConstraint(fields=["request", "position"], name="uniq_attempt_position"),
        ]
        indexes = [
            # Rolling p50 / error rate per deployment.
            models.Index(fields=["deployment", "-id"], name="infatt_deployment_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.request_id}#{self.position} {self.outcome}"


class ChaosConfig(models.Model):
    """Fault injection for one deployment, switched on and off from the UI/API for drills.

    When enabled, each call of the deployment first rolls the dice: with `error_rate` it
    answers one of `status_codes` without calling the provider, with `malformed_rate` it
    returns a body that is not JSON; `latency_ms` is added before every call.
    """

    deployment = models.OneToOneField(Deployment, on_delete=models.CASCADE, related_name="chaos")
    enabled = models.BooleanField(default=False)
    error_rate = models.FloatField(default=0.0, validators=[MinValueValidator(0.0), MaxValueValidator(1.0)])
    status_codes = models.JSONField(default=list, blank=True, help_text="e.g. [503, 429]; empty = [503]")
    latency_ms = models.PositiveIntegerField(default=0)
    malformed_rate = models.FloatField(
        default=0.0, validators=[MinValueValidator(0.0), MaxValueValidator(1.0)]
    )
    updated_at = models.DateTimeField(default=timezone.now)
    updated_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )

    def __str__(self) -> str:
        return f"chaos for {self.deployment_id} ({'on' if self.enabled else 'off'})"


class EvalSet(models.Model):
    workflow = models.ForeignKey(Workflow, on_delete=models.CASCADE, related_name="eval_sets")
    name = models.CharField(max_length=100)
    description = models.TextField(blank=True)
    schedule_enabled = models.BooleanField(
        default=False, help_text="run by beat on every deployment of the route"
    )
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(default=timezone.now, editable=False)

    class Meta:
        ordering = ["workflow", "name"]
        constraints = [models.UniqueConstraint(fields=["workflow", "name"], name="uniq_evalset_name")]

    def __str__(self) -> str:
        return self.name


class EvalCase(models.Model):
    class Scorer(models.TextChoices):
        EXACT = "exact", "Exact match"
        CONTAINS = "contains", "Contains"
        REGEX = "regex", "Regular expression"
        JSON_SCHEMA = "json_schema", "Valid against a JSON schema"
        NUMERIC = "numeric", "Numeric within tolerance"
        JUDGE = "judge", "Judged by another deployment"

    eval_set = models.ForeignKey(EvalSet, on_delete=models.CASCADE, related_name="cases")
    position = models.PositiveIntegerField(default=0)
    prompt = models.TextField()
    expected = models.TextField(blank=True)
    scorer = models.CharField(max_length=16, choices=Scorer.choices, default=Scorer.EXACT)
    scorer_config = models.JSONField(default=dict, blank=True)
    judge_deployment = models.ForeignKey(
        Deployment, null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )

    class Meta:
        ordering = ["eval_set", "position", "id"]

    def __str__(self) -> str:
        return f"{self.eval_set_id}#{self.position} ({self.scorer})"


class EvalRun(models.Model):
    class State(models.TextChoices):
        PENDING = "pending", "Pending"
        RUNNING = "running", "Running"
        SUCCEEDED = "succeeded", "Succeeded"
        FAILED = "failed", "Failed"

    class Trigger(models.TextChoices):
        SCHEDULE = "schedule", "Scheduled"
        MANUAL = "manual", "On demand"

    eval_set = models.ForeignKey(EvalSet, on_delete=models.CASCADE, related_name="runs")
    deployment = models.ForeignKey(Deployment, on_delete=models.PROTECT, related_name="eval_runs")
    state = models.CharField(max_length=16, choices=State.choices, default=State.PENDING)
    trigger = models.CharField(max_length=16, choices=Trigger.choices, default=Trigger.MANUAL)
    cases_total = models.PositiveIntegerField(default=0)
    cases_done = models.PositiveIntegerField(default=0)
    mean_score = models.FloatField(null=True, blank=True)
    cost = models.DecimalField(max_digits=20, decimal_places=9, default=Decimal("0"))
    error = models.TextField(blank=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    # The API key the job was asked for with: its budgets apply to every call, its ledger rows
    # name it. None: asked for from a page (a session).
    api_key = models.ForeignKey(ApiToken, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    # The ledger subject its calls are billed to ("training_run:12": a run scoring its own model
    # versions pays for the evaluation); "" bills each request as usual.
    bill_to = models.CharField(max_length=80, blank=True, default="")
    created_at = models.DateTimeField(default=timezone.now, editable=False)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"eval run {self.pk} ({self.state})"


class QualityRecord(models.Model):
    """One quality score in [0, 1] for a deployment; written only by services.quality_record_create."""

    class Source(models.TextChoices):
        EVAL = "eval", "Eval set"
        FEEDBACK = "feedback", "Application feedback"

    deployment = models.ForeignKey(Deployment, on_delete=models.PROTECT, related_name="quality_records")
    workflow = models.ForeignKey(
        Workflow, null=True, blank=True, on_delete=models.PROTECT, related_name="quality_records"
    )
    source = models.CharField(max_length=16, choices=Source.choices)
    score = models.DecimalField(
        max_digits=5,
        decimal_places=4,
        validators=[MinValueValidator(Decimal("0")), MaxValueValidator(Decimal("1"))],
    )
    eval_run = models.ForeignKey(
        EvalRun, null=True, blank=True, on_delete=models.CASCADE, related_name="quality_records"
    )
    eval_case = models.ForeignKey(
        EvalCase, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    inference_request = models.ForeignKey(
        InferenceRequest, null=True, blank=True, on_delete=models.SET_NULL, related_name="quality_records"
    )
    comment = models.CharField(max_length=500, blank=True)
    created_at = models.DateTimeField(default=timezone.now, editable=False)

    class Meta:
        ordering = ["-created_at"]
        indexes = [
            # Rolling quality per deployment (and per workflow) for demotion and charts.
            models.Index(fields=["deployment", "-created_at"], name="quality_deployment_idx"),
            models.Index(fields=["workflow", "deployment", "-created_at"], name="quality_wf_dep_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.deployment_id}: {self.score} ({self.source})"


class GatewayFile(models.Model):
    """A file of OpenAI's Files API (/v1/files): a batch's input, uploaded by a caller, or its
    output and error files, written by the job. The bytes live in the object store at `key`.

    Owned by a team (None: the platform's, uploaded with a platform key); a batch's output is
    also its workflow's, so a key limited to other workflows does not see it. Who sees a file
    is decided in one place, inference.gateway.bulk.files.file_visible."""

    class Purpose(models.TextChoices):
        BATCH = "batch", "Batch input"
        BATCH_OUTPUT = "batch_output", "Batch output"

    team = models.ForeignKey(
        Team, null=True, blank=True, on_delete=models.PROTECT, related_name="gateway_files"
    )
    workflow = models.ForeignKey(
        Workflow, null=True, blank=True, on_delete=models.PROTECT, related_name="gateway_files"
    )
    purpose = models.CharField(max_length=16, choices=Purpose.choices)
    filename = models.CharField(max_length=255)
    bytes = models.PositiveBigIntegerField(default=0)
    key = models.CharField(max_length=512)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+")
    api_key = models.ForeignKey(ApiToken, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    created_at = models.DateTimeField(default=timezone.now, editable=False)

    class Meta:
        ordering = ["-created_at", "-id"]

    def __str__(self) -> str:
        return f"file {self.pk} ({self.filename})"


class BatchJob(models.Model):
    class State(models.TextChoices):
        PENDING = "pending", "Pending"
        RUNNING = "running", "Running"
        SUCCEEDED = "succeeded", "Succeeded"
        FAILED = "failed", "Failed"
        CANCELLED = "cancelled", "Cancelled"

    workflow = models.ForeignKey(Workflow, on_delete=models.PROTECT, related_name="batch_jobs")
    endpoint = models.CharField(max_length=16, choices=Endpoint.choices, default=Endpoint.CHAT)
    input_uri = models.CharField(max_length=512)
    output_uri = models.CharField(max_length=512, blank=True)
    state = models.CharField(max_length=16, choices=State.choices, default=State.PENDING)
    total = models.PositiveIntegerField(default=0)
    done = models.PositiveIntegerField(default=0)
    failed = models.PositiveIntegerField(default=0)
    cost = models.DecimalField(max_digits=20, decimal_places=9, default=Decimal("0"))
    error = models.TextField(blank=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="inference_batch_jobs"
    )
    # The API key the job was asked for with: its budgets apply to every call, its ledger rows
    # name it. None: asked for from a page (a session).
    api_key = models.ForeignKey(ApiToken, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    # Every line calls this deployment only (route(deployment=...)): a replay of kept requests
    # on one candidate (decisions). None: the workflow's route, as for any batch.
    deployment = models.ForeignKey(
        Deployment, null=True, blank=True, on_delete=models.PROTECT, related_name="batch_jobs"
    )
    # Lines per minute for this job, below the workflow's, team's and key's own limits, which
    # every line respects too (inference.batch.pacing waits rather than fails).
    max_rpm = models.PositiveIntegerField(null=True, blank=True)
    # A job of OpenAI's Batch API (/v1/batches): the API its lines call ("chat", "responses",
    # "embeddings"; empty: a Switchyard job of /api/), its files and the caller's metadata.
    # Its output is written in OpenAI's shape, answers and errors apart.
    api = models.CharField(max_length=16, blank=True, default="")
    input_file = models.ForeignKey(
        GatewayFile, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    output_file = models.ForeignKey(
        GatewayFile, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    error_file = models.ForeignKey(
        GatewayFile, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    metadata = models.JSONField(null=True, blank=True)
    # The input and output objects hold kept prompts (a replay): they are deleted when the
    # replay ends, at this time at the latest (the kept rows' expiry, by the retention purge),
    # or when the workflow opts out (inference.retention). NULL once deleted, or never held.
    holds_prompts_until = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(default=timezone.now, editable=False)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    updated_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"batch {self.pk} ({self.state})"


class RetainedPrompt(models.Model):
    """A gateway request's input and answer, kept only for a workflow that opted in
    (Workflow.retain_prompts) and only until `expires_at` (its prompt_retention_days then).

    Counterfactual routing (decisions) samples these and replays them through candidate
    deployments. Written in one place (inference.retention); deleted by beat once expired. A
    workflow that never opted in has no rows here, and no prompt of it is stored elsewhere.
    """

    inference_request = models.OneToOneField(
        InferenceRequest, on_delete=models.CASCADE, related_name="retained_prompt"
    )
    workflow = models.ForeignKey(Workflow, on_delete=models.CASCADE, related_name="retained_prompts")
    endpoint = models.CharField(max_length=16, choices=Endpoint.choices, default=Endpoint.CHAT)
    # The request as a batch line takes it: {"messages": [...]} or {"prompt": "..."}, plus
    # max_tokens / temperature / top_p / stop when the caller set them.
    request = models.JSONField()
    response_text = models.TextField(blank=True)
    created_at = models.DateTimeField(default=timezone.now, editable=False)
    expires_at = models.DateTimeField()

    class Meta:
        ordering = ["-created_at"]
        indexes = [
            # Replay sampling: a workflow's live rows, newest first.
            models.Index(fields=["workflow", "-created_at"], name="retained_wf_created_idx"),
            # The purge: rows past their expiry.
            models.Index(fields=["expires_at"], name="retained_expires_idx"),
        ]

    def __str__(self) -> str:
        return f"retained prompt of request {self.inference_request_id}"


class StoredResponse(models.Model):
    """A `/v1/responses` answer kept for `previous_response_id` and GET/DELETE /v1/responses/{id}:
    only for a workflow that keeps prompts (Workflow.retain_prompts), only when the caller did not
    send `store: false`, and only until `expires_at` (its prompt_retention_days). Written and
    deleted with the workflow's other kept prompts (inference.retention); its id on the wire is
    the request's (`resp_sy{request id}`)."""

    inference_request = models.OneToOneField(
        InferenceRequest, on_delete=models.CASCADE, primary_key=True, related_name="stored_response"
    )
    workflow = models.ForeignKey(Workflow, on_delete=models.CASCADE, related_name="stored_responses")
    # The whole conversation this response answered, as Responses input items (the previous
    # response's input and output first, when it continued one), then the Response object.
    input_items = models.JSONField()
    response = models.JSONField()
    created_at = models.DateTimeField(default=timezone.now, editable=False)
    expires_at = models.DateTimeField()

    class Meta:
        indexes = [models.Index(fields=["expires_at"], name="stored_response_expires_idx")]

    def __str__(self) -> str:
        return f"resp_sy{self.inference_request_id}"
