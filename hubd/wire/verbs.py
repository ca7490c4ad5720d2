"""The wire vocabulary: frame types a client may send (used to bound metric
labels; the Router's handler table decides what is actually served)."""

CLIENT_TYPES = frozenset({
    "chat", "heartbeat", "ack",
    "who_request", "state_request", "history_request", "resume_request",
    "claim", "release", "task_update", "handoff", "checkpoint", "wait_request", "resource",
    "ledger_task", "ledger_task_update", "ledger_progress", "board_request",
    "advertise", "manifest_request",
    "delivery_request", "delivery_status_request", "delivery_cancel",
    "delivery_boundary", "delivery_ack", "delivery_outcome",
    "multihub_message_forward", "multihub_log_request", "multihub_claim_request",
})

KNOWN_TYPES = CLIENT_TYPES
