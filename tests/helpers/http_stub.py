"""A local HTTP server in a thread, for tests of the clients that call one (remote rewards and
enhancers)."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class StubHandler(BaseHTTPRequestHandler):
    """A handler with a JSON-or-bytes reply helper that keeps pytest's output clean."""

    def send(self, code: int, payload: dict | bytes, kind: str = "application/json") -> None:
        data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
        self.send_response(code)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


@contextmanager
def serving(handler: type[StubHandler], on_close: Callable[[ThreadingHTTPServer], None]
            | None = None, **state) -> Iterator[ThreadingHTTPServer]:
    """``handler`` served on 127.0.0.1 (a free port) with ``state`` set on the server; shut
    down after ``on_close`` (e.g. releasing a hung request) when the block ends."""
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    httpd.daemon_threads = True
    for key, value in state.items():
        setattr(httpd, key, value)
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05})
    thread.start()
    try:
        yield httpd
    finally:
        if on_close is not None:
            on_close(httpd)
        httpd.shutdown()
        httpd.server_close()
        thread.join(timeout=5)
