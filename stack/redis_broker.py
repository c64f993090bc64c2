"""Kombu's Redis transport, less a crash that made workers exit when Redis went away.

When Redis dies while a worker holds unacknowledged messages (a countdown task such as the
syncer's next tick, or a task whose ack just failed) and its event loop is waiting on a BRPOP,
Celery tears the connection down in two passes (`on_connection_error_after_connected` in
celery/worker/consumer/consumer.py): `Connection.collect()`, then `Connection.close()`.

1. collect() closes the task channel, whose pending BRPOP read fails on the dead socket before
   the channel has put its unacked messages back, then the other channels, where deleting the
   pidbox's auto-delete fanout queue fails too and ends the loop. collect() swallows both
   connection errors and detaches the transport (`transport.client = None`,
   `_do_close_transport` in kombu/connection.py).
2. close() closes the task channel again. Now it restores its unacked messages, which builds a
   Redis pool from `self.connection.client` (`Channel._connparams` in kombu/transport/redis.py):
   AttributeError("'NoneType' object has no attribute 'hostname'"). That is not a connection
   error, so kombu's `ignore_errors` lets it through and the worker stops with "Unrecoverable
   error". The same restore on a detached transport is kombu issue
   https://github.com/celery/kombu/issues/970 (there at shutdown). kombu 5.7.0, the newest
   release, still has it; tests/stack/test_redis_broker.py fails once kombu fixes it, so this
   module can go.

Here a channel whose transport was detached reports a connection error instead, which every
caller on those paths already takes as "the broker is gone": the consumer reconnects. Messages it
could not put back stay in Redis's `unacked` hash if Redis kept its data, and kombu requeues them
after the visibility timeout; our tasks are idempotent, and beat's supervisors re-dispatch lost
training and batch work well before that.
"""

from __future__ import annotations

from typing import Any

from kombu.transport import TRANSPORT_ALIASES
from kombu.transport import redis as kombu_redis
from redis.exceptions import ConnectionError as RedisConnectionError


class Channel(kombu_redis.Channel):
    def _connparams(self, asynchronous: bool = False) -> dict[str, Any]:
        transport = self.connection
        if transport is None or transport.client is None:
            raise RedisConnectionError(
                "the broker connection is closed: Redis is out of reach from this channel"
            )
        # (celery-types does not declare this private method.)
        params: dict[str, Any] = super()._connparams(asynchronous=asynchronous)  # type: ignore[misc]
        return params


class Transport(kombu_redis.Transport):
    Channel = Channel


def install() -> None:
    """Make `redis://` and `rediss://` broker URLs use this transport in this process."""
    for scheme in ("redis", "rediss"):
        TRANSPORT_ALIASES[scheme] = "stack.redis_broker:Transport"
