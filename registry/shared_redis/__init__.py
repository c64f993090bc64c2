"""Redis as every app reaches it: one client per URL and timeout in each process (`client`), and
the generation counters that tell every process to drop a cache (`generation`)."""
