"""The sockets the webhook pusher connects with: each is made only for an
address webhook_address.address_refusal admits.

aiohttp hands its `socket_factory` the address it is about to connect to,
after the name was resolved (and for an address literal too), so this is the
address actually connected to, whatever DNS said at the announce or says
now. A refused address fails that delivery attempt like a connection that
was refused (it is retried on the seed's schedule, then the sender is told);
nothing is sent to it.
"""

from __future__ import annotations

import errno
import socket

from hubd.wire.redsyn.webhook_address import address_refusal


class AddressRefused(OSError):
    """The webhook's host resolved to an address the hub does not contact."""


def guarded_socket_factory(allow_loopback: bool):
    def make_socket(addr_info) -> socket.socket:
        family, type_, proto, _, sockaddr = addr_info
        refused = address_refusal(sockaddr[0], allow_loopback)
        if refused is not None:
            raise AddressRefused(errno.EACCES, f"webhook address refused: {refused}")
        return socket.socket(family, type_, proto)
    return make_socket
