"""Model directories shaped like real checkpoints, without real weights: a config.json, a tokenizer config and
safetensors files whose headers describe every tensor of the architecture, with the data as a sparse hole
(a 70B layout takes no disk). What `model info`, preflight, plan and the resolution read is exact."""

from __future__ import annotations

import json
import struct
from http.server import BaseHTTPRequestHandler
from pathlib import Path

from infertool.models.known import KNOWN_ARCHS, MAX_POSITIONS

MODEL_TYPES = {"qwen2.5-7b": ("qwen2", "Qwen2ForCausalLM"), "mistral-7b": ("mistral", "MistralForCausalLM"),
               "mixtral-8x7b": ("mixtral", "MixtralForCausalLM")}


def config_for(key: str, **extra) -> dict:
    a, _ = KNOWN_ARCHS[key]
    model_type, arch = MODEL_TYPES.get(key, ("llama", "LlamaForCausalLM"))
    cfg = {"architectures": [arch], "model_type": model_type, "hidden_size": a.hidden,
           "intermediate_size": a.intermediate, "num_attention_heads": a.heads, "num_key_value_heads": a.kv_heads,
           "num_hidden_layers": a.layers, "head_dim": a.head_dim, "vocab_size": a.vocab,
           "max_position_embeddings": MAX_POSITIONS.get(key, 4096), "tie_word_embeddings": a.tie_word_embeddings,
           "dtype": "bfloat16"}
    cfg.update(extra)
    return cfg


def tensors_for(cfg: dict) -> dict[str, list[int]]:
    h, i, v = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    d = cfg.get("head_dim") or h // cfg["num_attention_heads"]
    q, kv = cfg["num_attention_heads"] * d, cfg["num_key_value_heads"] * d
    t = {"model.embed_tokens.weight": [v, h], "model.norm.weight": [h]}
    for n in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{n}."
        t.update({p + "self_attn.q_proj.weight": [q, h], p + "self_attn.k_proj.weight": [kv, h],
                  p + "self_attn.v_proj.weight": [kv, h], p + "self_attn.o_proj.weight": [h, q],
                  p + "mlp.gate_proj.weight": [i, h], p + "mlp.up_proj.weight": [i, h], p + "mlp.down_proj.weight": [h, i],
                  p + "input_layernorm.weight": [h], p + "post_attention_layernorm.weight": [h]})
    if not cfg.get("tie_word_embeddings"):
        t["lm_head.weight"] = [v, h]
    return t


def write_safetensors(path: Path, tensors: dict[str, list[int]], itemsize: int = 2, fill: int | None = None) -> int:
    """A safetensors file of BF16 ``tensors`` (name -> shape) with a real header; its data a hole (sparse: no disk
    blocks) or, with ``fill``, every byte that value (real bytes a copy or a fingerprint reads). Returns the
    data's size in bytes."""
    header, offset = {}, 0
    for name, shape in tensors.items():
        n = 1
        for dim in shape:
            n *= dim
        header[name] = {"dtype": "BF16", "shape": shape, "data_offsets": [offset, offset + n * itemsize]}
        offset += n * itemsize
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)) + raw)
        if fill is None:
            f.truncate(8 + len(raw) + offset)  # the data: a hole, no disk blocks
        else:
            f.write(bytes([fill]) * offset)
    return offset


def layout_model(d: Path, key: str, *, shards: int = 4, **config_extra) -> Path:
    """A directory shaped like the known model ``key`` (e.g. 'llama-3.1-8b'); sharded with an index."""
    d.mkdir(parents=True, exist_ok=True)
    cfg = config_for(key, **config_extra)
    (d / "config.json").write_text(json.dumps(cfg, indent=1))
    (d / "tokenizer_config.json").write_text(json.dumps({"model_max_length": cfg["max_position_embeddings"],
                                                         "chat_template": "{{ messages }}"}))
    (d / "tokenizer.json").write_text(json.dumps({"version": "1.0", "model": {"type": "BPE"}}))
    names = list(tensors_for(cfg).items())
    weight_map = {}
    for s in range(shards):
        part = dict(names[s::shards])
        fname = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        write_safetensors(d / fname, part)
        weight_map.update({n: fname for n in part})
    (d / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return d


# ------------------------------------------------------------------------------------------ a fake OpenAI server
# A cheap OpenAI-compatible streaming server for the load generator's tests and benchmarks/loadgen_vs_vllm.py:
# raw asyncio (no framework), in its own process, so that it is never the limit of what it measures. Like an
# inference engine it steps: every ``itl_ms`` one tick writes one token to every running stream (``itl_ms=0``:
# the whole answer at once). It reports what it really did at GET /stats: each stream's time between two token writes and the
# time from a request's arrival to its first token (the true ITL and TTFT a client should measure).

_COMPLETION_CHUNK = ('{"id":"cmpl-0","object":"text_completion","created":0,"model":"m","choices":[{"index":0,'
                     '"text":" tok","logprobs":null,"finish_reason":null,"stop_reason":null}]}')
_CHAT_FIRST = ('{"id":"chat-0","object":"chat.completion.chunk","created":0,"model":"m","choices":[{"index":0,'
               '"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}')
_CHAT_CHUNK = ('{"id":"chat-0","object":"chat.completion.chunk","created":0,"model":"m","choices":[{"index":0,'
               '"delta":{"content":" tok"},"logprobs":null,"finish_reason":null}]}')
FAKE_BEHAVIOURS = ("ok", "fail", "trickle", "bad_usage", "inf_metrics")


def _http_chunk(payload: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(payload), payload)


def _sse(obj: str | bytes) -> bytes:
    data = obj.encode() if isinstance(obj, str) else obj
    return _http_chunk(b"data: " + data + b"\n\n")


def _fake_server_main(conn, itl_ms: float, behaviour: str, host: str, models: tuple[str, ...] = ("m",)) -> None:
    """The server process: binds a free port, sends it through ``conn``, serves until killed."""
    import asyncio
    import json as _json
    import time as _time

    head_ok = (b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n"
               b"Connection: keep-alive\r\n\r\n")
    token = {"completions": _sse(_COMPLETION_CHUNK), "chat": _sse(_CHAT_CHUNK)}
    ticks: list[float] = []  # gaps between consecutive ticks that both wrote tokens (the true ITL)
    ttfts: list[float] = []
    running: list = []  # [protocol, tokens left, arrival time, endpoint]
    served = [0]
    prompts: list[str] = []  # the prompts received (for checks that every request was sent once)
    asked: list[str] = []  # each completion's "model", in arrival order (bench.adapters' mix)
    gaps: list[float] = []  # every stream's time between two token writes

    def simple(status: str, body: bytes, ctype: str = "application/json") -> bytes:
        return (f"HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {len(body)}\r\n\r\n").encode() + body

    def tail(endpoint: str, n: int, prompt_tokens: int) -> bytes:
        completion = '"abc"' if behaviour == "bad_usage" else str(n)
        usage = ('{"id":"x","object":"text_completion","created":0,"model":"m","choices":[],"usage":'
                 f'{{"prompt_tokens":{prompt_tokens},"total_tokens":{prompt_tokens + n},"completion_tokens":{completion}}}}}')
        return _sse(usage) + _sse("[DONE]") + b"0\r\n\r\n"

    class Proto(asyncio.Protocol):
        def connection_made(self, transport):
            self.t = transport
            self.buf = b""

        def data_received(self, data):
            self.buf += data
            while True:
                end = self.buf.find(b"\r\n\r\n")
                if end < 0:
                    return
                head = self.buf[:end].decode("latin-1")
                length = 0
                for line in head.split("\r\n")[1:]:
                    k, _, v = line.partition(":")
                    if k.strip().lower() == "content-length":
                        length = int(v)
                if len(self.buf) < end + 4 + length:
                    return
                body = self.buf[end + 4:end + 4 + length]
                self.buf = self.buf[end + 4 + length:]
                method, path = head.split(" ", 2)[:2]
                self.handle(method, path, body)

        def handle(self, method: str, path: str, body: bytes) -> None:
            now = _time.perf_counter()
            if path.endswith("/models"):
                listed = [{"id": m, "object": "model"} for m in models]
                self.t.write(simple("200 OK", _json.dumps({"object": "list", "data": listed}).encode()))
            elif path.endswith("/tokenize"):
                prompt = _json.loads(body).get("prompt", "")
                self.t.write(simple("200 OK", _json.dumps({"count": max(1, len(prompt) // 4)}).encode()))
            elif path.endswith("/metrics"):
                text = b"vllm:kv_cache_usage_perc 1e999\nvllm:num_requests_running 1\n" if behaviour == "inf_metrics" \
                    else b"vllm:num_requests_running %d\nvllm:num_requests_waiting 0\n" % len(running)
                self.t.write(simple("200 OK", text, "text/plain"))
            elif path.endswith("/stats"):
                g, tk = sorted(gaps), sorted(ticks)
                tt = sorted(ttfts)
                stats = {"itl_ms": (g[len(g) // 2] * 1000) if g else 0.0,
                         "itl_mean_ms": (sum(g) / len(g) * 1000) if g else 0.0,
                         "tick_ms": (tk[len(tk) // 2] * 1000) if tk else 0.0,
                         "ttft_ms": (tt[len(tt) // 2] * 1000) if tt else None, "requests": served[0],
                         "ticks": len(ticks), "prompts": prompts[:100_000], "models": asked[:100_000]}
                self.t.write(simple("200 OK", _json.dumps(stats).encode()))
            elif path.endswith("/stats/reset"):
                ticks.clear(), ttfts.clear(), prompts.clear(), gaps.clear(), asked.clear()
                served[0] = 0
                self.t.write(simple("200 OK", b"{}"))
            elif method == "POST" and path.endswith("completions"):
                req = _json.loads(body)
                endpoint = "chat" if path.endswith("chat/completions") else "completions"
                served[0] += 1
                if behaviour == "fail":
                    self.t.write(simple("500 Internal Server Error", b'{"error":{"message":"boom"}}'))
                    return
                n = int(req.get("max_tokens") or 16)
                prompt = req.get("prompt") or str(req.get("messages"))
                prompts.append(prompt)
                asked.append(str(req.get("model")))
                ptoks = max(1, len(prompt) // 4)
                first = head_ok + (_sse(_CHAT_FIRST) if endpoint == "chat" else b"")
                if behaviour == "trickle":  # a chunk a second, for ever (until the client gives up)
                    self.t.write(first)
                    running.append([self, 10 ** 9, now, endpoint, ptoks, 1.0, n, now])
                elif itl_ms <= 0:
                    self.t.write(first + token[endpoint] * n + tail(endpoint, n, ptoks))
                    ttfts.append(_time.perf_counter() - now)
                else:
                    self.t.write(first)
                    running.append([self, n, now, endpoint, ptoks, None, n, now])
            else:
                self.t.write(simple("404 Not Found", b'{"error":"not found"}'))

        def connection_lost(self, exc):
            self.t = None

    async def main() -> None:
        loop = asyncio.get_running_loop()
        server = await loop.create_server(Proto, host, 0, backlog=4096)
        conn.send(server.sockets[0].getsockname()[1])
        step = (itl_ms / 1000) if itl_ms > 0 else 0.002
        last_trickle = [0.0]
        busy_tick = [None]  # the last tick that wrote a token

        def tick(when: float) -> None:
            now = _time.perf_counter()
            if running and behaviour != "trickle":
                if busy_tick[0] is not None:
                    ticks.append(now - busy_tick[0])
                    if len(ticks) > 200_000:
                        del ticks[:100_000]
                busy_tick[0] = now
            else:
                busy_tick[0] = None
            slow = now - last_trickle[0] >= 1.0
            if slow:
                last_trickle[0] = now
            keep = []
            for r in running:
                proto, left, arrived, endpoint, ptoks, trickle, n, _ = r
                if proto.t is None:
                    continue
                if trickle is not None and not slow:
                    keep.append(r)
                    continue
                first = left == n
                left -= 1
                if left <= 0:
                    proto.t.write(token[endpoint] + tail(endpoint, n, ptoks))
                else:
                    proto.t.write(token[endpoint])
                    r[1] = left
                    keep.append(r)
                wrote = _time.perf_counter()
                if first:  # when the first token left (late in a busy tick), not when the tick began
                    ttfts.append(wrote - arrived)
                elif trickle is None and len(gaps) < 1_000_000:
                    gaps.append(wrote - r[7])  # this stream's own spacing: the true ITL
                r[7] = wrote
            running[:] = keep
            nxt = max(when + step, loop.time())
            loop.call_at(nxt, tick, nxt)

        if itl_ms > 0 or behaviour == "trickle":
            loop.call_soon(tick, loop.time())
        await asyncio.Event().wait()

    asyncio.run(main())


class FakeOpenAI:
    """``with FakeOpenAI(itl_ms=2) as srv: srv.url`` -> http://127.0.0.1:PORT/v1; ``srv.stats()``: what the
    server really did. ``behaviour``: one of FAKE_BEHAVIOURS (fail: HTTP 500 to every completion; trickle: one
    token a second; bad_usage: ``completion_tokens`` is not a number; inf_metrics: /metrics says 1e999).
    ``models``: what /v1/models lists (a LoRA server: the base, then its adapters); ``stats()["models"]``: each
    completion's "model"."""

    def __init__(self, itl_ms: float = 2.0, behaviour: str = "ok", host: str = "127.0.0.1",
                 models: tuple[str, ...] = ("m",)):
        assert behaviour in FAKE_BEHAVIOURS, behaviour
        self.itl_ms, self.behaviour, self.host, self.models = itl_ms, behaviour, host, models
        self.proc = None
        self.url = ""

    def __enter__(self) -> "FakeOpenAI":
        import multiprocessing as mp

        ctx = mp.get_context("spawn")
        parent, child = ctx.Pipe()
        self.proc = ctx.Process(target=_fake_server_main, args=(child, self.itl_ms, self.behaviour, self.host, self.models),
                                daemon=True)
        self.proc.start()
        for _ in range(1200):  # until it sends its port or dies (bounded: 120 s)
            if parent.poll(0.1) or not self.proc.is_alive():
                break
        if not parent.poll(0):
            self.proc.kill()
            raise RuntimeError("the fake OpenAI server did not start")
        self.url = f"http://{self.host}:{parent.recv()}/v1"
        return self

    def _get(self, path: str) -> dict:
        import urllib.request

        with urllib.request.urlopen(self.url.removesuffix("/v1") + path, timeout=30) as r:
            return json.loads(r.read())

    def stats(self) -> dict:
        return self._get("/stats")

    def reset(self) -> None:
        self._get("/stats/reset")

    def __exit__(self, *exc) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.join(10)


def seal_evidence(ev: Path, docs: dict, index: dict) -> dict:
    """An evidence folder as infertool.verify.evidence's format says (its real writer is publish's): each document
    written as JSON, its sha256 and bytes in ``index["files"]``, then the index's content hash and the index. Returns
    the index. An index of the current format without ``weights`` gets those of the folder ``ev`` is in (every
    checkpoint file's sha256, as capture records them); so does one of format 2."""
    from infertool.verify import evidence as E

    ev.mkdir(parents=True, exist_ok=True)
    if isinstance(index.get("format"), int) and index["format"] >= 2 and "weights" not in index:
        index["weights"] = E.weight_digests(ev.parent)
    for name, doc in docs.items():
        data = json.dumps(doc).encode()
        (ev / name).write_bytes(data)
        index["files"][name] = E.file_entry(data).to_dict()
    index["content_sha256"] = E.content_sha256(index)
    (ev / E.INDEX).write_bytes(json.dumps(index).encode())
    return index


class JSONHandler(BaseHTTPRequestHandler):
    """A stand-in HTTP server's handler base: quiet logs, JSON answers with a length (``_send``)."""

    def log_message(self, *args):  # keep pytest output clean
        pass

    def _send(self, obj, code=200):
        body = json.dumps(obj).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
