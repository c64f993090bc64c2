"""The base of our small HTTP/1.1 servers (serve_model, the bench's mock provider, test servers)."""

from __future__ import annotations

import socket
from http.server import BaseHTTPRequestHandler
from typing import Any


class KeepAliveHandler(BaseHTTPRequestHandler):
    """HTTP/1.1 keep-alive, TCP_NODELAY, and no access log on stderr."""

    protocol_version = "HTTP/1.1"

    def setup(self) -> None:
        super().setup()
        # Headers and body go out in separate writes: without TCP_NODELAY the second waits
        # for the client's delayed ACK (Nagle), some 40 ms per request.
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (stdlib signature)
        """Silent: these servers answer thousands of requests a second in benches and tests."""
