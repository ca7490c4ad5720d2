"""RFC 6455 framing for frames the hub sends (server to client: unmasked).

The hub frames each outbound message once and hands the same bytes to every
socket that gets it; a socket then writes everything queued for it in one
transport write.
"""

from __future__ import annotations

import struct

_FIN_TEXT = 0x81
_LEN16 = struct.Struct("!BBH")
_LEN64 = struct.Struct("!BBQ")


def text_frame(payload: bytes) -> bytes:
    n = len(payload)
    if n < 126:
        return bytes((_FIN_TEXT, n)) + payload
    if n < 65536:
        return _LEN16.pack(_FIN_TEXT, 126, n) + payload
    return _LEN64.pack(_FIN_TEXT, 127, n) + payload
