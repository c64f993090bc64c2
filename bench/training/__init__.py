"""`manage.py bench training`: a multi-cluster run through the orchestrator (runs) against the
bare engine on the same data (bare), torch DDP (ddp) and a learner's resume from a checkpoint
(resume)."""
