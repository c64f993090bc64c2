"""Pure libraries below every app: the object store and the model-artifact format.

No Django and no app imports (checked by `make lint`): the DiLoCo engine, billing's exports,
inference's batch jobs and local serving all use these modules the same way.
"""
