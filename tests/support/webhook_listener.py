"""A webhook endpoint on loopback for tests: records every TCP connection it
accepts and every delivery (with whether it was genuine by the seed's
check), and answers with the status (and headers) it is told."""

from __future__ import annotations

import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from hubd.wire.redsyn import webhook


class Hook:
    def __init__(self, secret: str = "a-long-webhook-secret", status: int = 200,
                 headers: dict | None = None):
        self.secret, self.status, self.headers = secret, status, headers or {}
        self.deliveries: list = []
        self.connections: list = []  # peer addresses, one per TCP connection accepted
        hook = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers["Content-Length"]))
                headers = {k.lower(): v for k, v in self.headers.items()}
                hook.deliveries.append((headers, body, webhook.genuine(
                    headers, body, hook.secret, time.time())))
                self.send_response(hook.status)
                for name, value in hook.headers.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", "0")
                self.end_headers()

            do_GET = do_POST

            def log_message(self, *args):
                pass

        class Server(ThreadingHTTPServer):
            def verify_request(self, request, client_address):
                hook.connections.append(client_address)
                return True

        self.server = Server(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
