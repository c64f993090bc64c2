"""Serving a registered model artifact ourselves: the OpenAI-compatible model server behind
`serve_model` (local), the billing of its held accelerator time (hosting), and the base of our
small HTTP/1.1 servers (loopback_http)."""
