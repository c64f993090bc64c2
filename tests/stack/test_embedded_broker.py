"""The embedded filesystem broker never hands a consumer a half-written message."""

from __future__ import annotations

import multiprocessing
from pathlib import Path

from kombu import Connection

import stack.celery  # noqa: F401  (installs the atomic filesystem transport)
from stack.embedded_broker import Transport

MESSAGES = 20
PAD = "x" * (4 << 20)  # 4 MiB: with Kombu's own transport a fast poller catches such a write half-done


def _options(folder: Path) -> dict[str, object]:
    return {
        "data_folder_in": str(folder),
        "data_folder_out": str(folder),
        "store_processed": False,
        "control_folder": str(folder / "control"),  # else Kombu makes ./control
        "polling_interval": 0.0005,  # poll hard, to hit the window the race needs
    }


def _produce(folder: str) -> None:
    with Connection("filesystem://localhost/", transport_options=_options(Path(folder))) as conn:
        queue = conn.SimpleQueue("race")
        for i in range(MESSAGES):
            queue.put({"n": i, "pad": PAD})
        queue.close()


def test_filesystem_urls_use_the_atomic_transport(tmp_path: Path) -> None:
    with Connection("filesystem://localhost/", transport_options=_options(tmp_path)) as conn:
        assert isinstance(conn.transport, Transport)


def test_a_consumer_racing_a_producer_in_another_process_gets_every_message_whole(tmp_path: Path) -> None:
    producer = multiprocessing.get_context("spawn").Process(target=_produce, args=(str(tmp_path),))
    producer.start()
    received: list[int] = []
    with Connection("filesystem://localhost/", transport_options=_options(tmp_path)) as conn:
        queue = conn.SimpleQueue("race")
        # Consume while the producer writes: with non-atomic writes this read
        # half-written files and failed with a JSON decode error.
        while len(received) < MESSAGES:
            message = queue.get(block=True, timeout=60)
            received.append(message.payload["n"])
            assert message.payload["pad"] == PAD
            message.ack()
        queue.close()
    producer.join(timeout=60)
    assert producer.exitcode == 0
    assert sorted(received) == list(range(MESSAGES))
    assert not list(tmp_path.glob(".tmp-*"))
