"""One policy for every HTTP exchange with a server infertool did not write (a leaf: no infertool imports).

A server under test may answer anything, so everything that talks to one (eval's engine, bench's control
calls and /metrics scrapes, serve's readiness probe and ``serve status``, the load check, the smoke test)
goes through ``fetch`` / ``afetch``, which hold these rules:

- **No redirect is followed.** A 3xx answer is a ``NetError`` that names where it pointed: a key sent to the
  address the user named never reaches another one.
- **One deadline per request**, for connecting, the headers and the body together, not a timeout per read:
  a server that trickles one byte at a time, accepts and never answers, or announces a body it never sends
  ends the request at its deadline. A caller may also pass a ``Deadline`` shared by a whole stage; the
  request then ends at whichever comes first.
- **Bounded bodies.** A Content-Length over ``max_bytes`` is refused before the body is read; a body that
  grows past it is cut and refused. Compression is not asked for, so the limit counts what is kept.
- **Every failure is a NetError** with a kind (``unreachable``, ``timeout``, ``redirect``, ``too-large``,
  ``broken``, ``malformed``) and a one-line reason in which the caller's secrets are blanked and the server's
  words cut short; nothing else escapes.
- **Numbers are read defensively.** ``Answer.json()`` reads NaN / Infinity as None (missing, never a figure);
  ``number`` and ``count`` accept only finite, bounded numbers of the right type, so a ``10**400`` or a
  ``-1e308`` from a server becomes "missing", never an OverflowError or a gate that passes.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from dataclasses import dataclass, field

MAX_JSON_BYTES = 32 * 1024 * 1024  # an OpenAI-style JSON answer (prompt logprobs of a long window fit easily)
MAX_METRICS_BYTES = 8 * 1024 * 1024  # a Prometheus /metrics page (vLLM's is ~100 KB)
MAX_SMALL_BYTES = 1024 * 1024  # /v1/models, /tokenize, /health and error bodies
DEFAULT_DEADLINE_S = 30.0
MAX_QUOTE = 300  # characters of a server's own words quoted in a message

KINDS = ("unreachable", "timeout", "redirect", "too-large", "broken", "malformed")


class NetError(Exception):
    """An exchange that gave no usable answer: ``kind`` (one of KINDS), the URL, the HTTP status if any, and a
    one-line reason that is safe to show (secrets blanked, server text cut)."""

    def __init__(self, kind: str, url: str, reason: str, status: int | None = None):
        super().__init__(f"{url}: {reason}")
        self.kind, self.url, self.reason, self.status = kind, url, reason, status


class Deadline:
    """A point in time shared by several requests (a stage's budget): ``left()`` seconds remain."""

    def __init__(self, seconds: float):
        if not (isinstance(seconds, (int, float)) and math.isfinite(seconds) and seconds > 0):
            raise ValueError(f"a deadline needs a finite positive number of seconds, got {seconds!r}")
        self.seconds = float(seconds)
        self.at = time.monotonic() + self.seconds

    def left(self) -> float:
        return self.at - time.monotonic()


def redact(text: str, secrets=()) -> str:
    """``text`` with every secret (and its Bearer form) blanked: a server may echo a key back."""
    for s in secrets:
        if s and len(s) >= 4:
            text = text.replace(s, "***")
    return text


def quote(text: str | bytes, secrets=(), n: int = MAX_QUOTE) -> str:
    """A server's words made safe for one line on a screen or in JSON: decoded, whitespace folded, secrets
    blanked, control characters dropped, cut to ``n`` characters."""
    if isinstance(text, (bytes, bytearray)):
        text = bytes(text[: n * 4 + 1024]).decode("utf-8", "replace")
    text = redact(text, secrets)
    text = "".join(ch if ch.isprintable() else " " for ch in text)
    text = " ".join(text.split())
    return text if len(text) <= n else text[: n - 3] + "..."


def number(v, lo: float = -1e300, hi: float = 1e300) -> float | None:
    """A finite number within [lo, hi] from a server's JSON, else None (bools, strings, NaN, inf, 10**400)."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    if isinstance(v, int):
        if not (lo <= v <= hi):
            return None
        return float(v)
    return v if math.isfinite(v) and lo <= v <= hi else None


def count(v, hi: int = 10**12) -> int | None:
    """A non-negative integer no larger than ``hi`` from a server's JSON, else None."""
    if isinstance(v, bool) or not isinstance(v, int) or not (0 <= v <= hi):
        return None
    return v


def _no_constants(name: str):
    return None  # NaN, Infinity, -Infinity: missing, never a figure


@dataclass
class Answer:
    """A complete answer (any status but 3xx): the caller decides what a 4xx / 5xx means."""

    url: str
    status: int
    body: bytes
    headers: dict[str, str] = field(default_factory=dict)
    secrets: tuple = ()

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300

    def text(self) -> str:
        return self.body.decode("utf-8", "replace")

    def json(self):
        """The body as JSON (NaN / Infinity read as None); a body that is not JSON is a NetError."""
        try:
            return json.loads(self.body.decode("utf-8"), parse_constant=_no_constants)
        except (ValueError, UnicodeDecodeError, RecursionError):
            raise NetError("malformed", self.url, f"answered HTTP {self.status} with a body that is not JSON: "
                           + quote(self.body, self.secrets, 120), self.status) from None

    def json_object(self) -> dict:
        """The body as a JSON object; any other JSON value is a NetError."""
        doc = self.json()
        if not isinstance(doc, dict):
            raise NetError("malformed", self.url, f"answered a JSON {type(doc).__name__}, not an object",
                           self.status)
        return doc

    def detail(self) -> str:
        """The body, safe to quote (for an error message)."""
        return quote(self.body, self.secrets)


_ssl_context = None


def _verify():
    global _ssl_context
    if _ssl_context is None:
        import ssl

        _ssl_context = ssl.create_default_context()
    return _ssl_context


def _seconds(deadline_s: float, deadline: Deadline | None) -> float:
    left = deadline_s if deadline is None else min(deadline_s, deadline.left())
    return max(0.0, left)


async def afetch(url: str, *, method: str = "GET", json_body=None, headers: dict | None = None,
                 deadline_s: float = DEFAULT_DEADLINE_S, deadline: Deadline | None = None,
                 max_bytes: int = MAX_JSON_BYTES, client=None) -> Answer:
    """One request under the policy (see the module's docstring). ``client``: an ``httpx.AsyncClient`` to
    reuse its connections (it must have been made by ``async_client``); otherwise one is made for this
    request. Raises NetError only."""
    secrets = _secrets(headers)
    seconds = _seconds(deadline_s, deadline)
    if seconds <= 0:
        raise NetError("timeout", url, "no time left for this request (the stage's deadline has passed)")
    try:
        return await asyncio.wait_for(_exchange(url, method, json_body, headers, max_bytes, client, secrets),
                                      timeout=seconds)
    except asyncio.TimeoutError:
        raise NetError("timeout", url, f"no complete answer within {seconds:.3g} s") from None


def fetch(url: str, **kwargs) -> Answer:
    """``afetch`` for synchronous callers (each call its own event loop: safe from worker threads). Not for
    use inside a running event loop: there, await ``afetch``."""
    return asyncio.run(afetch(url, **kwargs))


def async_client(max_connections: int = 100):
    """An ``httpx.AsyncClient`` under the policy: no redirects, no compression, the shared TLS context.
    Timeouts are per request (``afetch``'s deadline), so the client's own are off."""
    import httpx

    return httpx.AsyncClient(follow_redirects=False, verify=_verify(), timeout=None,
                             limits=httpx.Limits(max_connections=max_connections),
                             headers={"Accept-Encoding": "identity"})


def _secrets(headers: dict | None) -> tuple:
    out = []
    for k, v in (headers or {}).items():
        if str(k).lower() == "authorization" and isinstance(v, str):
            out.append(v)
            out.append(v.split(" ", 1)[-1])
    return tuple(out)


async def _exchange(url, method, json_body, headers, max_bytes, client, secrets) -> Answer:
    import httpx

    own = client is None
    client = async_client() if own else client
    content = None
    hdrs = {"Accept-Encoding": "identity", **(headers or {})}
    if json_body is not None:
        content = json.dumps(json_body, allow_nan=False).encode()
        hdrs.setdefault("Content-Type", "application/json")
    try:
        async with client.stream(method, url, content=content, headers=hdrs) as resp:
            status = resp.status_code
            if 300 <= status < 400:
                where = quote(resp.headers.get("location", "") or "nowhere", secrets, 120)
                raise NetError("redirect", url, f"answered HTTP {status}, a redirect to {where}; infertool "
                               "follows no redirect (give the final URL)", status)
            declared = resp.headers.get("content-length", "")
            if declared.strip().isdigit() and int(declared) > max_bytes:
                raise NetError("too-large", url, f"announced a body of {int(declared):,} bytes, over the "
                               f"{max_bytes:,}-byte limit for this answer", status)
            body = bytearray()
            async for chunk in resp.aiter_raw():
                body += chunk
                if len(body) > max_bytes:
                    raise NetError("too-large", url, f"sent more than {max_bytes:,} bytes, the limit for this "
                                   "answer (cut there)", status)
            return Answer(url, status, bytes(body), {k.lower(): v for k, v in resp.headers.items()}, secrets)
    except NetError:
        raise
    except httpx.ConnectError as exc:
        raise NetError("unreachable", url, f"cannot connect ({quote(str(exc) or type(exc).__name__, secrets, 120)})") from None
    except httpx.TimeoutException:
        raise NetError("timeout", url, "timed out") from None
    except (httpx.HTTPError, httpx.InvalidURL, OSError, ValueError, UnicodeError) as exc:
        raise NetError("broken", url, f"the exchange broke off: {type(exc).__name__}"
                       + (f" ({quote(str(exc), secrets, 120)})" if str(exc) else "")) from None
    finally:
        if own:
            await client.aclose()
