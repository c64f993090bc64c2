#!/usr/bin/env bash
# GPU readiness: the tests marked `cuda` (the learner in bf16 on the GPU, a DiLoCo round with
# a CPU syncer, 2 NCCL ranks, DDP and FSDP2, when there are two GPUs), then a short training bench on the GPU
# (bench/gpu.py). Meant for a GPU machine with the project installed
# (`make install`: PyPI's torch wheel for Linux x86-64 carries CUDA); about 2-3 minutes in
# all, each step capped so the whole stays under 5. Needs no database, broker or store.
#
#   scripts/gpu_check.sh [OUT_DIR]      (figures: OUT_DIR/bench-gpu.json, default var/)
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PY:-.venv/bin/python}"
OUT_DIR="${1:-var}"
mkdir -p "$OUT_DIR"
export PYTHONUNBUFFERED=1

"$PY" -c 'import torch; print("gpu_check: torch", torch.__version__, "CUDA", torch.version.cuda, [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())])'

# The cuda tests are engine tests: no database is touched (settings fall back to SQLite).
# -m cuda selects them; -rs prints each skip with its reason (no GPU; one GPU: no NCCL pair).
timeout 180 "$PY" -m pytest tests/training/engine/test_engine_cuda.py -m cuda -q -p no:randomly -rs

if ! "$PY" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)'; then
  echo "gpu_check: no CUDA GPU visible to torch: the cuda tests skipped and nothing was checked" >&2
  exit 2
fi

timeout 100 "$PY" -m bench.gpu --json "$OUT_DIR/bench-gpu.json" --steps 300
echo "gpu_check: passed; figures in $OUT_DIR/bench-gpu.json"
