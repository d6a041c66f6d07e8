"""An HTTP proxy in front of the S3 test server that injects storage faults.

Clients (s3fs/aiobotocore) talk to the proxy as if it were the S3 endpoint. For each request the
proxy consults a seeded plan and either forwards it, or: drops the connection without an answer,
delays it, answers 500 or 503, or sends the real headers with only part of the body (a truncated
read). Counts of every fault injected are kept so tests can assert them.

Only GET requests (reads) are faulted by default, so test data can be written through the proxy
before faults are switched on; `methods` widens that.
"""

from __future__ import annotations

import http.client
import random
import socket
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

FAULTS = ("drop", "delay", "500", "503", "truncate")


@dataclass
class FaultPlan:
    """Probability of each fault per request; the rest are forwarded untouched."""

    rates: dict[str, float] = field(default_factory=dict)
    seed: int = 0
    delay_s: float = 0.3
    methods: tuple[str, ...] = ("GET",)
    # Requests whose path contains one of these always fail (a file that stays unreadable).
    always_fail_paths: tuple[str, ...] = ()
    enabled: bool = True

    def __post_init__(self) -> None:
        unknown = set(self.rates) - set(FAULTS)
        if unknown:
            raise ValueError(f"unknown faults {sorted(unknown)}; allowed: {FAULTS}")
        self._rng = random.Random(self.seed)
        self._lock = threading.Lock()

    def choose(self, method: str, path: str) -> str:
        if not self.enabled or method not in self.methods:
            return "ok"
        if any(p in path for p in self.always_fail_paths):
            return "503"
        with self._lock:
            r = self._rng.random()
        acc = 0.0
        for fault in FAULTS:
            acc += self.rates.get(fault, 0.0)
            if r < acc:
                return fault
        return "ok"


class FaultProxy:
    """`with FaultProxy(upstream_port, plan) as proxy: proxy.endpoint_url` ..."""

    def __init__(self, upstream_host: str, upstream_port: int, plan: FaultPlan):
        self.upstream = (upstream_host, upstream_port)
        self.plan = plan
        self.counts: Counter[str] = Counter()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler_class())
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def endpoint_url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def __enter__(self) -> FaultProxy:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._server.shutdown()
        self._server.server_close()

    def _handler_class(self):
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:  # keep test output quiet
                pass

            def _forward(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else None
                fault = proxy.plan.choose(self.command, self.path)
                proxy.counts[fault] += 1
                if fault == "drop":
                    self.connection.shutdown(socket.SHUT_RDWR)
                    self.close_connection = True
                    return
                if fault in ("500", "503"):
                    msg = b"<Error><Code>InternalError</Code><Message>injected</Message></Error>"
                    if fault == "503":
                        msg = b"<Error><Code>SlowDown</Code><Message>injected</Message></Error>"
                    self.send_response(int(fault))
                    self.send_header("Content-Type", "application/xml")
                    self.send_header("Content-Length", str(len(msg)))
                    self.end_headers()
                    self.wfile.write(msg)
                    return
                if fault == "delay":
                    time.sleep(proxy.plan.delay_s)
                conn = http.client.HTTPConnection(*proxy.upstream, timeout=30)
                headers = {k: v for k, v in self.headers.items() if k.lower() != "host"}
                headers["Host"] = f"{proxy.upstream[0]}:{proxy.upstream[1]}"
                conn.request(self.command, self.path, body=body, headers=headers)
                resp = conn.getresponse()
                data = resp.read()
                conn.close()
                self.send_response(resp.status, resp.reason)
                for k, v in resp.getheaders():
                    if k.lower() not in ("transfer-encoding", "connection", "content-length"):
                        self.send_header(k, v)
                # A HEAD answer has no body but the object's real length (what clients take as its size).
                length = resp.getheader("Content-Length") if self.command == "HEAD" else None
                self.send_header("Content-Length", length or str(len(data)))
                self.end_headers()
                if fault == "truncate" and len(data) > 1:
                    self.wfile.write(data[: len(data) // 2])
                    self.wfile.flush()
                    self.connection.shutdown(socket.SHUT_RDWR)
                    self.close_connection = True
                    return
                if self.command != "HEAD":
                    self.wfile.write(data)

            do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _forward

        return Handler
