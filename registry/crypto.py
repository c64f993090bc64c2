"""Encryption at rest for provider credentials (Fernet: AES-128-CBC + HMAC-SHA256)."""

from __future__ import annotations

import base64

from cryptography.fernet import Fernet, InvalidToken
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from django.conf import settings


class CredentialsUnreadable(Exception):
    """The stored credentials cannot be decrypted with the configured key."""


def _fernet() -> Fernet:
    configured: str = settings.CREDENTIALS_KEY
    if configured:
        return Fernet(configured.encode())
    # Derive a dedicated key from SECRET_KEY rather than using it directly, so
    # the two purposes never share key material.
    derived = HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=b"switchyard-credentials").derive(
        settings.SECRET_KEY.encode()
    )
    return Fernet(base64.urlsafe_b64encode(derived))


def encrypt_secret(plaintext: str) -> str:
    return _fernet().encrypt(plaintext.encode()).decode()


def decrypt_secret(token: str) -> str:
    try:
        return _fernet().decrypt(token.encode()).decode()
    except InvalidToken:
        raise CredentialsUnreadable(
            "stored credentials cannot be decrypted: was SECRET_KEY or CREDENTIALS_KEY changed?"
        ) from None
