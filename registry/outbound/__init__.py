"""Outbound requests: the one guard every connection to a user-influenced URL passes (guard), and
where a provider's credentials may be sent (endpoints)."""
