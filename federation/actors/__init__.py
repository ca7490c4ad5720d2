"""Federation's actors: each owns its state, reads one inbox and talks to the
others (and to the Router) only by messages.

PeerLink (one per peer hub: the socket, its outbound buffer and writer loop,
the answers it correlates), ForwardOutbox (one per message peer), the
per-peer DeliverySender, the ClaimForwarder and the WatchFollowers. What
runs inside Router commands is in federation/handlers/.
"""
