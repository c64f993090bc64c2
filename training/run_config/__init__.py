"""A training run's config: validation with per-field messages, normalisation, engine mapping.

A config is a JSON object (the launch form, the API and `manage.py train --config` all send
one). `run_config_validate(raw)` returns the normalised dict that is stored on the run, or
raises RunConfigError whose `errors` maps dotted field paths to messages
(`{"learners.quorum": ["must be between 1 and learners.count (2)"]}`). `RunConfig` turns a
stored dict into the engine's dataclasses (training/engine/config.py).

Shape (every key optional except `stop`; defaults in DEFAULTS):

    model:        {n_layer, n_embd, n_head, block_size, dropout}   (the byte-level GPT; with
                  model_uri only block_size, the training context length, may be given)
    model_uri:    null | "file:///dir" | "s3://bucket/prefix": a model directory in the open-weights
                  layout (config.json [+ model.safetensors] [+ tokenizer.json]; engine/openweights.py)
    tokenizer_uri: null | URI of a tokenizer.json (default: the model directory's tokenizer.json)
    dataset:      "stdlib://" | "file:///path/file-or-dir" | "s3://bucket/prefix", the last two
                  only under a root of SWITCHYARD_TRAINING_DATA_ROOTS (as model_uri and
                  tokenizer_uri; see dataset_source)
    data:         {format: bytes|text|jsonl|parquet, text_field, eval_every_nth_document,
                   max_train_bytes, max_eval_bytes, eval_every_nth_file, sharding, seed}
                  (bytes: the in-memory byte corpus; the others stream tokenised documents,
                  engine/stream.py)
    learners:     {count: M, quorum: K (1..M), batch_size, ranks: N}
                  (batch_size is a learner's whole batch; with ranks N > 1 each learner is a
                  process group of N ranks, each with batch_size / N windows: engine/distributed.py)
    h:            inner steps between a fragment's syncs
    fragments:    {count: P, assignment, overlap: τ, alpha: α}     (Streaming DiLoCo)
    inner:        {lr, min_lr_ratio, warmup_steps, total_steps|null, weight_decay, grad_clip, schedule}
    outer:        {lr, momentum, nesterov}
    compression:  {kind: fp32|bf16|int8|4bit|fp4_e3m0, error_feedback,
                   down: null|fp32|bf16|int8|4bit|fp4_e3m0}
                  (kind: the learners' Δ going up, 4bit being uniform int4 and fp4_e3m0 the
                  Streaming DiLoCo FP4; error_feedback: each learner carries its quantisation
                  residual into its next Δ, default off; down: global versions coming down as a
                  difference from the learners' copy, null = the same kind as up)
    syncer:       {grace_seconds, adaptive_grace, stale_policy: discount|drop, discount,
                   max_staleness, token_weighting, radial_directional, keep_versions}
                  (adaptive_grace: grace_seconds is the cap of a window sized from the learners'
                  observed lags; radial_directional: average norms and directions of the Δs apart;
                  keep_versions: K ≥ 1, the newest global versions per fragment kept in the store,
                  besides registered and still-needed ones: training.services.retention)
    stop:         {outer_steps: N} or {token_budget: N}          (exactly one)
    money_budget: "12.50" (a decimal string) or null;   currency: "USD"
    team:         "" or the team the run's spend is billed to (its hard budgets stop the run)
    placement:    {accelerator_type, regions: [...], pins: {"<learner index>": "<cluster slug>"}}
    chunk_seconds: seconds of inner steps per Celery task; learner_timeout: seconds of silence
                  before a learner counts as lost;  eval_windows: held-out windows per eval
    seed:         model init seed
    register_every_versions: k: every k-th global version is registered as a model version
                  (0: only the final one); training.services.lineage
    start_from:   null | {model_version: "<model slug>@<number>" or its id, mode: continue|finetune}:
                  the run's initial weights, and its architecture, come from that version (a
                  switchyard artifact fixes `model`; an open-weights one becomes `model_uri`).
                  "continue" also takes the source run's `dataset`, its `data` (overlaid with
                  what is given) and model.block_size unless given; "finetune" takes nothing else.

Modules: schema (DEFAULTS, bounds, choices, RunConfigError), sources (dataset, model and tokenizer
URIs), validate (run_config_validate), config (RunConfig, demo_config).
"""

from training.run_config.config import RunConfig, demo_config
from training.run_config.schema import (
    DATA_FORMATS,
    DEFAULTS,
    MAX_RANKS,
    MONEY_DECIMAL_PLACES,
    MONEY_MAX_DIGITS,
    START_MODES,
    TEAM_MAX_LENGTH,
    RunConfigError,
)
from training.run_config.sources import (
    DATASET_REFUSED,
    OBJECT_REFUSED,
    DatasetSource,
    dataset_files,
    dataset_keys,
    dataset_source,
    model_roots,
    object_uri_check,
)
from training.run_config.validate import run_config_validate

__all__ = [
    "DATASET_REFUSED",
    "DATA_FORMATS",
    "DEFAULTS",
    "MAX_RANKS",
    "MONEY_DECIMAL_PLACES",
    "MONEY_MAX_DIGITS",
    "OBJECT_REFUSED",
    "START_MODES",
    "TEAM_MAX_LENGTH",
    "DatasetSource",
    "RunConfig",
    "RunConfigError",
    "dataset_files",
    "dataset_keys",
    "dataset_source",
    "demo_config",
    "model_roots",
    "object_uri_check",
    "run_config_validate",
]
