"""One streamed request to an OpenAI-compatible server, timed: TTFT, every inter-chunk gap, E2E.

Uses httpx directly (one connection pool, no retries) so the timing is ours and comparable with
vLLM's ``bench serve``. Every failure becomes a RequestResult with ``ok=False`` and a short error;
nothing here raises for a bad response.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass

from infertool.bench.metrics import RequestResult


@dataclass
class Target:
    base_url: str  # ends with /v1
    model: str
    endpoint: str = "completions"  # "completions" | "chat"
    api_key: str | None = None
    ignore_eos: bool = True
    temperature: float = 0.0

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


def request_body(target: Target, prompt: str, max_tokens: int, stream: bool = True) -> dict:
    body: dict = {"model": target.model, "max_tokens": max_tokens, "temperature": target.temperature,
                  "stream": stream}
    if stream:
        body["stream_options"] = {"include_usage": True}
    if target.ignore_eos:
        body["ignore_eos"] = True  # vLLM's extension: exactly max_tokens tokens, comparable runs
    if target.endpoint == "chat":
        body["messages"] = [{"role": "user", "content": prompt}]
    else:
        body["prompt"] = prompt
    return body


def _chunk_text(chunk: dict, endpoint: str) -> str:
    choices = chunk.get("choices") or []
    if not choices:
        return ""
    c = choices[0]
    if endpoint == "chat":
        delta = c.get("delta") or {}
        return (delta.get("content") or "") + (delta.get("reasoning_content") or "")
    return c.get("text") or ""


async def send(client, target: Target, prompt: str, max_tokens: int, t0: float,
               timeout_s: float = 600.0) -> RequestResult:
    """Send one streamed request; ``t0`` is the run's start (monotonic) for ``start``."""
    url = f"{target.base_url}/{'chat/completions' if target.endpoint == 'chat' else 'completions'}"
    body = request_body(target, prompt, max_tokens)
    start = time.perf_counter()
    result = RequestResult(ok=False, start=time.monotonic() - t0)
    last = start
    chunks = 0
    usage: dict | None = None
    try:
        async with client.stream("POST", url, json=body, headers=target.headers(), timeout=timeout_s) as resp:
            if resp.status_code != 200:
                text = (await resp.aread()).decode("utf-8", "replace")
                result.error = f"HTTP {resp.status_code}: {_short(text)}"
                result.e2e = time.perf_counter() - start
                return result
            async for line in resp.aiter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                try:
                    chunk = json.loads(data)
                except ValueError:
                    continue
                if "error" in chunk and not chunk.get("choices"):
                    result.error = f"stream error: {_short(json.dumps(chunk['error']))}"
                    result.e2e = time.perf_counter() - start
                    return result
                if chunk.get("usage"):
                    usage = chunk["usage"]
                if _chunk_text(chunk, target.endpoint):
                    now = time.perf_counter()
                    if chunks == 0:
                        result.ttft = now - start
                    else:
                        result.itl.append(now - last)
                    last = now
                    chunks += 1
        result.e2e = time.perf_counter() - start
    except Exception as exc:  # noqa: BLE001 - counted, never raised
        result.error = f"{type(exc).__name__}: {_short(str(exc))}"
        result.e2e = time.perf_counter() - start
        return result
    if chunks == 0:
        result.error = "empty: the stream carried no text"
        return result
    result.ok = True
    if usage:
        result.prompt_tokens = usage.get("prompt_tokens")
        result.output_tokens = int(usage.get("completion_tokens") or chunks)
    else:
        result.output_tokens = chunks
    return result


def _short(text: str, n: int = 160) -> str:
    text = " ".join(text.split())
    return text if len(text) <= n else text[: n - 3] + "..."


async def list_models(client, base_url: str, headers: dict) -> list[str]:
    resp = await client.get(f"{base_url}/models", headers=headers, timeout=10.0)
    resp.raise_for_status()
    return [m["id"] for m in resp.json().get("data", []) if isinstance(m, dict) and "id" in m]


async def tokenize_count(client, root: str, model: str, text: str, headers: dict) -> int | None:
    """How many tokens the server makes of ``text`` (vLLM's /tokenize), None when it cannot say."""
    try:
        resp = await client.post(f"{root}/tokenize", json={"model": model, "prompt": text},
                                 headers=headers, timeout=10.0)
        if resp.status_code != 200:
            return None
        count = resp.json().get("count")
        return int(count) if count else None
    except Exception:  # noqa: BLE001
        return None
