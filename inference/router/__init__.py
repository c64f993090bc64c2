"""The router: executes a workflow's current routing-policy version.

The order to try comes from the routing core (inference.router.policy, pure: no Django) over the
plan that inference.selectors loads and caches; this package makes the calls (adapters), keeps
the circuit breakers (inference.breaker.breakers), asks the budgets, retries, and has every attempt
recorded (inference.recording).

Public entry points, in inference.router.entry (used by the gateway, the eval runner and batch jobs):

    route(*, workflow, request, endpoint=Endpoint.CHAT, client_request_id=None, deadline_s=None,
          deployment=None) -> RouteResult     (deployment: call only that one, e.g. for evals)
    route_stream(*, workflow, request, endpoint=Endpoint.CHAT, deadline_s=None) -> RouteStream
        (iterate it for StreamChunk; .result once exhausted or closed)

Both record one InferenceRequest with every attempt, a UsageRecord per billed attempt and a
FailoverEvent per failed call that led to another (inference.recording.inference_request_record).
A request that fails on every deployment comes back with ok=False (recorded as failed);
BudgetExhausted is raised (after recording) when a hard budget of the spend is exhausted;
NoRoute when the workflow has no usable policy. With a client_request_id seen before, the stored
result is returned and nothing is called or billed again.

How a request moves along the route:
- the strategy orders the deployments (inference.router.policy.order_candidates); a deployment whose
  rolling quality is below the policy's floor is skipped;
- a deployment whose circuit is open is skipped; after its cooldown one request probes it;
- before each call the budget is asked (calls.hold_admission: billing.budgets.budget_admit, the
  hold released by the journal's fold or after an inline recording) when a hard-limit
  budget covers the spend; a refused call is not made (fail closed), and the route goes on only
  where another budget scope leaves room (another provider or cluster);
- a retryable error (connect error, timeout, 429, 5xx, malformed answer) moves on to the next
  deployment at once; when every deployment failed, the whole route is retried after a jittered
  exponential backoff while the deadline allows (at most INFERENCE_MAX_ROUNDS rounds);
- a non-retryable error caused by the request itself (400, 413, 422) stops at once; other 4xx
  (bad key, unknown model: the deployment's fault) move on without a retry of that deployment.

Modules: policy (the pure routing core: how a strategy orders the deployments), errors
(RouteResult and the refusals), context (the plan and the capable deployments), calls (walking
the route), finish (recording, replays), entry (route, route_stream). This file imports nothing,
so that the pure core loads without Django: import from the module that defines a name.
"""
