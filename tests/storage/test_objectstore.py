"""The file:// store and URL parsing (the s3:// store is tested against moto's server)."""

from __future__ import annotations

import pytest

from storage.objectstore import FileStore, ObjectNotFoundError, open_store


def test_the_file_store_puts_gets_lists_and_writes_once(tmp_path):
    store = open_store(f"file://{tmp_path}/objects")
    assert isinstance(store, FileStore)
    for key in ("runs/1/a", "runs/1/b", "runs/2/a", "runsx"):
        store.put(key, key.encode())
    assert store.get("runs/1/b") == b"runs/1/b"
    assert store.list("runs/1/") == ["runs/1/a", "runs/1/b"]
    assert store.list("runs") == ["runs/1/a", "runs/1/b", "runs/2/a", "runsx"]
    assert store.list("missing/") == []
    assert store.put_if_absent("runs/1/a", b"other") is False
    assert store.get("runs/1/a") == b"runs/1/a"
    assert store.put_if_absent("runs/3/a", b"new") is True and store.exists("runs/3/a")
    assert not any(".tmp-" in k for k in store.list())
    with pytest.raises(ObjectNotFoundError):
        store.get("runs/9/z")
    store.delete("runs/1/a")
    store.delete("runs/1/a")  # deleting twice is harmless
    assert store.list("runs/1/") == ["runs/1/b"]


@pytest.mark.parametrize("key", ["", "/abs", "a/../b"])
def test_keys_that_could_escape_the_store_are_refused(tmp_path, key):
    with pytest.raises(ValueError, match="bad object key"):
        open_store(f"file://{tmp_path}").put(key, b"x")


@pytest.mark.parametrize("url", ["http://example.com/x", "s3://", "gs://bucket"])
def test_unsupported_urls_are_refused(url):
    with pytest.raises(ValueError):
        open_store(url)


def test_a_file_store_copies_a_file_in_and_streams_it_out_in_blocks(tmp_path):
    store = open_store(f"file://{tmp_path / 'store'}")
    source = tmp_path / "big.bin"
    source.write_bytes(bytes(range(256)) * 1000)  # 256,000 bytes
    store.put_file("exports/1/big.bin", source)
    blocks = list(store.iter_chunks("exports/1/big.bin", block=100_000))
    assert [len(b) for b in blocks] == [100_000, 100_000, 56_000]
    assert b"".join(blocks) == source.read_bytes()
    assert not any(".tmp-" in k for k in store.list())


def test_streaming_a_missing_object_fails_before_the_first_read(tmp_path):
    store = open_store(f"file://{tmp_path}")
    with pytest.raises(ObjectNotFoundError):
        store.iter_chunks("exports/9/missing.csv")
