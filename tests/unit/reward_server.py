"""A local HTTP reward server for the tests of reward functions that post to one (slime's ``remote_rm``, OpenRLHF's
``--remote_rm_url http://...``)."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


def serve(state: dict, answer: Callable[[Any], Any], port: int = 0) -> ThreadingHTTPServer:
    """A server on ``port`` (0: a free one) that records each POSTed JSON in ``state["posted"]`` and answers
    ``answer(payload)`` as JSON; the first ``state["fail_first"]`` requests get HTTP 503."""

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):  # http.server calls it by this name
            payload = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            state["posted"].append(payload)
            if len(state["posted"]) <= state["fail_first"]:
                self.send_response(503)
                self.end_headers()
                return
            body = json.dumps(answer(payload)).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    return httpd
