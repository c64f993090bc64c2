"""`manage.py bench gateway`: what the router and the /v1 gateway add on top of a provider call
(run, which explains every figure), the gateway under gunicorn with its CPU per request (server,
over proc_stat), the metrics' cost (metrics_cost) and the bench's HTTP client (client)."""
