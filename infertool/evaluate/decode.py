"""The decode path as served (issue 21): greedy continuations of a fixed prompt set from each served model,
compared token by token, and the decode-step distributions compared on the SAME contexts (teacher forcing).

Why: prompt log-probabilities (the suite's scoring) exercise only the prefill path. CUDA graphs, torch.compile and
speculative decoding act on decode steps, so the settings tune varies most are checked here.

How (``DecodePhase``, the infertool.evaluate.phases protocol):

- Both models get the SAME token-id prompts: the server tokenizes (vLLM's /tokenize: ``prompt``, or ``messages`` +
  ``add_generation_prompt`` through the model's chat template), the second model's ids must equal the first's.
- ``run`` on each model: greedy generation (temperature 0) through /v1/completions with a token-id prompt,
  ``logprobs: top_k`` and ``return_tokens_as_token_ids`` (vLLM), keeping every step's generated token id and its
  top-k log-probabilities. The FIRST generated position of a request comes from the prefill's forward pass; the
  others are decode steps (``prefill`` marks them).
- The model served SECOND (``prior`` is the first one's raw) is also teacher-forced on the first one's greedy
  tokens on its own decode path: its own greedy run covers the positions up to its first divergence d; a new
  request continues from prompt + first[:d+1], and so on after each divergence, at most MAX_FORCED_REQUESTS
  requests per prompt; a remainder past that bound is covered by one echo request (prompt log-probabilities:
  prefill positions). Every position of the first one's continuation then has both models' distributions at
  the same context.
- ``compare``: the exact-match rate of the greedy continuations (Wilson interval), the median position of the
  first divergence (order-statistic interval; a prompt that never diverges counts as max_tokens, censored),
  the decode KLD (metrics.topk_kld: KL(reference || candidate) over the reference's top-k plus a rest bucket, a
  lower bound) and top-1 agreement over DECODE-step positions only (positions where either model's value came
  from a prefill are left out and counted as ``prefill_steps``), each the ratio of per-prompt sums with a
  cluster-robust interval (prompts are the clusters: steps of one prompt are correlated), and near ties:
  divergences where the reference's top-2 gap was below ``near_tie_logprob`` nats, counted apart from the
  other ``divergences`` (not damage: the two were nearly tied there).

A server that cannot do this (no /tokenize, no per-step log-probabilities with token ids: not vLLM) makes the
phase skip with the reason (``skipped``): the decode gate is then "not measured", never a verdict on guesses.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from infertool import inputs, net
from infertool.data.formats import messages_problem
from infertool.data.suites import DECODE_PROMPTS_BUILTIN as BUILTIN  # eval.decode.prompts: infertool's own set
from infertool.errors import BackendError, TokenizerMismatch, UsageError
from infertool.evaluate import metrics as M
from infertool.evaluate.answers import (LP_CEIL, LP_FLOOR, MAX_TOKEN_ID, CompletionChoice, Malformed, parse_prompt_logprobs,
                                        pmap)
from infertool.evaluate.result import DecodeComparison, Diverged
from infertool.records import Record, Sparse

if TYPE_CHECKING:
    from infertool.evaluate.phases import Served
    from infertool.recipe import DecodeSpec
    from infertool.tasks import Events

Client = Any  # server_engine.Client (or a stand-in): server_engine imports phases, whose caller imports this module

MAX_FORCED_REQUESTS = 8  # teacher-forcing requests per prompt beyond its own greedy run (then one echo request)
MAX_PROMPTS = 100_000
MAX_TEXT_CHARS = 400  # a continuation's text kept for the examples (the figures use token ids)
SHOWN_DIVERGED = 50  # diverged prompts listed in the block (with both texts)
WORKERS = 8  # requests in flight per server (vLLM batches them)
_TOKEN_ID = re.compile(r"^token_id:(\d{1,10})$")
_PROMPTS_HINT = ("a decode prompt file is JSONL: one object a line with an \"id\" and either \"prompt\" (text) or "
                 "\"messages\" ([{\"role\": \"user\", \"content\": ...}]); see docs/evals.md")


@dataclass
class Forced(Record):
    """The second model's top-k at every position of the first one's continuation (``teacher_force``)."""

    top: list[dict[str, float] | None] = field(default_factory=list)
    prefill: list[bool] = field(default_factory=list)  # position j's value came from a prefill
    requests: int = 0
    echoed: int = 0


@dataclass
class DecodePrompt(Sparse):
    """One prompt's greedy continuation on one model: its token ids, each step's top-k, the finish reason and the
    text (``parse_generation``), and for the model served second its ``forced`` top-k."""

    OMIT_NONE = ("forced",)
    id: str = ""
    prompt_ids: list[int] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    top: list[dict[str, float]] = field(default_factory=list)
    finish: str | None = None
    text: str | None = None
    prefill: list[bool] = field(default_factory=list)
    forced: Forced | None = None


@dataclass
class DecodeRaw(Sparse):
    """One model's raw numbers of the decode phase (``DecodePhase.run``'s JSON, read back by ``compare``)."""

    OMIT_NONE = ("skipped", "chat", "top_k", "max_tokens")
    skipped: str | None = None  # why the server could not run the phase
    chat: bool | None = None
    top_k: int | None = None
    max_tokens: int | None = None
    prompts: list[DecodePrompt] = field(default_factory=list)


# --------------------------------------------------------------------------------------------
# The prompt set
# --------------------------------------------------------------------------------------------


def builtin_path() -> Path:
    """infertool's own decode prompts (package data: infertool/_data/evals/decode-prompts.jsonl)."""
    from infertool.data.suites import decode_prompts_path

    return decode_prompts_path()


def _check_prompt(obj: Any, n: int) -> tuple[dict[str, Any] | None, str | None]:  # Any: JSON values
    """One line's prompt record, or why it is not one (the line number in the message)."""
    if not isinstance(obj, dict):
        return None, f"line {n}: not a JSON object"
    pid = obj.get("id")
    if not isinstance(pid, (str, int)) or isinstance(pid, bool) or not str(pid).strip():
        return None, f"line {n}: needs an \"id\" (a string or an integer)"
    has_p, has_m = "prompt" in obj, "messages" in obj
    if has_p == has_m:
        return None, f"line {n}: needs exactly one of \"prompt\" and \"messages\""
    if has_p:
        if not isinstance(obj["prompt"], str) or not obj["prompt"]:
            return None, f"line {n}: \"prompt\" must be a non-empty string"
        return {"id": str(pid), "prompt": obj["prompt"]}, None
    msgs = obj["messages"]
    if messages_problem(msgs) or not all(set(m) <= {"role", "content"} for m in msgs):
        return None, (f"line {n}: \"messages\" must be a non-empty list of {{\"role\": system|user|assistant, "
                      "\"content\": text}, the last one the user's")
    return {"id": str(pid), "messages": [dict(m) for m in msgs]}, None


def parse_prompts(text: str, where: str) -> list[dict[str, Any]]:  # Any: JSON values
    """The prompt records of a JSONL text; EVERY bad line is listed with its number in one UsageError."""
    out: list[dict[str, Any]] = []  # Any: JSON values
    bad: dict[int, str] = {}  # line number -> why, listed in file order
    seen: set[Any] = set()  # Any: JSON values
    for n, obj in inputs.parse_jsonl(text, where, "eval.decode.prompts", max_rows=None, bad=bad):
        rec, why = _check_prompt(obj, n)
        if why is None and rec is not None and rec["id"] in seen:
            why = f"line {n}: duplicate id {net.quote(rec['id'], n=40)!r}"
        if why:
            bad[n] = why
        elif rec is not None:
            seen.add(rec["id"])
            out.append(rec)
    if bad:
        listed = [bad[n] for n in sorted(bad)]
        shown = "; ".join(listed[:50]) + (f"; ... ({len(bad) - 50} more)" if len(bad) > 50 else "")
        raise UsageError(f"{where}: {len(bad)} bad line(s): {shown}", hint=_PROMPTS_HINT)
    if not out:
        raise UsageError(f"{where}: no prompts", hint=_PROMPTS_HINT)
    if len(out) > MAX_PROMPTS:
        raise UsageError(f"{where}: {len(out):,} prompts; at most {MAX_PROMPTS:,}", hint="use eval.decode.n_prompts")
    return out


def load_prompts(source: str) -> list[dict[str, Any]]:  # Any: JSON values
    """The prompt set: ``builtin`` (infertool's own) or a user's .jsonl (``infertool.inputs``: a regular UTF-8 file,
    bounded)."""
    path = builtin_path() if source == BUILTIN else Path(source).expanduser()
    return parse_prompts(inputs.read_text(path, inputs.DECODE_PROMPTS, "eval.decode.prompts"), str(path))


def as_plain_text(messages: list[dict[str, Any]]) -> str:  # Any: JSON values
    """A chat prompt as a completion prompt, for a model without a chat template (or ``chat: false``)."""
    label = {"system": "", "user": "User: ", "assistant": "Assistant: "}
    return "\n".join(label[m["role"]] + m["content"] for m in messages) + "\nAssistant:"


# --------------------------------------------------------------------------------------------
# Talking to the server (through the engine's Client: infertool.net's policy)
# --------------------------------------------------------------------------------------------


def _post(client: Client, path: str, body: dict[str, Any], *, control: bool = False, root: bool = False) -> tuple[int, dict[str, Any] | None, str]:  # Any: JSON values
    """(status, the JSON object or None, the server's words quoted) of one POST; 401 / 403 raise (the key)."""
    url = (client.root if root else client.base_url) + path
    ans = client.fetch(url, body, net.MAX_JSON_BYTES, control=control)
    if ans.status in (401, 403):
        client._check(ans)
    if not ans.ok:
        return ans.status, None, ans.detail() or "(no body)"
    try:
        return ans.status, ans.json_object(), ""
    except net.NetError as e:
        return ans.status, None, e.reason


@dataclass
class PromptInput(Record):
    """A decode prompt: a text, or a chat item's conversation (``parse_prompts``' dicts, read by the phase)."""

    id: str = ""
    prompt: str | None = None
    messages: list[dict[str, str]] | None = None


def _tokenize(client: Client, prompt: PromptInput, chat: bool) -> list[int] | None:
    """The prompt's token ids as the server's tokenizer makes them (a chat prompt through its chat template);
    None when the server refuses (no /tokenize, or no chat template for ``messages``)."""
    if prompt.messages is not None and chat:
        body = {"model": client.model, "messages": prompt.messages, "add_generation_prompt": True}
    else:
        text = prompt.prompt or as_plain_text(prompt.messages or [])
        body = {"model": client.model, "prompt": text, "add_special_tokens": True}
    status, obj, _ = _post(client, "/tokenize", body, control=True, root=True)
    toks = obj.get("tokens") if obj else None
    if not isinstance(toks, list) or not toks:
        return None
    if not all(net.count(t, hi=MAX_TOKEN_ID) is not None for t in toks):
        raise BackendError(f"{client.root}/tokenize answered token ids that are not integers: "
                           + net.quote(repr(toks[:8]), n=80), hint="is this a vLLM server?")
    return toks


def _token_id(v: Any, where: str) -> int:  # Any: a JSON value
    m = _TOKEN_ID.match(v) if isinstance(v, str) else None
    if m is None:
        raise Malformed(f"{where} is {net.quote(repr(v), n=40)}, not \"token_id:N\" (return_tokens_as_token_ids)")
    return int(m.group(1))


def _top(v: Any, where: str) -> dict[str, float]:  # Any: a JSON value
    """One step's top-k as {token id (str): log-probability}, checked."""
    if not isinstance(v, dict) or not v:
        raise Malformed(f"{where} is not a non-empty object of log-probabilities")
    out = {}
    for k, x in v.items():
        lp = net.number(x, lo=LP_FLOOR, hi=LP_CEIL)
        if lp is None:
            raise Malformed(f"{where}[{net.quote(str(k), n=24)!r}] is not a log-probability")
        out[str(_token_id(k, where))] = min(lp, 0.0)
    return out


def parse_generation(r: dict[str, Any], where: str) -> DecodePrompt:  # Any: JSON values
    """A greedy completion's generated token ids, each step's top-k and the finish reason; no per-step
    log-probabilities with token ids at all: Malformed with "no per-step" in its message."""
    c = CompletionChoice.of(r, f"{where}: ")
    toks, tops = c.lists.tokens, c.lists.top_logprobs
    if not isinstance(toks, list) or not isinstance(tops, list) or len(tops) != len(toks):
        raise Malformed(f"{where}: no per-step log-probabilities (logprobs.tokens / top_logprobs)")
    ids = [_token_id(t, f"{where}: logprobs.tokens[{i}]") for i, t in enumerate(toks)]
    top = [_top(t, f"{where}: top_logprobs[{i}]") for i, t in enumerate(tops)]
    finish, text = c.finish_reason, c.text
    return DecodePrompt(tokens=ids, top=top, finish=finish if isinstance(finish, str) else None,
                        text=net.quote(text, n=MAX_TEXT_CHARS) if isinstance(text, str) else None)


def _generate(client: Client, ids: list[int], max_tokens: int, k: int) -> DecodePrompt:
    """Greedy continuation of a token-id prompt with the top-k of every step (vLLM's token-id form)."""
    r = client._request(client.base_url + "/completions", {
        "model": client.model, "prompt": ids, "max_tokens": max_tokens, "temperature": 0.0, "logprobs": k,
        "return_tokens_as_token_ids": True})
    return parse_generation(r, f"the server at {client.base_url} (model {client.model!r})")


def _echo_tops(client: Client, ids: list[int], k: int) -> list[dict[str, Any]]:  # Any: JSON values
    """The top-k at every position of a token-id prompt (prefill: prompt log-probabilities)."""
    r = client._request(client.base_url + "/completions", {
        "model": client.model, "prompt": ids, "max_tokens": 1, "temperature": 0.0, "echo": True, "logprobs": k,
        "return_tokens_as_token_ids": True})
    got = parse_prompt_logprobs(r, ids, f"the server at {client.base_url} (model {client.model!r})")
    return [{str(_token_id(t, "top_logprobs")): v for t, v in top.items()} if top else {} for top in got.top]


def probe(client: Client, k: int) -> str | None:
    """Why this server cannot run the decode phase (None: it can): it needs /tokenize and greedy generation with
    per-step top-k log-probabilities as token ids (vLLM). 401 / 403 and transport failures raise."""
    ids = _tokenize(client, PromptInput(prompt="The capital of France is"), chat=False)
    if ids is None:
        return "the server has no /tokenize endpoint (vLLM's): the two models cannot be given the same token ids"
    status, obj, words = _post(client, "/completions", {
        "model": client.model, "prompt": ids, "max_tokens": 2, "temperature": 0.0, "logprobs": k,
        "return_tokens_as_token_ids": True})
    if obj is None:
        return (f"the server refused greedy generation with log-probabilities and token ids (HTTP {status}: "
                f"{net.quote(words, n=160)})")
    try:
        parse_generation(obj, "probe")
    except Malformed as e:
        return f"the server returned no usable per-step log-probabilities with token ids ({e.message})"
    return None


# --------------------------------------------------------------------------------------------
# The phase
# --------------------------------------------------------------------------------------------


class DecodePhase:
    """The decode path of one as-served comparison (spec: recipe.DecodeSpec)."""

    name = "decode"
    gates: tuple[str, ...] = ("max_decode_kld",)

    def __init__(self, spec: DecodeSpec, prompts: list[dict[str, Any]] | None = None, workers: int = WORKERS) -> None:  # Any: JSON values
        self.spec = spec
        self.workers = workers  # requests in flight (1: one at a time, the batch-1 noise floor of `verify`)
        given = prompts if prompts is not None else load_prompts(str(spec.prompts))
        self.prompts = [PromptInput.from_dict(p) for p in given[: spec.n_prompts or None]]

    def _chat(self, client: Client, prior: DecodeRaw | None) -> bool:
        """Chat prompts through the chat template: as the first model did; else spec.chat; else where the
        server tokenizes ``messages`` (the model has a chat template)."""
        if prior is not None and prior.chat is not None:
            return prior.chat
        if self.spec.chat is not None:
            return bool(self.spec.chat)
        return _tokenize(client, PromptInput(messages=[{"role": "user", "content": "Hi"}]), chat=True) is not None

    def run(self, served: Served, prior: dict[str, Any] | None, events: Events,  # Any: JSON values
            window: tuple[int, int] | None = None) -> dict[str, Any]:  # Any: JSON values
        """One model's greedy continuations (and, when ``prior`` is given, its teacher-forced distributions on
        the prior's tokens); see the module's docstring."""
        client, k, n_max = served.client, int(self.spec.top_k), int(self.spec.max_tokens)
        prompts = self.prompts[window[0]:window[1]] if window else self.prompts
        why = probe(client, k)
        if why is not None:
            events.log(f"decode: skipped on the {served.label} model: {why}", "warning")
            return DecodeRaw(skipped=why).to_dict()
        before = DecodeRaw.from_dict(prior) if prior is not None else None
        chat = self._chat(client, before)
        where = f"the {served.label} model {client.model!r} at {client.base_url}"

        def tokenize(p: PromptInput) -> list[int]:
            ids = _tokenize(client, p, chat)
            if ids is None:
                raise BackendError(f"{where} would not tokenize decode prompt {p.id!r}"
                                   + (" through its chat template" if chat and p.messages is not None else ""),
                                   hint="set eval.decode.chat: false for a model without a chat template")
            return ids

        prog = lambda what: (lambda d, n=len(prompts): events.progress(f"decode:{served.label}", d, n,  # noqa: E731
                                                                      f"{served.label} decode: {what}"))
        all_ids = pmap(tokenize, prompts, self.workers, what=f"decode prompts ({where})")
        prior_by = {p.id: p for p in before.prompts} if before is not None else {}
        for p, ids in zip(prompts, all_ids):
            ref = prior_by.get(p.id)
            if ref is not None and ref.prompt_ids != ids:
                raise TokenizerMismatch(f"decode prompt {p.id!r}",
                                        hint="base and candidate must share a tokenizer (and chat template)")
        own = pmap(lambda ids: _generate(client, ids, n_max, k), all_ids, self.workers, prog("greedy"),
                    what=f"decode prompts ({where})")
        out = [replace(g, id=p.id, prompt_ids=ids, prefill=[j == 0 for j in range(len(g.tokens))])
               for p, ids, g in zip(prompts, all_ids, own)]
        jobs = [(rec, prior_by[rec.id]) for rec in out if rec.id in prior_by]
        forced = pmap(lambda job: teacher_force(client, job[0], job[1].tokens, k), jobs, self.workers,
                      prog("teacher-forced"), what=f"decode prompts ({where})")
        for (rec, _), f in zip(jobs, forced):
            rec.forced = f
        return DecodeRaw(None, chat, k, n_max, out).to_dict()

    def compare(self, raw_ref: dict[str, Any], raw_cand: dict[str, Any], *, confidence: float,  # Any: JSON values
                first: str) -> DecodeComparison:
        return compare(raw_ref, raw_cand, confidence=confidence, first=first,
                       near_tie_logprob=float(self.spec.near_tie_logprob))


def teacher_force(client: Client, own: DecodePrompt, ref_tokens: list[int], k: int) -> Forced:
    """This model's top-k at every position of ``ref_tokens`` (the first model's greedy continuation of the
    same prompt), on its decode path: its own greedy run up to its first divergence, then a new request from
    prompt + ref[:d+1] after each divergence d (at most MAX_FORCED_REQUESTS), the rest by one echo request.
    ``prefill[j]``: position j's value came from a prefill (a request's first position, or the echo)."""
    n = len(ref_tokens)
    top: list[dict[str, float] | None] = [None] * n
    prefill = [True] * n

    def take(start: int, got: DecodePrompt) -> int:
        for j, (tok, t) in enumerate(zip(got.tokens, got.top)):
            if start + j >= n:
                return n
            top[start + j], prefill[start + j] = t, j == 0
            if tok != ref_tokens[start + j]:
                return start + j + 1
        return start + len(got.tokens)

    pos, requests = take(0, own), 0
    while pos < n and requests < MAX_FORCED_REQUESTS:
        requests += 1
        new = take(pos, _generate(client, own.prompt_ids + ref_tokens[:pos], n - pos, k))
        if new == pos:  # an empty answer: no progress
            break
        pos = new
    echoed = 0
    if pos < n:
        tops = _echo_tops(client, own.prompt_ids + ref_tokens, k)
        base = len(own.prompt_ids)
        for j in range(pos, n):
            top[j], prefill[j] = tops[base + j], True
        echoed = n - pos
    return Forced(top, prefill, requests, echoed)


# --------------------------------------------------------------------------------------------
# The comparison (pure)
# --------------------------------------------------------------------------------------------


def _argmax(top: dict[str, Any]) -> str | None:  # Any: JSON values
    return max(top, key=lambda k: top[k]) if top else None


def top2_gap(top: dict[str, Any]) -> float | None:  # Any: JSON values
    """The gap (nats) between the two largest log-probabilities of a step's top-k; None with fewer than two."""
    vals = sorted(top.values(), reverse=True)
    return vals[0] - vals[1] if len(vals) >= 2 else None


def cluster_mean(sums: list[float], counts: list[int], z: float) -> tuple[float | None, float | None, float | None]:
    """The ratio mean sum(sums) / sum(counts) over clusters (prompts) with a cluster-robust (sandwich) standard
    error: steps of one prompt are correlated (one divergence shifts all later ones), so the prompt, not the
    step, is the independent unit. (mean, lo, hi); None without steps; a single cluster has no spread: its
    interval is the point itself."""
    total = sum(counts)
    if total <= 0:
        return None, None, None
    mean = math.fsum(sums) / total
    g = sum(1 for c in counts if c > 0)
    if g < 2:
        return mean, mean, mean
    resid = math.fsum((s - mean * c) ** 2 for s, c in zip(sums, counts) if c > 0)
    se = math.sqrt(g / (g - 1) * resid) / total
    return mean, mean - z * se, mean + z * se


def median_ci(xs: list[float], z: float) -> tuple[float | None, float | None, float | None]:
    """The median with a distribution-free interval from order statistics (the ranks n/2 ± z·sqrt(n)/2)."""
    if not xs:
        return None, None, None
    s, n = sorted(xs), len(xs)
    med = s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2
    lo = max(1, math.floor(n / 2 - z * math.sqrt(n) / 2))
    hi = min(n, math.ceil(1 + n / 2 + z * math.sqrt(n) / 2))
    return med, s[lo - 1], s[hi - 1]


def _first_and_second(raw_ref: DecodeRaw, raw_cand: DecodeRaw, first: str) -> bool:
    """Whether the candidate ran first: the second model's prompts carry ``forced``; else the label says."""
    forced_ref = any(p.forced is not None for p in raw_ref.prompts)
    forced_cand = any(p.forced is not None for p in raw_cand.prompts)
    if forced_ref != forced_cand:
        return forced_ref
    return first == "candidate"


def compare(raw_ref: dict[str, Any], raw_cand: dict[str, Any], *, confidence: float, first: str,  # Any: JSON values
            near_tie_logprob: float) -> DecodeComparison:
    """The decode block (results.json ``pooled.decode``) of the candidate against the reference, joined by
    prompt id over the candidate's prompts (ids only the reference has are ignored)."""
    z = M.z_for(confidence)
    ref, cand = DecodeRaw.from_dict(raw_ref), DecodeRaw.from_dict(raw_cand)
    skipped = ref.skipped or cand.skipped
    block = DecodeComparison(near_tie_logprob=near_tie_logprob, chat=ref.chat, max_tokens=ref.max_tokens,
                             kld_kind=f"top-{ref.top_k}" if ref.top_k else None, first=first)
    if skipped:
        block.skipped = skipped
        return block
    cand_first = _first_and_second(ref, cand, first)
    ref_by = {p.id: p for p in ref.prompts}
    n_max = ref.max_tokens or 0
    em = 0
    positions: list[float] = []
    kl_s: list[float] = []
    t1_s: list[float] = []
    cnt: list[int] = []
    cov: list[float] = []
    for pc in cand.prompts:
        pr = ref_by.get(pc.id)
        if pr is None:
            continue
        a, b = pr.tokens, pc.tokens
        d = next((j for j, (x, y) in enumerate(zip(a, b)) if x != y), None)
        if d is None and len(a) != len(b):
            d = min(len(a), len(b))
        if d is None:
            em += 1
            positions.append(float(max(n_max, len(a))))
        else:
            positions.append(float(d))
            gap = top2_gap(pr.top[d]) if d < len(pr.top) else None
            tie = gap is not None and gap < near_tie_logprob
            if tie:
                block.near_ties += 1
            else:
                block.divergences += 1
            if len(block.diverged) < SHOWN_DIVERGED:
                block.diverged.append(Diverged(pc.id, d, tie, None if gap is None else round(gap, 6), pr.text, pc.text))
        first_rec, second_rec = (pc, pr) if cand_first else (pr, pc)
        forced = second_rec.forced
        if forced is None:
            continue
        s_kl = s_t1 = 0.0
        c = 0
        for j, t_first in enumerate(first_rec.top):
            t_second = forced.top[j] if j < len(forced.top) else None
            if not t_first or not t_second:
                continue
            if first_rec.prefill[j] or forced.prefill[j]:
                block.prefill_steps += 1
                continue
            t_ref, t_cand = (t_second, t_first) if cand_first else (t_first, t_second)
            kl, mass = M.topk_kld(t_ref, t_cand)
            if not math.isfinite(kl):
                continue
            s_kl += kl
            s_t1 += float(_argmax(t_ref) == _argmax(t_cand))
            cov.append(mass)
            c += 1
        kl_s.append(s_kl)
        t1_s.append(s_t1)
        cnt.append(c)
    n = len(positions)
    block.n_prompts = n
    if n:
        block.exact_match, block.exact_match_ci = em / n, list(M.wilson(em, n, confidence))
        med, lo, hi = median_ci(positions, z)
        block.first_divergence_median = med
        block.first_divergence_ci = [lo, hi] if lo is not None and hi is not None else None  # n > 0: both are
    kl_mean, kl_lo, kl_hi = cluster_mean(kl_s, cnt, z)
    t1, t1_lo, t1_hi = cluster_mean(t1_s, cnt, z)
    if kl_mean is not None and kl_lo is not None and kl_hi is not None and t1_lo is not None and t1_hi is not None:  # all or none
        block.kld, block.kld_ci = kl_mean, [max(0.0, kl_lo), kl_hi]
        block.top1, block.top1_ci = t1, [max(0.0, t1_lo), min(1.0, t1_hi)]
        block.steps = sum(cnt)
        block.covered_mass = math.fsum(cov) / len(cov) if cov else None
    return block
