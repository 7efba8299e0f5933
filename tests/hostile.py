"""A hostile OpenAI-compatible server on loopback, for tests: each route answers what a test scripts,
including what no honest server sends (trickled bytes, redirects, lying lengths, garbage chunks, wrong
types, extreme numbers, silence).

    with HostileServer({"/v1/models": json_answer({"data": [{"id": "m"}]}),
                        "/tokenize": trickle(b'{"count": 3}', every_s=0.5)}) as srv:
        srv.url            # http://127.0.0.1:PORT
        srv.requests       # [(method, path, headers dict, body bytes)] as received

A route is a function ``(conn, request) -> None`` that writes to the socket ``conn`` (a closed socket or an
exception ends that exchange). Unknown paths get 404. Every connection runs in its own daemon thread, and
``close()`` (the context manager's exit) shuts the listener and every open connection, so no test waits on
a handler. Handlers that stall wait on ``srv.stopping`` (an Event), never on a bare sleep.
"""

from __future__ import annotations

import json
import socket
import threading
from dataclasses import dataclass, field


@dataclass
class Request:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes


@dataclass
class HostileServer:
    routes: dict
    host: str = "127.0.0.1"
    requests: list[Request] = field(default_factory=list)

    def __post_init__(self):
        self.stopping = threading.Event()
        self._sock = socket.socket()
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind((self.host, 0))
        self._sock.listen(64)
        self.port = self._sock.getsockname()[1]
        self.url = f"http://{self.host}:{self.port}"
        self._conns: list[socket.socket] = []
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def __enter__(self) -> HostileServer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        self.stopping.set()
        try:
            self._sock.close()
        except OSError:
            pass
        with self._lock:
            for c in self._conns:
                try:
                    c.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                c.close()

    def _accept(self) -> None:
        while not self.stopping.is_set():
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            with self._lock:
                self._conns.append(conn)
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        conn.settimeout(30)
        try:
            while not self.stopping.is_set():
                req = _read_request(conn)
                if req is None:
                    return
                self.requests.append(req)
                route = self.routes.get(req.path) or self.routes.get(req.path.split("?")[0])
                (route or status_answer(404, b'{"error": "not found"}'))(conn, req, self)
        except OSError:
            return
        finally:
            try:
                conn.close()
            except OSError:
                pass


def _read_request(conn: socket.socket) -> Request | None:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        if not chunk:
            return None
        data += chunk
        if len(data) > 1 << 20:
            return None
    head, _, rest = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    method, path, _ = (lines[0].split(" ", 2) + ["", ""])[:3]
    headers = {}
    for line in lines[1:]:
        k, _, v = line.partition(":")
        headers[k.strip().lower()] = v.strip()
    n = int(headers.get("content-length") or 0)
    while len(rest) < n:
        chunk = conn.recv(65536)
        if not chunk:
            break
        rest += chunk
    return Request(method, path, headers, rest[:n])


# ------------------------------------------------------------------------------------------ answers
def raw(data: bytes, keep_open: bool = False):
    """Send exactly ``data``; then close (or, with keep_open, stall until the server stops)."""
    def route(conn, req, srv):
        conn.sendall(data)
        if keep_open:
            srv.stopping.wait(120)
        conn.close()
    return route


def status_answer(status: int, body: bytes = b"", headers: dict | None = None, content_type="application/json"):
    def route(conn, req, srv):
        hdrs = {"Content-Type": content_type, "Content-Length": str(len(body)), **(headers or {})}
        head = f"HTTP/1.1 {status} X\r\n" + "".join(f"{k}: {v}\r\n" for k, v in hdrs.items()) + "\r\n"
        conn.sendall(head.encode() + body)
    return route


def json_answer(doc, status: int = 200):
    """``doc`` as JSON; a str is sent as it is (to send NaN, 1e999, 10**400 spelt out, or broken JSON)."""
    body = doc.encode() if isinstance(doc, str) else json.dumps(doc).encode()
    return status_answer(status, body)


def redirect(location: str, status: int = 302):
    return status_answer(status, b"", {"Location": location})


def trickle(body: bytes, every_s: float = 1.0, status: int = 200, head_too: bool = False):
    """A complete answer sent one byte every ``every_s`` (the headers too with head_too), forever if the
    client waits: the byte stream is cycled until the client hangs up or the server stops."""
    def route(conn, req, srv):
        head = (f"HTTP/1.1 {status} X\r\nContent-Type: application/json\r\n"
                "Transfer-Encoding: chunked\r\n\r\n").encode()
        if not head_too:
            conn.sendall(head)
            head = b""
        stream = head + b"".join(b"1\r\n" + bytes([c]) + b"\r\n" for c in (body * 1000))
        for i in range(len(stream)):
            if srv.stopping.wait(every_s):
                return
            conn.sendall(stream[i:i + 1])
    return route


def silent():
    """Accept, read the request, never answer."""
    def route(conn, req, srv):
        srv.stopping.wait(120)
    return route


def lying_length(announced: int, sent: bytes = b"{"):
    """Announce ``announced`` bytes, send ``sent``, go quiet."""
    def route(conn, req, srv):
        conn.sendall(f"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {announced}\r\n\r\n".encode()
                     + sent)
        srv.stopping.wait(120)
    return route


def flood(chunk: bytes = b"x" * 65536, status: int = 200, content_type="text/plain"):
    """An endless chunked body, as fast as the client reads it."""
    def route(conn, req, srv):
        conn.sendall(f"HTTP/1.1 {status} OK\r\nContent-Type: {content_type}\r\nTransfer-Encoding: chunked\r\n\r\n".encode())
        piece = f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n"
        while not srv.stopping.is_set():
            conn.sendall(piece)
    return route


def garbage_chunks():
    """A chunked body whose chunk sizes are not hexadecimal."""
    return raw(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
               b"zz\r\n{\"a\r\n0\r\n\r\n")
