#!/usr/bin/env python3
"""Verify a Switchyard cost export with its public key alone (needs only `cryptography`).

python verify_export.py KEY.pem DIR/manifest.json   (the files lie beside the manifest)
"""

import base64
import hashlib
import json
import sys
from pathlib import Path

from cryptography.hazmat.primitives.serialization import load_pem_public_key

key_pem, manifest_path = Path(sys.argv[1]).read_bytes(), Path(sys.argv[2])
manifest = json.loads(manifest_path.read_bytes())
signature = manifest.pop("signature", {})
body = json.dumps(manifest, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()
try:  # Ed25519 over the manifest without its signature, as canonical JSON
    load_pem_public_key(key_pem).verify(base64.b64decode(signature["value"]), body)
except Exception as exc:  # noqa: BLE001 (any failure means: not verified)
    sys.exit(
        f"FAIL: manifest signature ({signature.get('algorithm')}, key {signature.get('key_id')}): {exc!r}"
    )
for name, meta in manifest["files"].items():
    with (manifest_path.parent / Path(name).name).open("rb") as fh:
        matches = (
            hashlib.file_digest(fh, "sha256").hexdigest() == meta["sha256"] and fh.tell() == meta["size"]
        )
    if not matches:
        sys.exit(f"FAIL: {name} differs from the signed manifest (sha256 or size)")
print(f"OK: signed by key {signature['key_id']}; {len(manifest['files'])} files match the manifest")
