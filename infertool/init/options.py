"""What the command line asks of init besides the model and the target: --method, --slo, --traffic, --set."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from infertool.bench.prompts import DEFAULT_CHARS_PER_TOKEN
from infertool.errors import UsageError
from infertool.init.base import one_line


PIN_INTS = ("serve.tensor_parallel_size", "serve.max_model_len", "serve.max_num_seqs", "bench.output_len",
            "bench.prompt.len", "eval.base_serve.tensor_parallel_size")
PIN_FLOATS = ("bench.slo.ttft_ms", "bench.slo.tpot_ms")


@dataclass(frozen=True)
class Pins:
    """The --set values the fit decides from (``InitOptions.pins``): PIN_INTS as whole numbers, PIN_FLOATS as
    milliseconds (None: not set); ``keys``: the --set keys pinned, and "quantize" when some quantize.* key is set."""

    tensor_parallel_size: int | None = None
    max_model_len: int | None = None
    max_num_seqs: int | None = None
    output_len: int | None = None
    prompt_len: int | None = None
    base_tensor_parallel_size: int | None = None  # eval.base_serve's
    ttft_ms: float | None = None
    tpot_ms: float | None = None
    keys: frozenset[str] = frozenset()

    @property
    def quantize(self) -> bool:
        return "quantize" in self.keys

    @property
    def slo(self) -> bool:
        return self.ttft_ms is not None or self.tpot_ms is not None


@dataclass
class InitOptions:
    """What the command line asks of init besides the model and the target: ``method`` (a key of METHODS),
    ``slo`` ({ttft_ms, tpot_ms}), ``traffic`` (a .jsonl prompt file, the bench's format), ``sets`` (--set
    KEY=VALUE, applied to the recipe; the values the fit decides from are pinned there)."""

    method: str | None = None
    slo: dict | None = None
    traffic: str | None = None
    sets: list[str] = field(default_factory=list)

    def pins(self) -> Pins:
        """The --set values the fit decides from (tensor parallelism, context, batch, lengths, SLO), as numbers;
        a value of another type is left to the recipe's validation (which refuses it with its field path)."""
        from infertool.recipe import parse_overrides

        pairs = parse_overrides(list(self.sets))
        ints = {k: v for k, v in pairs if k in PIN_INTS and isinstance(v, int) and not isinstance(v, bool) and v > 0}
        ms = {k: float(v) for k, v in pairs
              if k in PIN_FLOATS and isinstance(v, int | float) and not isinstance(v, bool) and v > 0}
        quantize = {"quantize"} if any(k.startswith("quantize.") for k, _ in pairs) else set()
        return Pins(ints.get("serve.tensor_parallel_size"), ints.get("serve.max_model_len"),
                    ints.get("serve.max_num_seqs"), ints.get("bench.output_len"), ints.get("bench.prompt.len"),
                    ints.get("eval.base_serve.tensor_parallel_size"), ms.get("bench.slo.ttft_ms"),
                    ms.get("bench.slo.tpot_ms"), frozenset({*ints, *ms, *quantize}))


def parse_slo(text: str) -> dict:
    """``--slo ttft_ms=500,tpot_ms=50`` (either or both) as bench.slo validates it; UsageError otherwise."""
    from pydantic import ValidationError

    from infertool.recipe import SLOSpec

    hint = "--slo ttft_ms=500,tpot_ms=50 (milliseconds; either or both)"
    out: dict[str, float] = {}
    for part in (p.strip() for p in str(text).split(",")):
        key, eq, raw = part.partition("=")
        key = key.strip()
        if not eq or key not in ("ttft_ms", "tpot_ms"):
            raise UsageError(f"--slo: {one_line(part)[:60]!r} is not ttft_ms=N or tpot_ms=N", hint=hint)
        if key in out:
            raise UsageError(f"--slo: {key} is given twice ({key}={out[key]:g} and {one_line(part)[:60]})",
                             hint=hint + "; give each once")
        try:
            out[key] = float(raw)
        except ValueError:
            raise UsageError(f"--slo: {key}={one_line(raw)[:40]!r} is not a number", hint=hint) from None
    try:
        SLOSpec.model_validate(out)
    except ValidationError as e:
        err = e.errors(include_url=False)[0]
        raise UsageError(f"--slo: {'.'.join(map(str, err['loc']))}: {err['msg']}", hint=hint) from None
    return out


def read_traffic(path: str) -> tuple[str, int, int, int]:
    """A bench prompt file (.jsonl: one prompt per line, a string or an object with a "prompt" field, as
    bench.prompt.source reads it, through ``infertool.inputs``): (its absolute path, mean and longest prompt in
    tokens (estimated), count)."""
    from infertool.bench.prompts import read_jsonl

    p = Path(path).expanduser()
    if p.suffix.lower() != ".jsonl":
        raise UsageError(f"--traffic {path}: not a .jsonl file", hint="--traffic takes the bench's prompt file: one "
                         "JSON string, or object with a \"prompt\" field, per line")
    texts = read_jsonl(p, what="--traffic")
    tokens = [max(1, math.ceil(len(t) / DEFAULT_CHARS_PER_TOKEN)) for t in texts]
    return str(p.absolute()), math.ceil(sum(tokens) / len(tokens)), max(tokens), len(tokens)
