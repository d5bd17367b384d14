"""A recording HTTP server on 127.0.0.1, the upstream host of the egress tests (sandboxed and gateway kernels)."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Upstream:
    """An HTTP server on 127.0.0.1 that records every connection and request it gets."""

    def __init__(self, body: bytes = b"ok from upstream\n", port: int = 0):
        self.requests: list[dict] = []
        self.connections = 0
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def setup(self):
                outer.connections += 1
                super().setup()

            def do_GET(self):
                outer.requests.append({"method": "GET", "path": self.path, "headers": dict(self.headers)})
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_POST = do_GET

            def log_message(self, *a):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> "Upstream":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(5)


# kernel code's fetch, as the egress tests run it in a kernel: [status, body], or [0, the error] when none came
FETCH = """
import json, urllib.request, urllib.error
def fetch(url):
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return [r.status, r.read().decode()]
    except urllib.error.HTTPError as e:
        return [e.code, e.read().decode()]
    except OSError as e:
        return [0, repr(e)]
"""
