"""The ``hf`` engine: both models in-process with transformers (in the ``quant`` environment), full-
vocabulary logits, so KL divergence is exact. Runs as the stage ``eval.hf``; imports torch only here.

It returns per-token and per-item raw numbers (JSON); every statistic is computed by
infertool.evaluate.metrics in the parent, the same code for every engine.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from infertool.errors import RuntimeFailure, UsageError
from infertool.evaluate.paired import (
    ChoicePair, GeneratePair, HfJob, Paired, PairedChoices, PairedOutputs, PairedWindow, PerplexityPair, ScoreTask,
    TaskTiming, cut_at_stop, to_json,
)
from infertool.perf.host import usable_cores

if TYPE_CHECKING:
    from infertool.tasks import Events


def _load_model(path: str, events: Events, trust: bool = False) -> tuple[Any, Any]:  # Any: transformers' model, tokenizer
    """``trust``: model.trust_remote_code, passed to every loader (the only way remote code runs)."""
    import torch
    from transformers import AutoModelForCausalLM

    from infertool.models.info import load_config

    cfg_path = Path(path) / "config.json"
    if not cfg_path.is_file():
        raise UsageError(f"not a Hugging Face model directory (no config.json): {path}",
                         hint="give a local model directory, e.g. the output of `infertool quantize` or `infertool model import`")
    method = load_config(path).quant_method
    if method in ("gptq", "awq"):
        try:
            from gptqmodel import GPTQModel

            wrapped = GPTQModel.load(path, device="cpu", trust_remote_code=trust)
            model = getattr(wrapped, "model", wrapped)
            loader = f"gptqmodel ({method})"
        except Exception as e:  # noqa: BLE001 - fall back to transformers' own loader, then give up clearly
            events.log(f"GPTQModel could not load {path} ({type(e).__name__}: {e}); trying transformers", "warning")
            try:
                model = AutoModelForCausalLM.from_pretrained(path, trust_remote_code=trust)
                loader = f"transformers ({method})"
            except Exception as e2:  # noqa: BLE001
                raise RuntimeFailure(f"cannot load the {method} checkpoint {path}: {type(e2).__name__}: {e2}",
                                     hint="check the checkpoint with `infertool model info`; the quant environment needs gptqmodel") from None
    else:
        # float32 compute: base weights are upcast exactly, and log-softmax over the vocabulary stays precise.
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, trust_remote_code=trust)
        loader = "transformers (float32)"
    model.eval()
    dtype = str(next(model.parameters()).dtype).removeprefix("torch.")
    return model, {"path": path, "loader": loader, "dtype": dtype, "quant_method": method or None}


def _log_softmax(model: Any, ids: Any, mask: Any = None) -> Any:  # Any: torch modules and tensors
    import torch

    with torch.inference_mode():
        out = model(input_ids=ids, attention_mask=mask)
    return torch.log_softmax(out.logits.float(), dim=-1)


def _perplexity(task: ScoreTask, tok: Any, mb: Any, mc: Any, batch: int, events: Events,  # Any: JSON values
                timing: TaskTiming) -> PerplexityPair:
    import torch

    ids = tok(task.text, add_special_tokens=False)["input_ids"]
    L = task.seq_len
    n = min(len(ids) // L, task.max_windows or len(ids))
    if n < 1:
        raise UsageError(f"task {task.name!r}: the text has {len(ids)} tokens, fewer than one window of {L}",
                         hint="lower eval.seq_len or give more text")
    items = []
    batch = max(1, min(batch, 4))  # full-vocabulary log-probs are large: [batch, seq_len, vocab] float32
    for start in range(0, n, batch):
        rows = [ids[(start + j) * L:(start + j + 1) * L] for j in range(min(batch, n - start))]
        x = torch.tensor(rows, dtype=torch.long)
        t0 = time.monotonic()
        lpb = _log_softmax(mb, x)
        t1 = time.monotonic()
        lpc = _log_softmax(mc, x)
        t2 = time.monotonic()
        timing.base_s += t1 - t0
        timing.cand_s += t2 - t1
        timing.tokens += x.numel()
        for j, row in enumerate(rows):
            b = lpb[j, :-1]
            c = lpc[j, :-1]
            tgt = x[j, 1:].unsqueeze(-1)
            kld = (b.exp() * (b - c)).sum(-1).clamp_min(0.0)
            items.append(PairedWindow(f"w{start + j:04d}", len(tok.decode(row[1:]).encode("utf-8")),
                                b.gather(-1, tgt).squeeze(-1).tolist(), c.gather(-1, tgt).squeeze(-1).tolist(),
                                kld.tolist(), (b.argmax(-1) == c.argmax(-1)).int().tolist()))
        del lpb, lpc
        events.progress(task.name, len(items), n, f"{task.name}: windows")
    return PerplexityPair(items, seq_len=L, corpus_tokens=len(ids))


def _encode_pair(tok: Any, context: str, continuation: str) -> tuple[list[int], list[int]]:  # Any: JSON values
    """lm-eval's split: trailing spaces of the context move to the continuation; both encoded separately."""
    n_spaces = len(context) - len(context.rstrip())
    if n_spaces:
        continuation = context[-n_spaces:] + continuation
        context = context[:-n_spaces]
    ctx = tok(context, add_special_tokens=False)["input_ids"]
    cont = tok(continuation, add_special_tokens=False)["input_ids"]
    return ctx, cont


def _multiple_choice(task: ScoreTask, tok: Any, mb: Any, mc: Any, batch: int, events: Events,  # Any: JSON values
                     timing: TaskTiming) -> ChoicePair:
    import torch

    reqs = []  # (item index, choice index, ids, n_cont)
    for i, it in enumerate(task.items):
        for k, cont in enumerate(it.continuations):
            ctx_ids, cont_ids = _encode_pair(tok, it.context, cont)
            reqs.append((i, k, ctx_ids + cont_ids, len(cont_ids)))
    lls: list[dict[tuple[int, int], float]] = [{}, {}]  # base, candidate
    greedy: list[dict[tuple[int, int], bool]] = [{}, {}]
    pad = tok.pad_token_id if tok.pad_token_id is not None else 0
    order = sorted(range(len(reqs)), key=lambda r: -len(reqs[r][2]))  # similar lengths together
    done = 0
    for s in range(0, len(order), batch):
        chunk = [reqs[r] for r in order[s:s + batch]]
        T = max(len(r[2]) for r in chunk)
        x = torch.tensor([r[2] + [pad] * (T - len(r[2])) for r in chunk], dtype=torch.long)
        mask = torch.tensor([[1] * len(r[2]) + [0] * (T - len(r[2])) for r in chunk], dtype=torch.long)
        for m, model in enumerate((mb, mc)):
            t0 = time.monotonic()
            lp = _log_softmax(model, x, mask)
            _add_seconds(timing, m, time.monotonic() - t0)
            for j, (i, k, seq, nc) in enumerate(chunk):
                pos = torch.arange(len(seq) - nc - 1, len(seq) - 1)
                tgt = torch.tensor(seq[len(seq) - nc:], dtype=torch.long)
                sel = lp[j, pos]
                lls[m][(i, k)] = float(sel.gather(-1, tgt.unsqueeze(-1)).sum())
                greedy[m][(i, k)] = bool((sel.argmax(-1) == tgt).all())
        timing.tokens += int(mask.sum())
        done += len(chunk)
        events.progress(task.name, done, len(reqs), f"{task.name}: choices")
    items = []
    for i, it in enumerate(task.items):
        ks = range(len(it.continuations))
        ll = [[lls[m][(i, k)] for k in ks] for m in (0, 1)]
        gr = [[greedy[m][(i, k)] for k in ks] for m in (0, 1)]
        n_bytes = [len(c.encode("utf-8")) for c in it.continuations]
        items.append(PairedChoices(it.id, ll[0], ll[1], n_bytes, gr[0], gr[1]))
    return ChoicePair(items)


def _generate(task: ScoreTask, tok: Any, mb: Any, mc: Any, batch: int, events: Events,  # Any: JSON values
              timing: TaskTiming) -> GeneratePair:
    import torch

    prompts = []
    for it in task.items:
        p = it.prompt
        if task.chat:
            if not getattr(tok, "chat_template", None):
                raise UsageError(f"task {task.name!r} asks for the chat template, but the model has none",
                                 hint="set chat: false for this task")
            msgs = it.messages or [{"role": "user", "content": p}]  # a suite's chat item: its conversation
            p = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
        prompts.append(p)
    stop = task.stop
    outs: list[list[str]] = [[""] * len(prompts), [""] * len(prompts)]  # base, candidate
    old_side = tok.padding_side
    tok.padding_side = "left"
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    try:
        for s in range(0, len(prompts), batch):
            enc = tok(prompts[s:s + batch], return_tensors="pt", padding=True, add_special_tokens=not task.chat)
            for m, model in enumerate((mb, mc)):
                t0 = time.monotonic()
                with torch.inference_mode():
                    gen = model.generate(**enc, max_new_tokens=task.max_tokens, do_sample=False,
                                         stop_strings=stop or None, tokenizer=tok, pad_token_id=tok.pad_token_id)
                _add_seconds(timing, m, time.monotonic() - t0)
                new = gen[:, enc["input_ids"].shape[1]:]
                timing.gen_tokens = (timing.gen_tokens or 0) + int((new != tok.pad_token_id).sum())
                for j, row in enumerate(new):
                    outs[m][s + j] = cut_at_stop(tok.decode(row, skip_special_tokens=True), stop)
            events.progress(task.name, min(s + batch, len(prompts)), len(prompts), f"{task.name}: generate")
    finally:
        tok.padding_side = old_side
    return GeneratePair([PairedOutputs(it.id, b, c) for it, b, c in zip(task.items, *outs)])


def _add_seconds(timing: TaskTiming, model: int, seconds: float) -> None:
    if model == 0:
        timing.base_s += seconds
    else:
        timing.cand_s += seconds


def compare_task(spec: dict[str, Any], events: Events) -> dict[str, Any]:  # Any: JSON values
    """Stage ``eval.hf``: score every task of the suite with base and candidate on the same tokens (a json /
    tool_call task is refused before anything loads: it is scored as served)."""
    from infertool.data.formats import served_only

    job = HfJob.from_dict(spec)
    served_only([(t.name, t.type) for t in job.tasks], "hf")
    import torch
    import transformers
    from transformers import AutoTokenizer

    torch.set_num_threads(max(1, job.threads or usable_cores()))
    events.log(f"loading base {job.base}")
    trust = job.trust_remote_code
    mb, info_b = _load_model(job.base, events, trust)
    events.log(f"loading candidate {job.candidate}")
    mc, info_c = _load_model(job.candidate, events, trust)
    tok = AutoTokenizer.from_pretrained(job.base, trust_remote_code=trust)
    vb, vc = mb.get_output_embeddings().weight.shape[0], mc.get_output_embeddings().weight.shape[0]
    if vb != vc:
        raise UsageError(f"base and candidate have different vocabularies ({vb} vs {vc} tokens): they cannot be compared token by token",
                         hint="the candidate must be a quantized copy of the base model")
    batch = job.batch_size
    runners: dict[str, Callable[..., Paired]] = {"perplexity": _perplexity, "multiple_choice": _multiple_choice, "generate": _generate}
    tasks = {}
    timings = {}
    for task in job.tasks:
        timing = TaskTiming(gen_tokens=0)
        t0 = time.monotonic()
        tasks[task.name] = to_json(runners[task.type](task, tok, mb, mc, batch, events, timing))
        timing.wall_s = time.monotonic() - t0
        timings[task.name] = timing.to_dict()
    versions = {"torch": torch.__version__, "transformers": transformers.__version__}
    try:
        import gptqmodel

        versions["gptqmodel"] = gptqmodel.__version__
    except Exception:  # noqa: BLE001
        pass
    return {"engine": "hf", "tasks": tasks, "timing": timings, "base": info_b, "candidate": info_c,
            "versions": versions}
