"""Quality: eval sets and their cases, eval runs per deployment, application feedback (services),
and the scorers that compare an answer with a case's expectation (scorers)."""
