"""One streamed request to an OpenAI-compatible server, timed: TTFT, every inter-chunk gap, E2E.

The load generator speaks HTTP/1.1 itself (``Pool``: asyncio protocols, keep-alive, a byte scan of each
SSE chunk) so that it costs little CPU per streamed token and timestamps each chunk when it arrives: the
timing is the server's, not the client's queueing. Every failure becomes a RequestResult with
``ok=False`` and a short error; nothing here raises for a bad response. The server is not trusted: what it
holds of an answer is bounded (an SSE event, a chunk, the text chunks of one request), every number it
sends is read through ``infertool.net``'s ``count``, and an answer that breaks the rules is a counted
``bad response``, never an exception. The few control calls (the model list, /tokenize) go through
``infertool.net``: no redirect followed, a deadline per call, a small body.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from infertool import net
from infertool.bench.metrics import RequestResult
from infertool.bench.results import JsonObject
from infertool.serve.launcher import listed_ids

if TYPE_CHECKING:
    import ssl


@dataclass
class Endpoint:
    """The server a load generator sends to: its /v1 URL, model, endpoint kind and request settings."""

    base_url: str  # ends with /v1
    model: str
    endpoint: str = "completions"  # "completions" | "chat"
    api_key: str | None = None
    ignore_eos: bool = True
    temperature: float = 0.0
    # vLLM's prefix-cache salt (at most 128 characters, none of @ / \\): requests with another salt share no cached
    # block, so a level measured with its own salt starts from a cold cache (None: not sent)
    cache_salt: str | None = None

    @property
    def root(self) -> str:
        return self.base_url.removesuffix("/v1")

    def headers(self) -> dict[str, str]:
        h = {"Content-Type": "application/json"}
        if self.api_key:
            h["Authorization"] = f"Bearer {self.api_key}"
        return h


def normalise_url(url: str) -> str:
    """http://host:port[/v1][/] -> http://host:port/v1"""
    url = url.strip().rstrip("/")
    if not url.startswith(("http://", "https://")):
        from infertool.errors import UsageError

        raise UsageError(f"--url must start with http:// or https://, got {url!r}",
                         hint="e.g. --url http://127.0.0.1:8000/v1")
    return url if url.endswith("/v1") else url + "/v1"


def request_body(target: Endpoint, prompt: "str | list[JsonObject]", max_tokens: int, stream: bool = True) -> JsonObject:
    body: JsonObject = {"model": target.model, "max_tokens": max_tokens, "temperature": target.temperature,
                  "stream": stream}
    if stream:
        body["stream_options"] = {"include_usage": True}
    if target.ignore_eos:
        body["ignore_eos"] = True  # vLLM's extension: exactly max_tokens tokens, comparable runs
    if target.cache_salt is not None:
        body["cache_salt"] = target.cache_salt
    if target.endpoint == "chat":  # a list: a multi-turn session's messages so far
        body["messages"] = prompt if isinstance(prompt, list) else [{"role": "user", "content": prompt}]
    else:
        body["prompt"] = prompt
    return body


def _chunk_token(choices: Any, endpoint: str) -> str | None:  # Any: a parsed JSON value
    """The text of the token a parsed chunk's ``choices`` carry, None for none. A chunk with an empty text can still
    carry a token: an empty string mid-stream (no finish_reason; for chat, not the role header) is returned as "".
    vLLM sends one for a token whose text is empty (a special token the detokenizer skips, like SmolLM2's
    ``<|im_end|>`` ending a completion, or the first bytes of a multi-byte character) and vLLM's bench times it
    as a token: so the first token's time (TTFT) is the first such chunk."""
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        return None
    c = choices[0]
    if endpoint == "chat":
        delta = c.get("delta") or {}
        if not isinstance(delta, dict):
            return None
        parts = (delta.get("content"), delta.get("reasoning_content"))
        text, empty = str(parts[0] or "") + str(parts[1] or ""), "role" not in delta and "" in parts
    else:
        raw = c.get("text")
        text, empty = str(raw or ""), raw == ""
    return text if text else ("" if empty and c.get("finish_reason") is None else None)


# ------------------------------------------------------------------------------------------ the wire
# A minimal HTTP/1.1 client on asyncio's (buffered) Protocol API: the bytes of a response are parsed in
# buffer_updated (no task switch per chunk), every SSE event is timestamped with the arrival of the read
# that carried it, and a chunk is JSON-parsed only when a byte scan cannot tell whether it carries text
# (usage, errors and unusual layouts are parsed). Keep-alive connections are pooled per server.
READ_TIMEOUT_S = 300.0  # no byte for this long: the request fails (a total deadline applies as well)
CONNECT_TIMEOUT_S = 30.0
_ERR_BODY_MAX = 4096
MAX_EVENT_BYTES = 8 * 1024 * 1024  # one SSE event (or one HTTP chunk) held before it is complete
EXTRA_CHUNKS = 16  # text chunks beyond max_tokens a stream may carry before it is a bad response
_HEAD, _BODY_CHUNK_SIZE, _BODY_CHUNK_DATA, _BODY_LENGTH, _BODY_CLOSE, _TRAILER, _DONE = range(7)


ABSENT, NULL, TEXT, OTHER, EMPTY = -1, 0, 1, 2, 3  # what a key holds, by _field's byte scan


def _field(payload: bytes, key: bytes) -> int:
    """What the JSON ``key`` (with quotes) holds in ``payload``, by a byte scan: -1 absent, 0 null, 1 a
    non-empty string, 2 something else (parse to know), 3 an empty string."""
    i = payload.find(key)
    while i >= 0:
        j = i + len(key)
        c = payload[j:j + 1]
        if c == b":":  # the usual compact layout
            c = payload[j + 1:j + 2]
            if c == b'"':
                return EMPTY if payload[j + 2:j + 3] == b'"' else TEXT
            if c == b"n":
                return 0 if payload.startswith(b"null", j + 1) else 2
            if c not in b" \t":
                return 2
        rest = payload[j:].lstrip(b" \t")  # spaces around the colon
        if rest[:1] == b":":
            rest = rest[1:].lstrip(b" \t")
            if rest[:1] == b'"':
                return EMPTY if rest[1:2] == b'"' else TEXT
            return 0 if rest.startswith(b"null") else 2
        i = payload.find(key, i + 1)
    return -1


_RANK = {ABSENT: 0, NULL: 1, EMPTY: 2, OTHER: 3, TEXT: 4}  # which of two fields says more (text wins)

READ_BUFFER = 65536  # bytes per connection, read into again and again


class _Conn(asyncio.BufferedProtocol):
    """One keep-alive connection; parses the response of the exchange in flight as bytes arrive.

    Reads go into the connection's own buffer (asyncio's recv_into). Python 3.11's plain Protocol receives
    each read as a fresh 256 KiB bytes object, which glibc may serve with mmap (its threshold adapts to what
    the process freed before, so it depends on what was imported): then every read faults its pages in again,
    and at high concurrency the client itself becomes the bottleneck it measures (the figures, before and
    after: README.md's "Measured speed" and docs/development.md)."""

    def __init__(self) -> None:
        self.transport: Any = None  # Any: asyncio's transport (set by connection_made; a test's stand-in)
        self.closed = False
        self.ex: "_Exchange | None" = None
        self._view = memoryview(bytearray(READ_BUFFER))

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport

    def get_buffer(self, sizehint: int) -> memoryview:
        return self._view

    def buffer_updated(self, nbytes: int) -> None:
        ex = self.ex
        if ex is None:  # bytes nobody asked for: this connection cannot be trusted again
            self.closed = True
            self.transport.close()
            return
        try:
            ex.feed(bytes(self._view[:nbytes]), time.perf_counter())
        except Exception as exc:  # noqa: BLE001 - an answer no rule below foresaw: counted, never raised
            ex._fail(f"bad response: {type(exc).__name__} while reading the answer")

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.ex is not None:
            self.ex.eof(exc)


class _Exchange:
    """One request's response: HTTP framing (content-length, chunked or until close), then SSE events."""

    __slots__ = ("fut", "endpoint", "state", "buf", "status", "keep_alive", "need", "sse", "cr", "rx", "last_rx",
                 "err_body", "times", "usage", "error", "done_marker", "max_chunks", "texts")

    def __init__(self, fut: asyncio.Future[float], endpoint: str, started: float, max_chunks: int = 10**9) -> None:
        self.fut, self.endpoint = fut, endpoint
        self.max_chunks = max_chunks  # text chunks beyond this: a bad response (it asked for fewer tokens)
        self.state = _HEAD
        self.buf = b""
        self.status = 0
        self.keep_alive = True
        self.need = 0
        self.sse = b""
        self.cr = False
        self.rx = 0  # bytes received
        self.last_rx = started
        self.err_body = b""
        self.times: list[float] = []  # arrival of every chunk that carried a token (text, or a textless one: _chunk_token)
        self.usage = None
        self.error: str | None = None
        self.done_marker = False
        self.texts: list[str] | None = None  # the reply's text pieces, when the caller keeps them (multi-turn)

    # ---- framing
    def feed(self, data: bytes, now: float) -> None:
        if self.state == _DONE:  # bytes after the answer (or after a failure): nothing is kept
            return
        self.rx += len(data)
        self.last_rx = now
        # the usual read of a stream: exactly one HTTP chunk holding one one-line SSE event
        if self.state == _BODY_CHUNK_SIZE and not self.buf and not self.sse and not self.cr and self.status == 200:
            i = data.find(b"\r\n", 0, 10)
            if i > 0 and data.endswith(b"\n\n\r\n") and data.startswith(b"data:", i + 2) \
                    and data.find(b"\n", i + 2) == len(data) - 4 and b"\r" not in data[i + 2:-2]:
                try:
                    size = int(data[:i], 16)
                except ValueError:
                    size = -1
                if size == len(data) - i - 4:
                    self._data(data[i + 7:-4].strip(), now)
                    return
        buf = self.buf + data if self.buf else data
        # chunks are walked by offset (``pos``), not by slicing the rest off after each: a read that holds many
        # chunks (a client that fell behind) must cost per chunk, not per chunk times the read's length, or
        # falling behind makes the client slower and it stays behind
        pos = 0
        while True:
            st = self.state
            if st == _BODY_CHUNK_DATA:
                need = self.need
                if len(buf) - pos < need + 2:
                    break
                self._body(buf[pos:pos + need], now)
                pos += need + 2
                self.state = _BODY_CHUNK_SIZE
                continue
            if st == _BODY_CHUNK_SIZE:
                i = buf.find(b"\r\n", pos)
                if i < 0:
                    if len(buf) - pos > 1024:
                        return self._fail("bad response: malformed chunked encoding (no end of a chunk size)")
                    break
                try:
                    size = int(buf[pos:i].split(b";", 1)[0], 16)
                except ValueError:
                    return self._fail("bad response: malformed chunked encoding")
                if size > MAX_EVENT_BYTES:
                    return self._fail(f"bad response: an HTTP chunk of {size:,} bytes, over the "
                                      f"{MAX_EVENT_BYTES:,}-byte limit")
                pos = i + 2
                if size == 0:
                    self.state = _TRAILER
                else:
                    self.need, self.state = size, _BODY_CHUNK_DATA
                continue
            if pos:
                buf, pos = buf[pos:], 0
            if st == _BODY_LENGTH:
                take = buf[:self.need]
                self.need -= len(take)
                buf = buf[len(take):]
                if take:
                    self._body(take, now)
                if self.need <= 0:
                    return self._finish(now)
                break
            elif st == _BODY_CLOSE:
                if buf:
                    self._body(buf, now)
                buf = b""
                break
            elif st == _TRAILER:
                if buf.startswith(b"\r\n"):
                    return self._finish(now)
                i = buf.find(b"\r\n\r\n")
                if i < 0:
                    if len(buf) > 65536:
                        return self._fail("bad response: no end of the HTTP trailer")
                    break
                return self._finish(now)
            elif st == _HEAD:
                i = buf.find(b"\r\n\r\n")
                if i < 0:
                    if len(buf) > 65536:
                        return self._fail("bad response: no end of the HTTP header")
                    break
                if not self._head(buf[:i]):
                    return
                buf = buf[i + 4:]
                if self.state == _DONE:
                    return self._finish(now)
            else:  # _DONE
                break
        self.buf = buf[pos:] if pos else buf

    def _head(self, raw: bytes) -> bool:
        lines = raw.decode("latin-1").split("\r\n")
        parts = lines[0].split(" ", 2)
        try:
            self.status = int(parts[1])
        except (IndexError, ValueError):
            self._fail(f"bad response: {net.quote(lines[0], n=160)}")
            return False
        if self.status in (100, 103):  # interim answers: the real one follows
            return True
        chunked, length, conn = False, None, ""
        for line in lines[1:]:
            k, _, v = line.partition(":")
            k = k.strip().lower()
            if k == "transfer-encoding" and "chunked" in v.lower():
                chunked = True
            elif k == "content-length":
                try:
                    length = int(v.strip())
                except ValueError:
                    self._fail("bad response: malformed Content-Length")
                    return False
            elif k == "connection":
                conn = v.strip().lower()
        self.keep_alive = conn != "close" and not parts[0].endswith("1.0")
        if chunked:
            self.state = _BODY_CHUNK_SIZE
        elif length is not None:
            self.state, self.need = (_BODY_LENGTH, length) if length > 0 else (_DONE, 0)
        else:
            self.state, self.keep_alive = _BODY_CLOSE, False
        return True

    def eof(self, exc: Exception | None) -> None:
        if self.fut.done():
            return
        if self.state == _BODY_CLOSE:
            return self._finish(time.perf_counter())
        what = "before answering" if self.rx == 0 else "mid-response"
        self._fail(f"ConnectionError: the server closed the connection {what}"
                   + (f" ({type(exc).__name__})" if exc else ""))

    def _fail(self, error: str) -> None:
        self.error = self.error or error
        self.keep_alive = False
        self.state = _DONE
        if not self.fut.done():
            self.fut.set_result(time.perf_counter())

    def _finish(self, now: float) -> None:
        self.state = _DONE
        self.buf = b""
        if not self.fut.done():
            self.fut.set_result(now)

    # ---- the body: SSE events (or the error text of a non-200 answer)
    def _body(self, data: bytes, now: float) -> None:
        if self.status != 200:
            if len(self.err_body) < _ERR_BODY_MAX:
                self.err_body += data[:_ERR_BODY_MAX - len(self.err_body)]
            return
        if b"\r" in data or self.cr:  # SSE allows CRLF and CR line ends: make them LF
            if self.cr:
                data = b"\r" + data
            self.cr = data.endswith(b"\r")
            if self.cr:
                data = data[:-1]
            data = data.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        held = len(self.sse)
        sse = self.sse + data if held else data
        i = sse.find(b"\n\n", max(0, held - 1))  # the held part has no event end: look where one can be
        while i >= 0:
            event = sse[:i]
            sse = sse[i + 2:]
            if event.startswith(b"data:") and b"\n" not in event:
                self._data(event[5:].strip(), now)
            else:
                for line in event.split(b"\n"):
                    if line.startswith(b"data:"):
                        self._data(line[5:].strip(), now)
            i = sse.find(b"\n\n")
        if len(sse) > MAX_EVENT_BYTES:
            return self._fail(f"bad response: an SSE event over {MAX_EVENT_BYTES:,} bytes")
        self.sse = sse

    def _data(self, payload: bytes, now: float) -> None:
        if self.done_marker or self.error:
            return
        if payload == b"[DONE]":
            self.done_marker = True
            return
        if self.endpoint == "chat":
            text = _field(payload, b'"content"')
            if text != TEXT and b'"reasoning_content"' in payload:
                text = max(text, _field(payload, b'"reasoning_content"'), key=_RANK.__getitem__)
        else:
            text = _field(payload, b'"text"')
        if text in (TEXT, NULL, EMPTY) and (b'"usage"' not in payload or _field(payload, b'"usage"') == NULL) \
                and b'"error"' not in payload and (self.texts is None or text != TEXT):
            if text == TEXT or (text == EMPTY and _field(payload, b'"finish_reason"') in (ABSENT, NULL)
                                and (self.endpoint != "chat" or b'"role"' not in payload)):
                self._text(now)
            return
        try:  # usage, an error, or a layout the scan cannot read: parse it (NaN / Infinity read as None)
            chunk = json.loads(payload, parse_constant=_no_constant)
        except (ValueError, RecursionError):  # not JSON, too deep, or an integer of more than 4,300 digits
            return
        if not isinstance(chunk, dict):
            return
        choices = chunk.get("choices")
        if "error" in chunk and not choices:
            self.error = f"stream error: {net.quote(_dumps(chunk['error']), n=160)}"
            return
        if usage := chunk.get("usage"):
            self.usage = usage
        if (piece := _chunk_token(choices, self.endpoint)) is not None:
            if piece and self.texts is not None:
                self.texts.append(piece)
            self._text(now)

    def _text(self, now: float) -> None:
        """A chunk that carried a token arrived at ``now`` (``_chunk_token`` says which carry one without
        text); more than ``max_chunks`` of them is a bad response."""
        self.times.append(now)
        if len(self.times) > self.max_chunks:
            self._fail(f"bad response: more text chunks than the {self.max_chunks - EXTRA_CHUNKS} tokens asked for")


def _no_constant(name: str) -> None:
    return None  # NaN, Infinity: missing, never a number


def _dumps(value: object) -> str:
    """A value of a server's JSON as text for a message (whatever it holds: deep, huge or odd)."""
    try:
        return json.dumps(value)
    except (ValueError, TypeError, RecursionError):
        return type(value).__name__


class Pool:
    """Keep-alive HTTP/1.1 connections to the server of ``base_url`` for the load generator (no proxy, as
    vLLM's client; one connection per request in flight, reused when the answer ended cleanly)."""

    def __init__(self, base_url: str):
        from urllib.parse import urlsplit

        u = urlsplit(base_url)
        self.https = u.scheme == "https"
        self.host = u.hostname or "127.0.0.1"
        self.port = u.port or (443 if self.https else 80)
        self.path = u.path.rstrip("/")
        self.host_header = self.host if u.port is None else f"{self.host}:{u.port}"
        if ":" in self.host and not self.host.startswith("["):
            self.host_header = f"[{self.host}]" + ("" if u.port is None else f":{u.port}")
        self._ssl: ssl.SSLContext | None = None
        self._idle: list[_Conn] = []
        self._open: set[_Conn] = set()

    def _ssl_context(self) -> ssl.SSLContext:
        if self._ssl is None:
            import ssl

            self._ssl = ssl.create_default_context()
        return self._ssl

    async def _connect(self, deadline: float) -> _Conn:
        loop = asyncio.get_running_loop()
        left = min(CONNECT_TIMEOUT_S, deadline - time.perf_counter())
        if left <= 0:
            raise TimeoutError("deadline reached before connecting")
        _, conn = await asyncio.wait_for(
            loop.create_connection(_Conn, self.host, self.port, ssl=self._ssl_context() if self.https else None,
                                   server_hostname=self.host if self.https else None), left)
        self._open.add(conn)
        return conn

    def _release(self, conn: _Conn, reuse: bool) -> None:
        conn.ex = None
        if reuse and not conn.closed:
            self._idle.append(conn)
        else:
            self._drop(conn)

    def _drop(self, conn: _Conn) -> None:
        self._open.discard(conn)
        if conn.transport is not None and not conn.closed:
            conn.transport.close()
        conn.closed = True

    def request_bytes(self, path: str, body: bytes, headers: dict[str, str]) -> bytes:
        head = [f"POST {self.path}/{path} HTTP/1.1", f"Host: {self.host_header}", f"Content-Length: {len(body)}",
                "Accept: text/event-stream"]
        head += [f"{k}: {v}" for k, v in headers.items()]
        return ("\r\n".join(head) + "\r\n\r\n").encode("latin-1", "replace") + body

    async def exchange(self, raw: bytes, endpoint: str, deadline: float,
                       max_chunks: int = 10**9, keep_text: bool = False) -> tuple[_Exchange, float]:
        """Send ``raw``, wait for the whole answer (or the deadline, or READ_TIMEOUT_S without a byte).
        Returns the parsed exchange and when it was sent (perf_counter). Raises for connection failures.
        ``max_chunks``: the most text chunks the answer may carry (more is a bad response); ``keep_text``:
        the exchange keeps the reply's text pieces (``texts``)."""
        loop = asyncio.get_running_loop()
        for attempt in (0, 1):
            reused = False
            conn = None
            while self._idle:
                c = self._idle.pop()
                if not c.closed:
                    conn, reused = c, True
                    break
                self._open.discard(c)
            if conn is None:
                conn = await self._connect(deadline)
            fut = loop.create_future()
            sent = time.perf_counter()
            ex = _Exchange(fut, endpoint, sent, max_chunks)
            if keep_text:
                ex.texts = []
            conn.ex = ex
            conn.transport.write(raw)
            try:
                while not fut.done():
                    now = time.perf_counter()
                    left = min(deadline - now, ex.last_rx + READ_TIMEOUT_S - now)
                    if left <= 0:
                        ex._fail("TimeoutError: the request's deadline passed" if deadline <= now else
                                 f"TimeoutError: no byte from the server for {READ_TIMEOUT_S:g} s")
                        break
                    await asyncio.wait((fut,), timeout=left)
            except BaseException:
                self._drop(conn)
                raise
            # a kept-alive connection the server had closed: send once more on a new one
            if reused and ex.rx == 0 and ex.error and attempt == 0 and "closed the connection" in ex.error:
                self._drop(conn)
                continue
            self._release(conn, ex.keep_alive and ex.state == _DONE and ex.error is None)
            return ex, sent
        raise AssertionError("unreachable")

    async def close(self) -> None:
        for c in list(self._open):
            self._drop(c)
        self._idle.clear()
        await asyncio.sleep(0)  # let the transports close


async def send(pool: Pool, target: Endpoint, prompt: "str | list[JsonObject]", max_tokens: int, t0: float,
               timeout_s: float = 600.0, deadline: float | None = None, keep_text: bool = False) -> RequestResult:
    """Send one streamed request; ``t0`` is the run's start (monotonic) for ``start``; it ends by
    ``timeout_s`` from now or by ``deadline`` (perf_counter), whichever comes first. Never raises for a
    bad answer: every failure is a RequestResult with ``ok=False``. ``prompt``: a text, or (chat) the
    messages of a multi-turn session; ``keep_text``: the reply's text in ``result.text`` (the next turn's
    history)."""
    path = "chat/completions" if target.endpoint == "chat" else "completions"
    body = json.dumps(request_body(target, prompt, max_tokens)).encode()
    raw = pool.request_bytes(path, body, target.headers())
    result = RequestResult(ok=False, start=time.monotonic() - t0)
    start = time.perf_counter()
    end_by = start + timeout_s if deadline is None else min(deadline, start + timeout_s)
    try:
        ex, start = await pool.exchange(raw, target.endpoint, end_by, max_tokens + EXTRA_CHUNKS, keep_text)
    except Exception as exc:  # noqa: BLE001 - counted, never raised
        result.error = f"{type(exc).__name__}: {net.quote(str(exc), n=160) or 'connection failed'}"
        result.e2e = time.perf_counter() - start
        return result
    end = ex.fut.result() if ex.fut.done() else time.perf_counter()
    result.e2e = end - start
    if ex.error is None and ex.status != 200:
        result.error = f"HTTP {ex.status}: {net.quote(ex.err_body, _secrets(target), 160)}"
        return result
    if ex.error is not None:
        result.error = net.redact(ex.error, _secrets(target))
        return result
    times = ex.times
    if not times:
        result.error = "empty: the stream carried no token"
        return result
    result.ttft = times[0] - start
    result.itl = [b - a for a, b in zip(times, times[1:])]
    usage = ex.usage
    if isinstance(usage, dict):
        tokens, why = _usage(usage, max_tokens, len(body) if isinstance(prompt, list)
                             else len(prompt.encode("utf-8", "replace")))
        if why is not None:
            result.error = why
            return result
        completion, result.prompt_tokens = tokens
        result.output_tokens = completion if completion else len(times)
    else:
        result.output_tokens = len(times)
    if ex.texts is not None:
        result.text = "".join(ex.texts)
    result.ok = True
    return result


PROMPT_TOKENS_SLACK = 8192  # tokens a chat template or special tokens may add to a prompt's bytes


def _usage(usage: JsonObject, max_tokens: int, prompt_bytes: int) -> tuple[tuple[int | None, int | None], str | None]:
    """(completion_tokens, prompt_tokens) of a stream's usage, or why it is a bad response: a count must be an
    integer, at most the ``max_tokens`` asked for (completion) or what the prompt's bytes can make (prompt), so
    that a 10**400, a -1, a "12" or a 1e308 never becomes a figure."""
    out = []
    for name, hi in (("completion_tokens", max_tokens), ("prompt_tokens", prompt_bytes + PROMPT_TOKENS_SLACK)):
        v = usage.get(name)
        if v is not None and net.count(v, hi=hi) is None:
            what = "not a token count" if net.count(v) is None else f"more than the {hi:,} possible"
            return (None, None), f"bad response: usage.{name} is {net.quote(_dumps(v), n=40)}, {what}"
        out.append(v)
    return (out[0], out[1]), None


def _secrets(target: Endpoint) -> tuple[str, ...]:
    return (target.api_key,) if target.api_key else ()


CONTROL_DEADLINE_S = 10.0  # each control call (the model list, /tokenize): connecting and the whole answer
MAX_MODEL_NAME = 1024  # characters; a longer id is not taken for a model name
MIN_TOKEN_CHARS, MAX_TOKEN_CHARS = 0.5, 32.0  # characters per token a /tokenize count may imply


class Refused(Exception):
    """A control call answered with an HTTP error status (``status``; ``detail``: its words, safe to show)."""

    def __init__(self, url: str, status: int, detail: str):
        super().__init__(f"{url} answered HTTP {status}")
        self.url, self.status, self.detail = url, status, detail


@dataclass
class Models:
    """The server's model list: its names, and the ids that are no model name (not a string, empty, too
    long or with control characters), quoted for a message."""

    names: list[str]
    skipped: list[str]


async def list_models(client: Any, base_url: str, headers: dict[str, str], *,  # Any: an infertool.net.async_client
                      deadline: net.Deadline | None = None) -> Models:
    """GET ``base_url``/models under ``infertool.net``'s policy (CONTROL_DEADLINE_S, a small body, no
    redirect). Raises net.NetError (no usable answer: unreachable, a stall, a redirect, a body that is not a
    JSON object or whose ``data`` is not a list) or Refused (an HTTP error status)."""
    url = f"{base_url}/models"
    ans = await net.afetch(url, headers=headers, deadline_s=CONTROL_DEADLINE_S, deadline=deadline,
                           max_bytes=net.MAX_SMALL_BYTES, client=client)
    if not ans.ok:
        raise Refused(url, ans.status, ans.detail())
    ids, odd = listed_ids(ans.json_object())
    if odd is not None:
        raise net.NetError("malformed", url, f"answered a model list whose `data` is {odd}, not a list", ans.status)
    names, skipped = [], []
    for mid in ids:
        if isinstance(mid, str) and mid.strip() and len(mid) <= MAX_MODEL_NAME and mid.isprintable():
            names.append(mid)
        else:
            skipped.append(net.quote(_dumps(mid), ans.secrets, 40))
    return Models(names, skipped)


async def tokenize(client: Any, root: str, model: str, text: str, headers: dict[str, str], *,  # Any: net's client
                   deadline: net.Deadline | None = None) -> tuple[int | None, str | None]:
    """How many tokens the server makes of ``text`` (vLLM's /tokenize): (count, None), or (None, why not)
    when it cannot say (no /tokenize, a stall past CONTROL_DEADLINE_S, an odd answer, a count no tokenizer
    makes of this text: more than MAX_TOKEN_CHARS or fewer than MIN_TOKEN_CHARS characters per token)."""
    url = f"{root}/tokenize"
    try:
        ans = await net.afetch(url, method="POST", json_body={"model": model, "prompt": text}, headers=headers,
                               deadline_s=CONTROL_DEADLINE_S, deadline=deadline, max_bytes=net.MAX_SMALL_BYTES,
                               client=client)
        if not ans.ok:
            return None, f"{url} answered HTTP {ans.status}"
        raw = ans.json_object().get("count")
    except net.NetError as e:
        return None, f"{url}: {e.reason}"
    n = net.count(raw)
    if n is None or not (len(text) / MAX_TOKEN_CHARS <= n <= len(text) / MIN_TOKEN_CHARS):
        return None, (f"{url} answered a count of {net.quote(_dumps(raw), n=40)} for {len(text):,} characters, "
                      "not a plausible token count")
    return n, None


async def tokenize_count(client: Any, root: str, model: str, text: str,  # Any: an infertool.net.async_client
                         headers: dict[str, str]) -> int | None:
    """How many tokens the server makes of ``text`` (vLLM's /tokenize), None when it cannot say."""
    return (await tokenize(client, root, model, text, headers))[0]
