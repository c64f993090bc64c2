"""Redis dies under a consumer that holds an unacked message: tearing the connection down must raise
no more than a connection error (stack/redis_broker.py), or a Celery worker exits."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from kombu import Connection, Consumer, Exchange, Message, Producer, Queue
from kombu.transport import redis as kombu_redis

import stack.celery  # noqa: F401  (installs the transport for redis:// URLs)
from stack.redis_broker import Transport
from tests.integration.redis_server import RedisServer, redis_server

pytestmark = pytest.mark.redis_server


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[RedisServer]:
    with redis_server(tmp_path) as server:
        yield server


def _tear_down_after_redis_died(conn: Connection, broker: RedisServer) -> None:
    """What Celery's consumer does on a lost connection, with Redis gone under an unacked message."""
    task_channel = conn.default_channel
    work = Queue("work", Exchange("work", "direct"), "work")
    Producer(task_channel).publish({"n": 1}, exchange=work.exchange, routing_key="work", declare=[work])
    delivered: list[Message] = []
    Consumer(task_channel, [work], callbacks=[lambda body, m: delivered.append(m)], accept=["json"]).consume()
    # Like Celery's remote-control (pidbox) consumer: an auto-delete fanout queue on a second channel.
    control = Queue("control", Exchange("control", "fanout"), auto_delete=True)
    Consumer(conn.channel(), [control], callbacks=[lambda body, m: None], accept=["json"]).consume()
    while not delivered:
        conn.drain_events(timeout=10)
    try:
        conn.drain_events(timeout=0.3)  # leaves a BRPOP in flight, as an idle worker's loop does
    except TimeoutError:  # kombu raises socket.timeout, the same class
        pass
    assert len(task_channel.qos._delivered) == 1 and task_channel._in_poll

    broker.kill()
    # celery/worker/consumer/consumer.py, on_connection_error_after_connected:
    conn.collect(socket_timeout=5)
    try:
        conn.close()
    except conn.connection_errors:
        pass  # what kombu's ignore_errors() there swallows


def test_redis_urls_use_the_transport_that_survives_a_lost_broker(broker: RedisServer) -> None:
    with Connection(broker.url) as conn:
        assert isinstance(conn.transport, Transport)


def test_a_connection_torn_down_after_redis_died_under_an_unacked_message_raises_no_other_error(
    broker: RedisServer,
) -> None:
    conn = Connection(broker.url)
    _tear_down_after_redis_died(conn, broker)  # an AttributeError here stopped the worker

    broker.start()
    with Connection(broker.url) as again:
        again.connect()
        assert again.connected


def test_kombus_own_redis_transport_still_raises_attribute_error_there(broker: RedisServer) -> None:
    """Guards the workaround: when this fails, kombu fixed the bug and stack/redis_broker.py can go."""
    conn = Connection(hostname="127.0.0.1", port=broker.port, transport=kombu_redis.Transport)
    with pytest.raises(AttributeError, match="'NoneType' object has no attribute 'hostname'"):
        _tear_down_after_redis_died(conn, broker)
