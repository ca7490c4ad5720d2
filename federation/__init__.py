"""What crosses sites: peer links, forward outbox, serving policy, pins, merge and fold."""
