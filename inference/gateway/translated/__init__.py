"""APIs other than OpenAI's chat and completions, each a parse/respond pair on the chat pipeline:
`<api>_request` translates the API's body into the chat request it means (and refuses with a
400 naming the field what a chat route cannot carry); `<api>_answer` translates the chat answer,
plain or streamed, back into the API's own. The views (inference.gateway.views) hold one table
of them; the pipeline between (limits, routing, budgets, the ledger) is the chat request's.

- messages_*: Anthropic's Messages API (/v1/messages, /v1/messages/count_tokens);
- responses_*: OpenAI's Responses API (/v1/responses).
"""
