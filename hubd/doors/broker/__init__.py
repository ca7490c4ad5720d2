"""The local broker door (seed 004): NDJSON over a 0600 Unix socket. See docs/broker.md."""
