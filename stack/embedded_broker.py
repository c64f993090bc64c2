"""The embedded broker: Kombu's filesystem transport with atomic message writes.

Kombu's filesystem transport creates a message file and then writes into it,
while a consumer in another process may already have moved that file away and
read it empty; the consumer then dies on a JSON decode error (seen in the demo
with beat publishing every few seconds). Here a message is written to a hidden
temporary file in the same folder and renamed into place, which is atomic, so
a consumer only ever sees complete messages. Everything else is Kombu's.
"""

from __future__ import annotations

import os
import tempfile
import uuid
from time import monotonic
from typing import Any

from kombu.exceptions import ChannelError
from kombu.transport import TRANSPORT_ALIASES, filesystem
from kombu.utils.encoding import str_to_bytes
from kombu.utils.json import dumps


class Channel(filesystem.Channel):
    def _put(self, queue: str, payload: Any, **kwargs: Any) -> None:  # type: ignore[override]
        # Same name scheme as Kombu, so consumers sort and filter as before; the
        # temporary name starts with "." and never matches "<queue>.msg".
        name = f"{int(round(monotonic() * 1000))}_{uuid.uuid4()}.{queue}.msg"
        folder = self.data_folder_out
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=".tmp-")
        try:
            with os.fdopen(fd, "wb") as handle:
                handle.write(str_to_bytes(dumps(payload)))
            os.replace(tmp, os.path.join(folder, name))
        except OSError as exc:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise ChannelError(f"Cannot add message {name!r} to {folder!r}") from exc


class Transport(filesystem.Transport):
    Channel = Channel


def install() -> None:
    """Make `filesystem://` URLs use this transport in this process."""
    TRANSPORT_ALIASES["filesystem"] = "stack.embedded_broker:Transport"
