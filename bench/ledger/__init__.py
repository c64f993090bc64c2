"""`manage.py bench ledger`: the ledger at scale on a scratch database (run), and its concurrent
writers (writers)."""
