"""The OpenAI-compatible /v1 gateway: its views (views), who calls and which workflow they may
call (caller), its answers and OpenAI-style errors (responses), streamed answers (streaming), the
request bodies it accepts, checked in one place (openai_request over openai_body, pure Python,
shared with serve_model), its JSON error middleware (middleware) and its URLs (urls, at /v1/)."""
