"""The demo's two loopback "API providers" for its ticket-labelling workflow.

`make demo` has no network, so the cost-quality part of the demo (a build-or-buy panel and a
routing recommendation from replayed traffic) needs providers that answer well or badly in a
way a scorer can tell apart. Each provider here labels a support ticket with one of CATEGORIES:
it reads the ticket's keywords right, and is wrong on a fixed share of tickets, chosen by a hash
of the ticket (so a replay of a ticket gets the same answer again). demo_seed sets each one's
share and price.
Asked an inference.quality.scorers.judge_prompt, any of them grades like a judge that knows the truth.

The tickets themselves are generated from small word lists below (written for this demo).
"""

from __future__ import annotations

import hashlib
import json
import threading
from http.server import ThreadingHTTPServer
from typing import Any

from inference.serving.loopback_http import KeepAliveHandler

CATEGORIES = ("billing", "login", "shipping", "refund", "bug")
# Words a ticket of each category uses; a labeller that reads them gets the category right.
_KEYWORDS = {
    "billing": ("invoice", "charged twice", "card was declined", "VAT number"),
    "login": ("password reset", "two-factor code", "locked out", "SSO login"),
    "shipping": ("parcel", "tracking number", "courier", "delivery address"),
    "refund": ("money back", "refunded", "return label", "cancelled order"),
    "bug": ("error 500", "app crashes", "button does nothing", "blank page"),
}
_OPENERS = ("Hi team,", "Hello,", "Urgent:", "Quick question:", "Good morning,")
_CLOSERS = ("Thanks.", "Please help.", "Order A-{n}.", "Customer since 2019.", "Regards, Sam.")
PROMPT_PREFIX = "Label this support ticket with one word (billing, login, shipping, refund, bug):\n"


def demo_ticket(n: int) -> tuple[str, str]:
    """The n-th demo ticket and its true category (deterministic)."""
    category = CATEGORIES[n % len(CATEGORIES)]
    words = _KEYWORDS[category]
    keyword = words[(n // len(CATEGORIES)) % len(words)]
    opener = _OPENERS[(n * 7) % len(_OPENERS)]
    closer = _CLOSERS[(n * 3) % len(_CLOSERS)].format(n=1000 + n)
    return f"{opener} my {keyword} issue again, ticket {n}. {closer}", category


def ticket_prompt(ticket: str) -> str:
    return PROMPT_PREFIX + ticket


def label(text: str, *, error_share: float) -> str:
    """The category a labeller gives `text`: right by keyword, wrong on a share of tickets."""
    # Only the ticket counts: the instruction before it names every category.
    lowered = text.removeprefix(PROMPT_PREFIX).lower()
    truth = next(
        (c for c in CATEGORIES if any(k.lower() in lowered for k in _KEYWORDS[c])),
        CATEGORIES[0],
    )
    # The hash is of the ticket alone, so the labellers' mistakes are nested: a ticket one
    # labeller gets wrong, every labeller with a larger share gets wrong the same way (they
    # stumble on the same hard tickets, as models of one family tend to).
    digest = hashlib.sha256(text.encode()).digest()
    if int.from_bytes(digest[:4], "big") / 2**32 < error_share:
        return CATEGORIES[(CATEGORIES.index(truth) + 1 + digest[4] % (len(CATEGORIES) - 1)) % len(CATEGORIES)]
    return truth


JUDGE_PREAMBLE = "You are grading an answer."


def judge(text: str) -> str:
    """The demo judge's verdict on an inference.quality.scorers.judge_prompt: "1" when the graded answer
    is the ticket's true category, else "0" (it reads keywords without error)."""
    question = text.partition("Question:\n")[2].partition("\n\n")[0]
    graded = text.rpartition("Answer to grade:\n")[2].strip().lower()
    return "1" if graded == label(question, error_share=0.0) else "0"


def _prompt_text(body: dict[str, Any]) -> str:
    messages = body.get("messages")
    if isinstance(messages, list):
        for message in reversed(messages):
            if isinstance(message, dict) and message.get("role") == "user":
                content = message.get("content")
                return content if isinstance(content, str) else json.dumps(content)
    prompt = body.get("prompt")
    return prompt if isinstance(prompt, str) else ""


class _LabelHandler(KeepAliveHandler):
    server: LabelProvider

    def _send(self, status: int, doc: dict[str, Any]) -> None:
        body = json.dumps(doc).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:  # noqa: N802 (stdlib naming)
        if self.path.rstrip("/").endswith("/models"):
            self._send(200, {"object": "list", "data": [{"id": self.server.name, "object": "model"}]})
        else:
            self._send(404, {"error": {"message": "not found"}})

    def do_POST(self) -> None:  # noqa: N802 (stdlib naming)
        length = int(self.headers.get("Content-Length") or 0)
        try:
            body = json.loads(self.rfile.read(length) or b"{}")
        except ValueError:
            self._send(400, {"error": {"message": "body is not JSON", "type": "invalid_request_error"}})
            return
        chat = self.path.endswith("/chat/completions")
        if not chat and not self.path.endswith("/completions"):
            self._send(404, {"error": {"message": "unknown path"}})
            return
        if body.get("stream"):
            self._send(
                400,
                {"error": {"message": "this demo provider does not stream", "type": "invalid_request_error"}},
            )
            return
        prompt = _prompt_text(body)
        if prompt.startswith(JUDGE_PREAMBLE):
            answer = judge(prompt)
        else:
            answer = label(prompt, error_share=self.server.error_share)
        with self.server.lock:
            self.server.calls += 1
        # Roughly 4 characters a token, as English text tokenises.
        usage = {"prompt_tokens": max(1, len(prompt) // 4), "completion_tokens": 2}
        usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]
        choice: dict[str, Any] = (
            {"index": 0, "message": {"role": "assistant", "content": answer}, "finish_reason": "stop"}
            if chat
            else {"index": 0, "text": answer, "finish_reason": "stop", "logprobs": None}
        )
        self._send(
            200,
            {
                "id": f"{self.server.name}-{self.server.calls}",
                "object": "chat.completion" if chat else "text_completion",
                "created": 0,
                "model": self.server.name,
                "choices": [choice],
                "usage": usage,
            },
        )


class LabelProvider(ThreadingHTTPServer):
    """One labelling provider on loopback, served from a daemon thread of the demo process."""

    daemon_threads = True

    def __init__(self, *, name: str, error_share: float, port: int = 0) -> None:
        super().__init__(("127.0.0.1", port), _LabelHandler)
        self.name = name
        self.error_share = error_share
        self.calls = 0
        self.lock = threading.Lock()

    @property
    def port(self) -> int:
        return int(self.server_address[1])

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def start(self) -> LabelProvider:
        threading.Thread(target=self.serve_forever, name=f"demo-{self.name}", daemon=True).start()
        return self

    def stop(self) -> None:
        self.shutdown()
        self.server_close()
