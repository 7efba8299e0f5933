"""The ``openai`` and ``vllm`` engines: scoring through an OpenAI-compatible server's /v1/completions
with ``echo`` + ``logprobs`` (prompt log-probabilities), in pure Python (infertool.net, threads).

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

import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from infertool import net
from infertool.errors import BackendError, RuntimeFailure, TokenizerMismatch, UsageError
from infertool.evaluate.answers import MAX_TOKEN_ID, Malformed, PromptLogprobs, parse_prompt_logprobs, pmap
from infertool.evaluate.metrics import topk_kld
from infertool.data.formats import FORMAT_TYPES
from infertool.evaluate.structured import ChatAnswer, answer_from_reply
from infertool.evaluate.phases import Phase, Served, run_all
from infertool.evaluate.paired import (
    ChoicePair, EngineRun, GeneratePair, Paired, PairedAnswers, PairedChoices, PairedOutputs, PairedWindow,
    PerplexityPair, RequestItem, ScoreTask, StructuredPair, TaskTiming, cut_at_stop,
)

if TYPE_CHECKING:
    from infertool.serve.launches import LaunchPlan
    from infertool.serve.pool import ServerPool
    from infertool.tasks import Events


# How long the engine waits for a server (infertool.net's deadlines, not a timeout per read): one request (a
# window of prompt log-probabilities on a CPU server can take minutes), and the whole scoring of one model (a
# server that answers every request just in time cannot hold an eval for ever). Tests and slow hosts set them
# with the environment variables below (seconds).
REQUEST_S = 300.0
CONTROL_S = 60.0  # /v1/models and /tokenize (at most the request's deadline): no forward pass behind them
STAGE_S = 12 * 3600.0
REQUEST_ENV = "INFERTOOL_EVAL_REQUEST_S"
STAGE_ENV = "INFERTOOL_EVAL_STAGE_S"


def seconds_from_env(name: str, default: float) -> float:
    """A number of seconds from the environment variable ``name`` (finite, positive, at most a week), else
    ``default``; a bad value is a UsageError naming the variable."""
    text = os.environ.get(name, "").strip()
    if not text:
        return default
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and 0 < value <= 7 * 86400):
        raise UsageError(f"{name}={text[:40]!r} is not a number of seconds between 0 and 604800",
                         hint=f"unset {name} (default {default:g} s) or give a positive number")
    return value


_NET_HINTS = {
    "unreachable": "is the server running? check --url",
    "timeout": f"the server did not answer in time; {REQUEST_ENV} / {STAGE_ENV} set the limits (seconds)",
    "redirect": "give the server's final URL with --url: infertool follows no redirect (an API key goes only "
                "where you point it)",
    "too-large": "is this an OpenAI-compatible server? check --url",
    "broken": "is this an OpenAI-compatible server? check --url",
    "malformed": "is this an OpenAI-compatible server?",
}


def net_failure(e: net.NetError) -> BackendError:
    """A NetError as the engine's error: one line with its kind and URL, and the hint of that kind."""
    what = f"cannot reach {e.url}" if e.kind == "unreachable" else f"{e.url} gave no usable answer ({e.kind})"
    return BackendError(f"{what}: {e.reason}", hint=_NET_HINTS.get(e.kind))




class Client:
    """A minimal OpenAI-compatible client under infertool.net's policy: no redirect followed (the key goes only
    to the URL given), a deadline per request (``timeout_s``) and one for each model's whole scoring
    (``stage_s``: ``collect`` starts it), bounded bodies, and every failure a BackendError with the URL, what
    went wrong and a hint. The server's words are quoted with the key blanked."""

    def __init__(self, base_url: str, model: str, *, api_key: str | None = None, timeout_s: float | None = None,
                 stage_s: float | None = None):
        self.base_url = base_url.rstrip("/")
        if not self.base_url.endswith("/v1"):
            self.base_url += "/v1"
        self.root = self.base_url[: -len("/v1")]
        self.model = model
        self.api_key = api_key
        self.timeout_s = timeout_s if timeout_s is not None else seconds_from_env(REQUEST_ENV, REQUEST_S)
        self.stage_s = stage_s if stage_s is not None else seconds_from_env(STAGE_ENV, STAGE_S)
        self.deadline: net.Deadline | None = None
        self.requests = 0

    def start_stage(self) -> None:
        """A fresh deadline of ``stage_s`` for everything this client asks from now on (one model's scoring)."""
        self.deadline = net.Deadline(self.stage_s)

    def fetch(self, url: str, body: dict[str, Any] | None, max_bytes: int, control: bool = False) -> net.Answer:  # Any: JSON values
        """One exchange (POST with a JSON body, else GET; ``control``: a call without a forward pass, which
        gets CONTROL_S at most); a transport failure is a BackendError."""
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        seconds = min(self.timeout_s, CONTROL_S) if control else self.timeout_s
        self.requests += 1
        try:
            return net.fetch(url, method="POST" if body is not None else "GET", json_body=body, headers=headers,
                             deadline_s=seconds, deadline=self.deadline, max_bytes=max_bytes)
        except net.NetError as e:
            raise net_failure(e) from None

    def _request(self, url: str, body: dict[str, Any] | None, max_bytes: int = net.MAX_JSON_BYTES) -> dict[str, Any]:  # Any: JSON values
        """The JSON object a 2xx answer holds; any other answer is a BackendError."""
        ans = self.fetch(url, body, max_bytes)
        self._check(ans)
        try:
            return ans.json_object()
        except net.NetError as e:
            raise BackendError(f"{url} did not answer a JSON object: {e.reason}",
                               hint="is this an OpenAI-compatible server?") from None

    def _check(self, ans: net.Answer) -> None:
        """A 401 / 403 says the key is missing or refused; any other status but 2xx quotes the server's words."""
        url = ans.url
        if ans.status in (401, 403):
            raise BackendError(f"{url} answered HTTP {ans.status}: the server wants an API key "
                               + ("and refused the one sent" if self.api_key else "and none was sent"),
                               hint="put the key in the variable named by serve.api_key_env, and give the "
                               "server's URL with --url (a key is never sent to a URL from the recipe alone)")
        if not ans.ok:
            raise BackendError(f"{url} answered HTTP {ans.status}: {ans.detail() or '(no body)'}",
                               hint="the server failed while answering: its log says why (an engine crash, a kernel "
                               "this host lacks)" if ans.status >= 500 else
                               "check the model name and that the server supports this endpoint")

    def models(self) -> list[str] | None:
        """The model names /v1/models lists (entries without a string id are skipped); None when the server
        does not list them (an HTTP error other than 401 / 403, or an answer without a ``data`` list)."""
        data = self._list_field(self.base_url + "/models", None, net.MAX_SMALL_BYTES, "data")
        if data is None:
            return None
        return [m["id"] for m in data if isinstance(m, dict) and isinstance(m.get("id"), str)]

    def _list_field(self, url: str, body: dict[str, Any] | None, limit: int, field: str) -> list[Any] | None:  # Any: JSON values
        """A control call's list ``field``: None when the server has no such endpoint (an HTTP error other than
        401 / 403, a body that is not a JSON object, or no list there); 401 / 403 say what the key did."""
        ans = self.fetch(url, body, limit, control=True)
        if ans.status in (401, 403):
            self._check(ans)
        if not ans.ok:
            return None
        try:
            value = ans.json_object().get(field)
        except net.NetError:
            return None
        return value if isinstance(value, list) else None

    def check_served(self) -> None:
        """The model this client names is one the server lists (when it lists any): a wrong name fails here,
        before any scoring, with the names it does serve."""
        names = self.models()
        if names is None or self.model in names:
            return
        shown = ", ".join(net.quote(x, n=60) for x in names[:10]) + (", ..." if len(names) > 10 else "")
        raise BackendError(f"the server at {self.base_url} does not serve a model named {self.model!r}"
                           + (f" (it lists: {shown})" if names else " (it lists no model with a name)"),
                           hint="pass --base / --candidate as /v1/models lists them")

    def tokenize(self, text: str) -> list[int] | None:
        """Token ids from the server's /tokenize (vLLM); None when the server has no such endpoint (it answers
        an HTTP error, or not the vLLM shape). A server that does not answer in time, redirects, or sends ids
        that are not token ids is an error, never "no /tokenize"."""
        url = self.root + "/tokenize"
        limit = min(net.MAX_JSON_BYTES, net.MAX_SMALL_BYTES + 16 * len(text))  # the ids of a long corpus
        toks = self._list_field(url, {"model": self.model, "prompt": text, "add_special_tokens": False}, limit, "tokens")
        if toks is None:
            return None
        if not all(net.count(t, hi=MAX_TOKEN_ID) is not None for t in toks):
            raise BackendError(f"{url} answered token ids that are not integers in [0, 2^31]: "
                               + net.quote(repr(toks[:8]), n=80), hint=_NET_HINTS["malformed"])
        return toks

    def prompt_logprobs(self, prompt: str | list[int], k: int) -> PromptLogprobs:
        """Echoed prompt tokens with their log-probabilities and top-k alternatives (generated token dropped),
        checked (``parse_prompt_logprobs``)."""
        r = self._request(self.base_url + "/completions", {
            "model": self.model, "prompt": prompt, "max_tokens": 1, "temperature": 0.0,
            "echo": True, "logprobs": k,
        })
        return parse_prompt_logprobs(r, prompt, f"the server at {self.base_url} (model {self.model!r})")

    def generate(self, prompt: str | list[dict[str, Any]], *, max_tokens: int, stop: list[str], chat: bool) -> str:  # Any: JSON values
        """Greedy text for a prompt (a suite's chat item may give its messages instead)."""
        if chat:
            r = self._request(self.base_url + "/chat/completions", {
                "model": self.model, "messages": prompt if isinstance(prompt, list) else [{"role": "user", "content": prompt}],
                "max_tokens": max_tokens, "temperature": 0.0, "stop": stop or None})
            text = _first(r, "message", "content")
        else:
            r = self._request(self.base_url + "/completions", {
                "model": self.model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0,
                "stop": stop or None})
            text = _first(r, None, "text")
        if text is None:
            return ""
        if not isinstance(text, str):
            raise Malformed(f"the completion's text is not a string ({type(text).__name__})")
        return text

    def chat_answer(self, messages: list[dict[str, Any]], *, max_tokens: int,  # Any: JSON values
                    response_format: dict[str, Any] | None = None, tools: list[dict[str, Any]] | None = None,  # Any: JSON values
                    tool_choice: str | dict[str, Any] | None = None) -> ChatAnswer:  # Any: JSON values
        """One structured item through /v1/chat/completions, greedy (temperature 0): its messages, with the
        json task's ``response_format`` or the tool_call task's ``tools`` / ``tool_choice``; the first choice
        as an Answer (text, tool calls with their raw arguments, finish reason)."""
        optional = {"response_format": response_format, "tools": tools or None,
                    "tool_choice": tool_choice if tools else None}
        body = {"model": self.model, "messages": messages, "max_tokens": max_tokens, "temperature": 0.0,
                **{k: v for k, v in optional.items() if v is not None}}
        return answer_from_reply(self._request(self.base_url + "/chat/completions", body))


def _first(r: dict[str, Any], inner: str | None, key: str) -> Any:  # Any: a JSON value
    """choices[0][inner][key] of an answer (None where absent); a choice of the wrong type is Malformed."""
    choices = r.get("choices") or [{}]
    node = choices[0] if isinstance(choices, list) else None
    if inner is not None and isinstance(node, dict):
        node = node.get(inner) or {}
    if not isinstance(node, dict):
        raise Malformed("the answer's choices[0] is not an object")
    return node.get(key)




def collect(client: Client, tasks: list[dict[str, Any]], *, k: int, workers: int, events: Events,  # Any: JSON values
            label: str) -> dict[str, Any]:  # Any: JSON values
    """Score every task with ONE model (the one ``client`` names): raw per-token / per-item numbers."""
    out: dict[str, dict[str, Any]] = {}  # Any: JSON values
    stats = _Stats()
    t0 = time.monotonic()
    client.start_stage()  # one deadline for this model's whole scoring
    where = f"{label} model {client.model!r} at {client.base_url}"
    for task in map(ScoreTask.from_dict, tasks):
        prog = lambda n, total, what, name=task.name: events.progress(f"{label}:{name}", n, total, f"{label} {name}: {what}")  # noqa: E731
        what = f"of task {task.name!r} ({where})"
        if task.type == "perplexity":
            out[task.name] = _windows(client, task, k, workers, prog, what, stats)
        elif task.type == "multiple_choice":
            out[task.name] = _choices(client, task, workers, prog, what, stats)
        elif task.type in FORMAT_TYPES:
            out[task.name] = _answers(client, task, workers, prog, what)
        else:
            def gen(it: RequestItem) -> str:
                text = client.generate(it.messages or it.prompt, max_tokens=task.max_tokens, stop=task.stop,
                                       chat=task.chat)
                return cut_at_stop(text, task.stop)

            outs = pmap(gen, task.items, workers, lambda d: prog(d, len(task.items), "generate"), what=f"items {what}")
            out[task.name] = {"type": "generate", "items": [{"id": it.id, "out": o} for it, o in zip(task.items, outs)]}
    return {"tasks": out, "stats": {"tokens": stats.tokens, "gen_tokens": 0, "seconds": time.monotonic() - t0}}


def _answers(client: Client, task: ScoreTask, workers: int, prog: Progress, what: str) -> dict[str, Any]:  # Any: JSON values
    """A json / tool_call task: each item's chat answer as served, kept whole (text, tool calls, finish reason)."""
    def ask(it: RequestItem) -> ChatAnswer:
        return client.chat_answer(it.messages or [{"role": "user", "content": it.prompt}], max_tokens=task.max_tokens,
                                  response_format=it.response_format, tools=it.tools, tool_choice=it.tool_choice)

    answers = pmap(ask, task.items, workers, lambda d: prog(d, len(task.items), "answers"), what=f"items {what}")
    return {"type": task.type, "items": [{"id": it.id, "answer": a.to_dict()} for it, a in zip(task.items, answers)]}


@dataclass
class _Stats:
    tokens: int = 0


Progress = Callable[[int, int, str], None]


def _windows(client: Client, task: ScoreTask, k: int, workers: int, prog: Progress, what: str,
             stats: _Stats) -> dict[str, Any]:  # Any: JSON values
    """A perplexity task's windows of seq_len tokens, cut from the server's own token ids."""
    ids = client.tokenize(task.text)
    if ids is None:
        raise BackendError(f"the server at {client.base_url} has no /tokenize endpoint: perplexity windows of "
                           f"{task.seq_len} tokens cannot be cut the same way for both models",
                           hint="use a vLLM server (it has /tokenize), or the hf engine")
    L = task.seq_len
    n = min(len(ids) // L, task.max_windows or len(ids))
    if n < 1:
        raise UsageError(f"task {task.name!r}: fewer than one window of {L} tokens", hint="lower eval.seq_len")
    windows = [ids[i * L:(i + 1) * L] for i in range(task.window_start, n)]
    res = pmap(lambda w: client.prompt_logprobs(w, k), windows, workers,
               lambda d: prog(d, len(windows), "windows"), what=f"windows {what}")
    stats.tokens += sum(map(len, windows))
    items = [{"id": f"w{task.window_start + i:04d}", "lp": r.lp[1:], "top": r.top[1:], "tokens": r.tokens,
              "n_bytes": len("".join(r.tokens[1:]).encode("utf-8"))} for i, r in enumerate(res)]
    return {"type": "perplexity", "seq_len": L, "corpus_tokens": len(ids), "items": items}


def _choices(client: Client, task: ScoreTask, workers: int, prog: Progress, what: str,
             stats: _Stats) -> dict[str, Any]:  # Any: JSON values
    """A multiple-choice task: each continuation's log-likelihood after its context, and whether it is greedy."""
    reqs = [(i, it.context, c) for i, it in enumerate(task.items) for c in it.continuations]
    use_ids = client.tokenize("probe") is not None

    def score(req: tuple[int, str, str]) -> tuple[float, bool, int]:
        _, ctx, cont = req
        if use_ids:
            n_sp = len(ctx) - len(ctx.rstrip())
            if n_sp:
                ctx, cont = ctx[:-n_sp], ctx[-n_sp:] + cont
            ci, ki = client.tokenize(ctx) or [], client.tokenize(cont) or []
            r = client.prompt_logprobs(ci + ki, 1)
            idx = list(range(len(r.lp) - len(ki), len(r.lp)))
        else:
            r = client.prompt_logprobs(ctx + cont, 1)
            idx = [i for i, off in enumerate(r.offsets) if off >= len(ctx)]
            if not idx:
                raise RuntimeFailure(f"cannot locate the continuation {cont!r} in the server's tokens")
        greedy = all(r.top[i] and max(r.top[i], key=r.top[i].__getitem__) == r.tokens[i] for i in idx)
        return _loglik([r.lp[i] for i in idx], cont), greedy, len(r.tokens)

    scored = pmap(score, reqs, workers, lambda d: prog(d, len(reqs), "choices"), what=f"choices {what}")
    stats.tokens += sum(ntok for _, _, ntok in scored)
    lls: list[list[float]] = [[] for _ in task.items]
    greedy: list[list[bool]] = [[] for _ in task.items]
    for (i, _, _), (ll, g, _) in zip(reqs, scored):
        lls[i].append(ll)
        greedy[i].append(g)
    return {"type": "multiple_choice", "items": [
        {"id": it.id, "ll": lls[i], "greedy": greedy[i], "n_bytes": [len(c.encode("utf-8")) for c in it.continuations]}
        for i, it in enumerate(task.items)]}


def _loglik(lps: list[Any], cont: str) -> float:  # Any: JSON values
    """The log-likelihood of a continuation: the sum of its tokens' log-probabilities (each one scored; the
    first token of a prompt has none, so a continuation without context cannot be scored)."""
    if not lps or any(v is None for v in lps):
        raise RuntimeFailure(f"cannot score the continuation {net.quote(cont, n=60)!r}: it has no context to be "
                             "scored after", hint="every multiple-choice item needs a non-empty context")
    return math.fsum(lps)


def combine(raw_b: dict[str, Any], raw_c: dict[str, Any], k: int) -> dict[str, Paired]:  # Any: collect's raw output
    """Pair the two models' raw numbers (``collect``) task by task, item by item (top-k KLD)."""
    tasks: dict[str, Paired] = {}
    for name, tb in raw_b["tasks"].items():
        pairs = list(zip(tb["items"], raw_c["tasks"][name]["items"]))
        if tb["type"] == "perplexity":
            tasks[name] = PerplexityPair([_window(name, wb, wc) for wb, wc in pairs], seq_len=tb["seq_len"],
                                         corpus_tokens=tb["corpus_tokens"], kld_kind=f"top-{k}")
        elif tb["type"] in FORMAT_TYPES:
            tasks[name] = StructuredPair(tb["type"], [PairedAnswers(ib["id"], ChatAnswer.from_dict(ib["answer"]),
                                                                    ChatAnswer.from_dict(ic["answer"])) for ib, ic in pairs])
        elif tb["type"] == "multiple_choice":
            tasks[name] = ChoicePair([PairedChoices(ib["id"], ib["ll"], ic["ll"], ib["n_bytes"], ib["greedy"],
                                                    ic["greedy"]) for ib, ic in pairs])
        else:
            tasks[name] = GeneratePair([PairedOutputs(ib["id"], ib["out"], ic["out"]) for ib, ic in pairs])
    return tasks


def _window(task: str, wb: dict[str, Any], wc: dict[str, Any]) -> PairedWindow:  # Any: collect's raw window
    if wb["tokens"] != wc["tokens"]:
        raise TokenizerMismatch(f"task {task!r} window {wb['id']}", hint="base and candidate must share a tokenizer")
    kld, cov, same = [], [], []
    for topb, topc in zip(wb["top"], wc["top"]):
        d, m = topk_kld(topb, topc)
        kld.append(d)
        cov.append(m)
        same.append(int(bool(topb) and bool(topc) and max(topb, key=topb.get) == max(topc, key=topc.get)))
    return PairedWindow(wb["id"], wb["n_bytes"], wb["lp"], wc["lp"], kld, same, cov)


def _timing(raw_b: dict[str, Any], raw_c: dict[str, Any]) -> dict[str, TaskTiming]:  # Any: collect's raw output
    sb, sc = raw_b["stats"], raw_c["stats"]
    return {"all": TaskTiming(sb["seconds"], sc["seconds"], sb["tokens"], wall_s=sb["seconds"] + sc["seconds"])}


def compare_openai(cb: Client, cc: Client, tasks: list[dict[str, Any]], *, k: int, workers: int, events: Events,  # Any: JSON values
                   phases: list[Phase] | None = None, log_dir: Path | None = None) -> EngineRun:
    """Both models on already running OpenAI-compatible server(s): ``cb`` names the base, ``cc`` the candidate.
    ``phases`` (infertool.evaluate.phases): more work on each server, the base first."""
    for client in dict.fromkeys((cb, cc)):
        client.check_served()
    done: dict[str, Any] = {}  # Any: JSON values
    raw_b = collect(cb, tasks, k=k, workers=workers, events=events, label="base")
    run_all(phases or [], Served("base", cb, None, log_dir), done, events)
    raw_c = collect(cc, tasks, k=k, workers=workers, events=events, label="candidate")
    run_all(phases or [], Served("candidate", cc, None, log_dir), done, events)
    return EngineRun("openai", combine(raw_b, raw_c, k), _timing(raw_b, raw_c), {"name": cb.model, "url": cb.base_url},
                     {"name": cc.model, "url": cc.base_url}, done, k)


# --------------------------------------------------------------------------------------------
# vLLM: infertool starts the servers itself, with the ONE launcher and the recipe's serve settings
# --------------------------------------------------------------------------------------------


def compare_vllm(plans: dict[str, LaunchPlan], tasks: list[dict[str, Any]], *, k: int, workers: int, events: Events,  # Any: JSON values
                 log_dir: Path, pool: ServerPool | None = None, phases: list[Phase] | None = None) -> EngineRun:
    """One vLLM server per model (``plans``: {"candidate": LaunchPlan, "base": LaunchPlan} from
    ``infertool.serve.prepare``: the recipe's effective serve settings for each), one after the other,
    each stopped before the next starts (``pool``: `run`'s shared servers, which the pool stops). The
    candidate first: a quantized checkpoint this host's vLLM cannot run fails before any work on the base.
    ``phases`` (infertool.evaluate.phases): more work on each server while it is up (lm-eval tasks, the decode
    path), the candidate's first."""
    from infertool.serve import launch
    from infertool.serve.launcher import HOST_KERNEL_MISSING, HostCannotRun, full_log

    raws = {}
    servers = {}
    done: dict[str, Any] = {}  # Any: JSON values
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
                    run_all(phases or [], Served(label, client, plan.model.path, log_dir), done, events)
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
    models = {label: {"path": plans[label].model.path, "server": servers[label]} for label in ("base", "candidate")}
    return EngineRun("vllm", combine(raws["base"], raws["candidate"], k), _timing(raws["base"], raws["candidate"]),
                     models["base"], models["candidate"], done, k)
