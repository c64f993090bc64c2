"""The /v1 rate limits (requests and tokens per minute, per key and per workflow): which limits
apply and the decision (limits), the sliding-window counters and their in-process store (window),
and the same window as one Redis Lua call per request (redis_counters)."""
