"""Ed25519 keys for export manifests: the signing key, the public key set, key ids, signatures.

An auditor checks a manifest with a public key alone (scripts/verify_export.py); rotating the
signing key keeps old exports verifiable because retired public keys stay in the key set,
served at /.well-known/switchyard-export-keys.json and printed by `manage.py export public-key`.
Manifests signed before Ed25519 carry an HMAC-SHA256 signature under EXPORT_SIGNING_KEY; those
still verify on the server (billing.exports.manifest), never with a public key.
"""

from __future__ import annotations

import base64
import hashlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

ALGORITHM = "Ed25519"
DEVELOPMENT_KEY_NAME = "export-ed25519.pem"


@dataclass(frozen=True)
class ExportPublicKey:
    key_id: str
    public_key: Ed25519PublicKey
    status: str  # "current" signs new exports; "retired" only checks old ones

    def pem(self) -> str:
        return self.public_key.public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        ).decode()

    def as_json(self) -> dict[str, str]:
        raw = self.public_key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
        return {
            "key_id": self.key_id,
            "algorithm": ALGORITHM,
            "status": self.status,
            "public_key": base64.b64encode(raw).decode(),
            "public_key_pem": self.pem(),
        }


def export_key_id(public_key: Ed25519PublicKey) -> str:
    """The first 16 hex digits of the SHA-256 of the raw 32-byte public key."""
    raw = public_key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return hashlib.sha256(raw).hexdigest()[:16]


def _private_key_from_pem(pem: bytes, where: str) -> Ed25519PrivateKey:
    try:
        key = serialization.load_pem_private_key(pem, password=None)
    except (ValueError, TypeError) as exc:
        raise ImproperlyConfigured(f"{where} is not an unencrypted PEM private key: {exc}") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise ImproperlyConfigured(f"{where} is not an Ed25519 key")
    return key


def _development_key(path: Path) -> Ed25519PrivateKey:
    """The embedded demo's key: made once under var/ (mode 0600) and kept, so its exports stay verifiable."""
    if not path.exists():
        pem = Ed25519PrivateKey.generate().private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
        # O_EXCL: two processes starting at once keep the first one's key.
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            pass
        else:
            with os.fdopen(fd, "wb") as fh:
                fh.write(pem)
    return _private_key_from_pem(path.read_bytes(), str(path))


def export_signing_private_key() -> Ed25519PrivateKey:
    """EXPORT_ED25519_KEY (PEM text), else EXPORT_ED25519_KEY_FILE, else (not in production) var/'s key."""
    pem: str = settings.EXPORT_ED25519_KEY
    if pem:
        return _private_key_from_pem(pem.encode(), "EXPORT_ED25519_KEY")
    key_file: str = settings.EXPORT_ED25519_KEY_FILE
    if key_file:
        try:
            return _private_key_from_pem(Path(key_file).read_bytes(), key_file)
        except OSError as exc:
            raise ImproperlyConfigured(f"EXPORT_ED25519_KEY_FILE {key_file}: {exc.strerror or exc}") from None
    if settings.PRODUCTION:
        raise ImproperlyConfigured(
            "export signing needs EXPORT_ED25519_KEY or EXPORT_ED25519_KEY_FILE in production "
            "(an Ed25519 private key in PEM; see docs/billing.md, Verifying an export)"
        )
    return _development_key(Path(settings.VAR_DIR) / DEVELOPMENT_KEY_NAME)


def _retired_keys() -> list[Ed25519PublicKey]:
    keys = []
    for name in settings.EXPORT_RETIRED_PUBLIC_KEYS:
        try:
            key = serialization.load_pem_public_key(Path(name).read_bytes())
        except (OSError, ValueError) as exc:
            raise ImproperlyConfigured(f"EXPORT_RETIRED_PUBLIC_KEYS: {name}: {exc}") from None
        if not isinstance(key, Ed25519PublicKey):
            raise ImproperlyConfigured(f"EXPORT_RETIRED_PUBLIC_KEYS: {name} is not an Ed25519 public key")
        keys.append(key)
    return keys


def export_public_keys() -> list[ExportPublicKey]:
    """The current key first, then each retired one (a key listed twice appears once)."""
    current = export_signing_private_key().public_key()
    keys = [ExportPublicKey(export_key_id(current), current, "current")]
    for key in _retired_keys():
        key_id = export_key_id(key)
        if all(k.key_id != key_id for k in keys):
            keys.append(ExportPublicKey(key_id, key, "retired"))
    return keys


def export_public_keys_json() -> dict[str, Any]:
    return {"algorithm": ALGORITHM, "keys": [key.as_json() for key in export_public_keys()]}


def public_keys_from_pem_files(paths: list[Path]) -> list[ExportPublicKey]:
    """Public keys an auditor holds (PEM files), for checking without the server's configuration."""
    keys = []
    for path in paths:
        key = serialization.load_pem_public_key(path.read_bytes())
        if not isinstance(key, Ed25519PublicKey):
            raise ValueError(f"{path} is not an Ed25519 public key")
        keys.append(ExportPublicKey(export_key_id(key), key, "given"))
    return keys


def ed25519_sign(body: bytes) -> dict[str, str]:
    """The signature block of a manifest whose canonical body is `body`."""
    key = export_signing_private_key()
    return {
        "algorithm": ALGORITHM,
        "key_id": export_key_id(key.public_key()),
        "value": base64.b64encode(key.sign(body)).decode(),
    }


def ed25519_check(body: bytes, signature: dict[str, Any], keys: list[ExportPublicKey]) -> tuple[bool, str]:
    """(ok, why) for an Ed25519 signature block over `body`, checked with the key its key_id names."""
    key_id = str(signature.get("key_id", ""))
    key = next((k for k in keys if k.key_id == key_id), None)
    if key is None:
        known = ", ".join(k.key_id for k in keys) or "none"
        return False, f"signed by key {key_id or '(none)'}, which is not among the public keys ({known})"
    try:
        key.public_key.verify(base64.b64decode(str(signature.get("value", "")), validate=True), body)
    except (InvalidSignature, ValueError):
        return False, f"Ed25519 signature does not match key {key_id}: the manifest was changed"
    return True, f"Ed25519 signature matches key {key_id} ({key.status})"
