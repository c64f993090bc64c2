"""Circuit breakers per deployment, shared by every web process through Redis.

A breaker is closed until, over its sliding window (the last `window_calls` calls no older than
`window_s`), at least `min_requests` calls were made and the failure rate reached
`failure_rate`; it then opens for `cooldown_s`. After the cooldown one
caller claims the half-open probe; the probe's success closes the breaker (counters reset), its
failure opens it again for another cooldown. A probe that never reports (its process died) is
given up after another cooldown and a new one is claimed.

The state lives in one Redis hash per deployment, changed only by two Lua scripts, so every
transition is atomic across processes. Without REDIS_URL (the embedded demo) the same logic runs
in-process under a lock.

Each call also pushes its latency onto a capped list, from which `fastest` reads rolling p50s.

Modules: state (states, settings, the clock), redis_breakers (the Lua scripts and RedisBreakers),
breakers (the in-process LocalBreakers, the process's `breakers()`, success recording,
`breaker_state`).
"""
