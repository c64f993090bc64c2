"""Benchmarks: they measure and print JSON figures (`python manage.py bench NAME ...`); tests never
assert on their wall-clock numbers. Kept apart from the apps they measure, above them all.

- diloco: DiLoCo against data-parallel training on the engine's simulator; pure torch, also
  `python -m bench.diloco.run`; its recorded figures are in bench/diloco/results/.
- gpu: a short bf16 training bench on a CUDA GPU (`python -m bench.gpu`).
- ledger: the ledger's write, rollup, export and verify throughput.
- gateway: what the router and the /v1 gateway add on top of a provider call.
- training: multi-cluster training runs end to end against the bare engine, DDP and resume.
- scale: the syncer and the store at real tensor sizes with tiny compute (peak RSS, bytes per
  sync, store bytes under retention, resume after a SIGKILL).
- mockprovider: the loopback OpenAI-compatible provider the gateway bench (and the tests'
  drills) call.

This file imports nothing, so `python -m bench.diloco.run` runs without Django.
"""
