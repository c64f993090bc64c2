"""The one Redis client factory: every app that talks to Redis gets its client here.

A client is made once per (URL, timeout) and process and then shared by every caller with those
values (a redis-py client is thread-safe: each command borrows a connection from its pool). It
is fork-safe without help: the pool notices that it runs in a new process (its pid changed) and
opens fresh connections instead of sharing the parent's sockets, so a client made before
gunicorn or Celery forks is safe to use in the child.
"""

from __future__ import annotations

import threading

import redis

# What a Redis that is restarting, unreachable or too slow raises: callers fail open (or safe)
# on these and let every other error through.
REDIS_DOWN_ERRORS: tuple[type[BaseException], ...] = (
    redis.exceptions.ConnectionError,
    redis.exceptions.TimeoutError,
)

_clients: dict[tuple[str, float], redis.Redis] = {}
_clients_lock = threading.Lock()


def redis_client(url: str, *, timeout: float) -> redis.Redis:
    """The process's client for `url` whose commands and connects give up after `timeout`
    seconds (short: a Redis that does not answer must not hold a request long)."""
    key = (url, timeout)
    client = _clients.get(key)
    if client is None:
        with _clients_lock:
            client = _clients.get(key)
            if client is None:
                client = redis.Redis.from_url(url, socket_timeout=timeout, socket_connect_timeout=timeout)
                _clients[key] = client
    return client
