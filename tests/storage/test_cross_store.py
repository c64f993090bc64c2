"""Copying an object between two stores (a cluster's and the installation's): streamed, counted,
and a store opened with keys of its own signs its requests with them (moto's S3 server)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import boto3
import pytest

from storage.multipart import Transfer
from storage.objectstore import ObjectNotFoundError, copy_between, open_store

BLOCK = 1 << 20


def _payload(size: int) -> bytes:
    return os.urandom(size)


def test_an_object_crosses_from_a_file_store_to_another_with_its_size_counted(tmp_path: Path) -> None:
    source, target = open_store(f"file://{tmp_path / 'a'}"), open_store(f"file://{tmp_path / 'b'}")
    data = _payload(3 * BLOCK + 17)
    source.put("runs/1/learners/l0000/g000000-c00000001.syd", data)
    key = "runs/1/learners/l0000/g000000-c00000001.syd"
    assert source.size(key) == len(data)
    assert copy_between(source, target, key) == len(data)
    assert target.get(key) == data and target.size(key) == len(data)
    with pytest.raises(ObjectNotFoundError):
        source.size("runs/1/missing")
    with pytest.raises(ObjectNotFoundError):
        copy_between(source, target, "runs/1/missing")


@pytest.fixture
def buckets(s3_server: str) -> tuple[str, str]:
    client = boto3.client("s3", endpoint_url=s3_server)
    for name in ("east-store", "home-store"):
        client.create_bucket(Bucket=name)
    return "east-store", "home-store"


def test_an_object_larger_than_a_part_crosses_between_s3_stores_in_parts(
    s3_server: str, buckets: tuple[str, str]
) -> None:
    transfer = Transfer(part_bytes=5 * BLOCK, concurrency=2)
    east = open_store(f"s3://{buckets[0]}/c", endpoint_url=s3_server, transfer=transfer)
    home = open_store(f"s3://{buckets[1]}/h", endpoint_url=s3_server, transfer=transfer)
    data = _payload(11 * BLOCK + 5)
    east.put("ckpt.syd", data)
    assert east.size("ckpt.syd") == len(data)
    assert copy_between(east, home, "ckpt.syd") == len(data)
    assert home.get("ckpt.syd") == data
    head = boto3.client("s3", endpoint_url=s3_server).head_object(
        Bucket=buckets[1], Key="h/ckpt.syd", PartNumber=1
    )
    assert head["PartsCount"] == 3  # a multipart upload of 5 MiB parts, not one PUT
    with pytest.raises(ObjectNotFoundError):
        east.size("nothing-here")


def test_a_store_with_keys_of_its_own_signs_every_request_with_them(
    s3_server: str, buckets: tuple[str, str]
) -> None:
    store: Any = open_store(
        f"s3://{buckets[0]}/k", endpoint_url=s3_server, credentials=("AKIACLUSTEREAST01", "cluster-secret")
    )
    signed: list[str] = []
    store.client.meta.events.register(
        "before-send", lambda request, **_: signed.append(request.headers.get("Authorization", b"").decode())
    )
    store.put("x", b"1")
    assert store.get("x") == b"1"
    assert signed and all("Credential=AKIACLUSTEREAST01/" in header for header in signed)
    default: Any = open_store(f"s3://{buckets[0]}/k", endpoint_url=s3_server)
    signed.clear()
    default.client.meta.events.register(
        "before-send", lambda request, **_: signed.append(request.headers.get("Authorization", b"").decode())
    )
    default.get("x")
    assert signed and "AKIACLUSTEREAST01" not in signed[0]  # the process's own keys
