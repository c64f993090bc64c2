"""Text to token ids: UTF-8 bytes (the zero-setup default) or a ``tokenizer.json``.

A ``tokenizer.json`` is the serialised form of the ``tokenizers`` library (the file that ships
beside open-weights checkpoints: BPE for GPT-2 and Llama 3, and others); it is loaded from its
bytes, never fetched. Special tokens that the file's post-processor adds (Llama's BOS) are
added; the end-of-sequence id, when the model's config.json names one, is appended after each
document by the data stream (training.engine.stream).
"""

from __future__ import annotations

from typing import Protocol


class TokenizerError(ValueError):
    """A tokenizer file that cannot be loaded, or one that does not fit the model."""


class Tokenizer(Protocol):
    vocab_size: int
    eos_id: int | None

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: list[int]) -> str: ...


class ByteTokenizer:
    """UTF-8 bytes as tokens (vocab 256), the byte-level GPT's alphabet."""

    vocab_size = 256
    eos_id: int | None = None

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids: list[int]) -> str:
        return bytes(ids).decode("utf-8", errors="replace")


class JsonTokenizer:
    """A ``tokenizers`` tokenizer read from the bytes of a ``tokenizer.json``."""

    def __init__(self, data: bytes, *, eos_id: int | None = None) -> None:
        from tokenizers import Tokenizer as _Tokenizer  # lazily: only runs with a tokenizer need it

        try:
            self.inner = _Tokenizer.from_str(data.decode("utf-8"))
        except Exception as exc:  # bad UTF-8, or the library's own plain Exception for bad JSON
            raise TokenizerError(f"not a tokenizer.json: {exc}") from exc
        self.data = data
        self.vocab_size = int(self.inner.get_vocab_size(with_added_tokens=True))
        self.eos_id = eos_id

    def encode(self, text: str) -> list[int]:
        return list(self.inner.encode(text).ids)

    def decode(self, ids: list[int]) -> str:
        return str(self.inner.decode(ids))


def eos_from_config(extra: dict[str, object]) -> int | None:
    """The end-of-sequence id a config.json names (an int, or the first of a list), if any."""
    value = extra.get("eos_token_id")
    if isinstance(value, list) and value:
        value = value[0]
    return value if isinstance(value, int) and not isinstance(value, bool) else None
