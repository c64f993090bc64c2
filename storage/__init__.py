"""Pure libraries below every app: the object store (streamed S3 transfers in multipart) and
the tensor-blob and model-artifact formats.

No Django and no app imports (checked by `make lint`): the DiLoCo engine, billing's exports,
inference's batch jobs and local serving all use these modules the same way.
"""
