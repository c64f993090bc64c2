"""`manage.py bench scale`: a scale drill of the syncer and the store at real tensor sizes with
tiny compute. The command and its report (run), one drill per compression kind (drill), the
learner, syncer and S3-server processes (workers), the synthetic model (model) and the counters
of what crossed the store (meter)."""
