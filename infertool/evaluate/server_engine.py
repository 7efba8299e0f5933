"""The ``openai`` and ``vllm`` engines: scoring through an OpenAI-compatible server's /v1/completions
with ``echo`` + ``logprobs`` (prompt log-probabilities), in pure Python (urllib, threads).

A server returns only the top-k log-probabilities of each position (vLLM's --max-logprobs, default 20),
so KL divergence here is the top-k coarse-grained lower bound of metrics.topk_kld, and the covered
probability mass is reported with it. A server that returns no prompt log-probabilities makes every
log-likelihood task fail with a clear error: scoring such tasks anyway would silently give chance-level
results (llama.cpp server issue #27174 did exactly that in lm-eval).

``vllm`` starts one server per model with infertool's one launcher (``infertool.serve``), with the
recipe's serve settings, and scores the two models one after the other; ``openai`` uses the URL it is given, where base and candidate are served
model names.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from infertool.errors import BackendError, RuntimeFailure, UsageError
from infertool.evaluate.metrics import topk_kld

NO_PROMPT_LOGPROBS_HINT = (
    "log-likelihood tasks (perplexity, multiple_choice) need prompt log-probabilities: a server that "
    "accepts /v1/completions with echo=true and logprobs=N (vLLM does; start it with --max-logprobs 20). "
    "Generation-only suites (e.g. synthetic-gen) work without them"
)


class NoPromptLogprobs(BackendError):
    """The server answered, but without prompt log-probabilities."""


class Client:
    """A minimal OpenAI-compatible client: bounded timeouts, clear errors, no third-party packages."""

    def __init__(self, base_url: str, model: str, *, api_key: str | None = None, timeout_s: float = 300):
        self.base_url = base_url.rstrip("/")
        if not self.base_url.endswith("/v1"):
            self.base_url += "/v1"
        self.root = self.base_url[: -len("/v1")]
        self.model = model
        self.api_key = api_key
        self.timeout_s = timeout_s
        self.requests = 0

    def _request(self, url: str, body: dict | None) -> dict:
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(url, data=data, method="POST" if body is not None else "GET")
        req.add_header("Content-Type", "application/json")
        if self.api_key:
            req.add_header("Authorization", f"Bearer {self.api_key}")
        self.requests += 1
        try:
            with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:
                return json.loads(resp.read().decode("utf-8"))
        except urllib.error.HTTPError as e:
            detail = e.read().decode("utf-8", "replace")[:500]
            if e.code in (401, 403):
                raise BackendError(f"{url} answered HTTP {e.code}: the server wants an API key "
                                   + ("and refused the one sent" if self.api_key else "and none was sent"),
                                   hint="put the key in the variable named by serve.api_key_env, and give the "
                                   "server's URL with --url (a key is never sent to a URL from the recipe alone)") from None
            raise BackendError(f"{url} answered HTTP {e.code}: {detail}",
                               hint="check the model name and that the server supports this endpoint") from None
        except (urllib.error.URLError, TimeoutError, ConnectionError, OSError) as e:
            reason = getattr(e, "reason", e)
            raise BackendError(f"cannot reach {url}: {reason}", hint="is the server running? check --url") from None
        except json.JSONDecodeError:
            raise BackendError(f"{url} did not answer JSON", hint="is this an OpenAI-compatible server?") from None

    def models(self) -> list[str]:
        return [m.get("id") for m in self._request(self.base_url + "/models", None).get("data", [])]

    def tokenize(self, text: str) -> list[int] | None:
        """Token ids from the server's /tokenize (vLLM); None when the server has no such endpoint."""
        try:
            r = self._request(self.root + "/tokenize", {"model": self.model, "prompt": text, "add_special_tokens": False})
        except BackendError:
            return None
        toks = r.get("tokens")
        return [int(t) for t in toks] if isinstance(toks, list) else None

    def prompt_logprobs(self, prompt: str | list[int], k: int) -> dict:
        """Echoed prompt tokens with their log-probabilities and top-k alternatives (generated token dropped)."""
        r = self._request(self.base_url + "/completions", {
            "model": self.model, "prompt": prompt, "max_tokens": 1, "temperature": 0.0,
            "echo": True, "logprobs": k,
        })
        choice = (r.get("choices") or [{}])[0]
        lp = choice.get("logprobs") or {}
        tokens = lp.get("tokens") or []
        token_lps = lp.get("token_logprobs") or []
        n_prompt = len(prompt) if isinstance(prompt, list) else (r.get("usage") or {}).get("prompt_tokens")
        if not tokens or not token_lps or not any(v is not None for v in token_lps[1:n_prompt or None]):
            raise NoPromptLogprobs(
                f"the server at {self.base_url} returned no prompt log-probabilities for model {self.model!r} "
                "(echo + logprobs): refusing to score log-likelihood tasks, which would come out at chance",
                hint=NO_PROMPT_LOGPROBS_HINT,
            )
        if n_prompt is None:
            n_prompt = len(tokens) - 1
        top = lp.get("top_logprobs") or [None] * len(tokens)
        offsets = lp.get("text_offset") or []
        return {
            "tokens": tokens[:n_prompt],
            "lp": token_lps[:n_prompt],
            "top": [t or {} for t in top[:n_prompt]],
            "offsets": offsets[:n_prompt],
        }

    def generate(self, prompt: str, *, max_tokens: int, stop: list[str], chat: bool) -> str:
        if chat:
            r = self._request(self.base_url + "/chat/completions", {
                "model": self.model, "messages": [{"role": "user", "content": prompt}],
                "max_tokens": max_tokens, "temperature": 0.0, "stop": stop or None})
            return ((r.get("choices") or [{}])[0].get("message") or {}).get("content") or ""
        r = self._request(self.base_url + "/completions", {
            "model": self.model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0, "stop": stop or None})
        return (r.get("choices") or [{}])[0].get("text") or ""


def _pmap(fn: Callable, items: list, workers: int, progress: Callable[[int], None] | None = None) -> list:
    """Map over items with a bounded thread pool, preserving order (the server batches concurrent requests)."""
    out = [None] * len(items)
    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        futures = {pool.submit(fn, it): i for i, it in enumerate(items)}
        done = 0
        for fut in futures:
            out[futures[fut]] = fut.result()
            done += 1
            if progress:
                progress(done)
    return out


def collect(client: Client, tasks: list[dict], *, k: int, workers: int, events, label: str) -> dict:
    """Score every task with ONE model (the one ``client`` names): raw per-token / per-item numbers."""
    out: dict[str, dict] = {}
    stats = {"tokens": 0, "gen_tokens": 0, "seconds": 0.0}
    t0 = time.monotonic()
    for task in tasks:
        name = task["name"]
        prog = lambda n, total, what, name=name: events.progress(f"{label}:{name}", n, total, f"{label} {name}: {what}")  # noqa: E731
        if task["type"] == "perplexity":
            ids = client.tokenize(task["text"])
            if ids is None:
                raise BackendError(f"the server at {client.base_url} has no /tokenize endpoint: perplexity windows of "
                                   f"{task['seq_len']} tokens cannot be cut the same way for both models",
                                   hint="use a vLLM server (it has /tokenize), or the hf engine")
            L = int(task["seq_len"])
            n = len(ids) // L
            if task.get("max_windows"):
                n = min(n, int(task["max_windows"]))
            if n < 1:
                raise UsageError(f"task {name!r}: fewer than one window of {L} tokens", hint="lower eval.seq_len")
            start = int(task.get("window_start") or 0)  # scoring in rounds: windows [start, n) of the same cut
            windows = [ids[i * L:(i + 1) * L] for i in range(start, n)]
            res = _pmap(lambda w: client.prompt_logprobs(w, k), windows, workers,
                        lambda d: prog(d, len(windows), "windows"))
            items = []
            for i, r in enumerate(res):
                items.append({"id": f"w{start + i:04d}", "lp": r["lp"][1:], "top": r["top"][1:], "tokens": r["tokens"],
                              "n_bytes": len("".join(r["tokens"][1:]).encode("utf-8"))})
                stats["tokens"] += len(windows[i])
            out[name] = {"type": "perplexity", "seq_len": L, "corpus_tokens": len(ids), "items": items}
        elif task["type"] == "multiple_choice":
            reqs = [(i, j, it["context"], c) for i, it in enumerate(task["items"]) for j, c in enumerate(it["continuations"])]
            use_ids = client.tokenize("probe") is not None

            def score(req):
                _, _, ctx, cont = req
                if use_ids:
                    n_sp = len(ctx) - len(ctx.rstrip())
                    if n_sp:
                        ctx, cont = ctx[:-n_sp], ctx[-n_sp:] + cont
                    ci, ki = client.tokenize(ctx) or [], client.tokenize(cont) or []
                    r = client.prompt_logprobs(ci + ki, 1)
                    nc = len(ki)
                    sel = r["lp"][len(r["lp"]) - nc:]
                    greedy = all(max(t, key=t.get) == tok if t else False
                                 for t, tok in zip(r["top"][-nc:], r["tokens"][-nc:]))
                    return sum(sel), greedy, len(ci) + nc
                r = client.prompt_logprobs(ctx + cont, 1)
                idx = [i for i, off in enumerate(r["offsets"]) if off >= len(ctx)]
                if not idx:
                    raise RuntimeFailure(f"cannot locate the continuation {cont!r} in the server's tokens")
                greedy = all(r["top"][i] and max(r["top"][i], key=r["top"][i].get) == r["tokens"][i] for i in idx)
                return sum(r["lp"][i] for i in idx), greedy, len(r["tokens"])

            res = _pmap(score, reqs, workers, lambda d: prog(d, len(reqs), "choices"))
            by_item: dict[int, dict] = {}
            for (i, j, _, cont), (ll, greedy, ntok) in zip(reqs, res):
                d = by_item.setdefault(i, {"ll": [], "greedy": [], "n_bytes": []})
                d["ll"].append(ll)
                d["greedy"].append(greedy)
                d["n_bytes"].append(len(cont.encode("utf-8")))
                stats["tokens"] += ntok
            out[name] = {"type": "multiple_choice",
                         "items": [{"id": it["id"], **by_item[i]} for i, it in enumerate(task["items"])]}
        else:
            stop = list(task.get("stop") or [])

            def gen(it):
                text = client.generate(it["prompt"], max_tokens=int(task.get("max_tokens", 32)), stop=stop, chat=bool(task.get("chat")))
                for st in stop:
                    if st and st in text:
                        text = text[:text.index(st)]
                return text

            outs = _pmap(gen, task["items"], workers, lambda d: prog(d, len(task["items"]), "generate"))
            out[name] = {"type": "generate", "items": [{"id": it["id"], "out": o} for it, o in zip(task["items"], outs)]}
    stats["seconds"] = time.monotonic() - t0
    return {"tasks": out, "stats": stats}


def combine(raw_b: dict, raw_c: dict, k: int) -> dict:
    """Pair the two models' raw numbers into the format the hf engine returns (top-k KLD)."""
    tasks = {}
    for name, tb in raw_b["tasks"].items():
        tc = raw_c["tasks"][name]
        if tb["type"] == "perplexity":
            items = []
            for wb, wc in zip(tb["items"], tc["items"]):
                if wb["tokens"] != wc["tokens"]:
                    raise RuntimeFailure(f"task {name!r} window {wb['id']}: the two servers tokenized differently",
                                         hint="base and candidate must share a tokenizer")
                kld, cov, same = [], [], []
                for topb, topc in zip(wb["top"], wc["top"]):
                    d, m = topk_kld(topb, topc)
                    kld.append(d)
                    cov.append(m)
                    same.append(int(bool(topb) and bool(topc) and max(topb, key=topb.get) == max(topc, key=topc.get)))
                items.append({"id": wb["id"], "n_bytes": wb["n_bytes"], "lp_b": wb["lp"], "lp_c": wc["lp"],
                              "kld": kld, "same_top1": same, "covered_b": cov})
            tasks[name] = {"type": "perplexity", "seq_len": tb["seq_len"], "corpus_tokens": tb["corpus_tokens"],
                           "kld_kind": f"top-{k}", "items": items}
        elif tb["type"] == "multiple_choice":
            tasks[name] = {"type": "multiple_choice", "items": [
                {"id": ib["id"], "ll_b": ib["ll"], "ll_c": ic["ll"], "greedy_b": ib["greedy"], "greedy_c": ic["greedy"],
                 "n_bytes": ib["n_bytes"]} for ib, ic in zip(tb["items"], tc["items"])]}
        else:
            tasks[name] = {"type": "generate", "items": [
                {"id": ib["id"], "out_b": ib["out"], "out_c": ic["out"]} for ib, ic in zip(tb["items"], tc["items"])]}
    return tasks


def _timing(raw_b: dict, raw_c: dict) -> dict:
    sb, sc = raw_b["stats"], raw_c["stats"]
    return {"all": {"base_s": sb["seconds"], "cand_s": sc["seconds"], "tokens": sb["tokens"],
                    "wall_s": sb["seconds"] + sc["seconds"]}}


def compare_openai(cb: Client, cc: Client, tasks: list[dict], *, k: int, workers: int, events) -> dict:
    """Both models on already running OpenAI-compatible server(s): ``cb`` names the base, ``cc`` the candidate."""
    raw_b = collect(cb, tasks, k=k, workers=workers, events=events, label="base")
    raw_c = collect(cc, tasks, k=k, workers=workers, events=events, label="candidate")
    return {"engine": "openai", "tasks": combine(raw_b, raw_c, k), "timing": _timing(raw_b, raw_c),
            "models": {"base": {"name": cb.model, "url": cb.base_url}, "candidate": {"name": cc.model, "url": cc.base_url}},
            "topk": k}


# --------------------------------------------------------------------------------------------
# vLLM: infertool starts the servers itself, with the ONE launcher and the recipe's serve settings
# --------------------------------------------------------------------------------------------


def compare_vllm(plans: dict, tasks: list[dict], *, k: int, workers: int, events, log_dir: Path, pool=None) -> dict:
    """One vLLM server per model (``plans``: {"candidate": LaunchPlan, "base": LaunchPlan} from
    ``infertool.serve.prepare``: the recipe's effective serve settings for each), one after the other,
    each stopped before the next starts (``pool``: `run`'s shared servers, which the pool stops). The
    candidate first: a quantized checkpoint this host's vLLM cannot run fails before any work on the base."""
    from infertool.serve import launch
    from infertool.serve.launcher import HOST_KERNEL_MISSING, HostCannotRun, full_log

    raws = {}
    servers = {}
    for label in ("candidate", "base"):
        plan = plans[label]
        log_path = log_dir / f"vllm-{label}.log"
        events.log(f"the vLLM server of the {label} model ({plan.model.label})")
        try:
            with launch(plan, log_path, label=f"the {label} model", pool=pool) as srv:
                log_path = srv.log_path
                client = Client(srv.url, srv.model, api_key=srv.api_key)
                try:
                    client.prompt_logprobs(list(range(1, 9)), 1)  # a first forward pass: fail fast
                    raws[label] = collect(client, tasks, k=k, workers=workers, events=events, label=label)
                except BackendError:
                    time.sleep(1.0)  # let the server finish writing its traceback
                    found = HOST_KERNEL_MISSING.search(full_log(log_path))
                    if found:
                        raise HostCannotRun(f"vLLM on this host loads {plan.model.label} but cannot run it "
                                            f"({found.group(0)})", log_path=str(log_path)) from None
                    raise
                servers[label] = {"url": srv.url, "ready_s": round(srv.ready_s, 1), "argv": srv.plan.spec.argv,
                                  "log": str(log_path), "reused": srv.reused}
        except HostCannotRun as e:
            raise BackendError(
                f"{e.message.splitlines()[0]}: this vLLM build has no weight-only quantized GEMM kernel for this CPU",
                hint="use --engine hf (it loads GPTQ/AWQ checkpoints in transformers), or run the vllm engine on a "
                "CUDA or AVX-512 host", log_path=e.log_path) from None
    return {"engine": "vllm", "tasks": combine(raws["base"], raws["candidate"], k), "timing": _timing(raws["base"], raws["candidate"]),
            "models": {"base": {"path": plans["base"].model.path, "server": servers["base"]},
                       "candidate": {"path": plans["candidate"].model.path, "server": servers["candidate"]}}, "topk": k}
