"""REDSYN (seed 003), sans-IO: no sockets, no asyncio, no clock.

  canonical  RFC 8785 canonical JSON
  envelope   addresses, envelope v1 validation, typed errors, limits
  signing    Ed25519 node signatures over the seed's signed fields
  e2e        P-256 / HKDF / AES-GCM sealing (the hub never opens; nodes do)
  webhook    Redsyn-Signature, genuine(), the retry schedule, webhook URL rules

The mailbox state is hubd/state/redsyn.py; the HTTP door hubd/doors/redsyn/.
See docs/redsyn.md.
"""
