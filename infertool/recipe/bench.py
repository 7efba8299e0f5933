"""The recipe's bench section: the load generator's traffic, levels, repeats, classes and SLO."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, Field, field_validator, model_validator

from infertool.recipe.serve import SpeculativeSpec
from infertool.schema import (
    MAX_LIST, MAX_REQUESTS, STRICT, ClassName, Fraction, Millis, Name, NotBool, Rate, Requests, Seconds, Seed, Seqs,
    Share, Text, Tokens, field_error,
)


class BurstSpec(BaseModel):
    model_config = STRICT

    size: Annotated[int, NotBool, Field(ge=1, le=MAX_REQUESTS)]
    interval_s: Seconds


class MultiTurnSpec(BaseModel):
    """Each conversation a session: its user turns in order, the model's own replies appended to the history,
    a think time between turns."""

    model_config = STRICT

    max_turns: Annotated[int, NotBool, Field(ge=1, le=1000)] = 4
    think_time_s: Annotated[float, NotBool, Field(ge=0, le=3600)] = 0.0
    think_time_spread: Fraction = 0.0  # uniform within +-spread x think_time_s


class SharedPrefixSpec(BaseModel):
    """N system prompts x M questions: every request is one of N shared prefixes plus its own question."""

    model_config = STRICT

    prefixes: Annotated[int, NotBool, Field(ge=1, le=100_000)] = 4
    prefix_len: Tokens = 512
    questions: Annotated[int, NotBool, Field(ge=1, le=1_000_000)] = 16  # per prefix
    question_len: Tokens = 64


class RateSweepSpec(BaseModel):
    """An open-loop rate sweep that stops by itself past saturation: rates grow from ``start`` by ``factor`` until
    the achieved throughput stops following the offered rate (or goodput falls below the target), then the knee
    is bracketed and refined."""

    model_config = STRICT

    start: Rate = 0.5
    factor: Annotated[float, NotBool, Field(ge=1.05, le=10)] = 2.0
    max_levels: Annotated[int, NotBool, Field(ge=2, le=64)] = 10
    goodput_target: Share = 0.9


class RepeatSpec(BaseModel):
    """Repeat a bench level (and each tune capacity probe near the SLO edge) until its figure's interval is within
    ``rel_width`` of the figure, or ``max_runs`` runs; ``min_runs`` is at most ``max_runs``."""

    model_config = STRICT

    max_runs: Annotated[int, NotBool, Field(ge=1, le=100)] = 1
    min_runs: Annotated[int, NotBool, Field(ge=1, le=100)] = 1
    rel_width: Annotated[float, NotBool, Field(ge=0.001, le=10)] = 0.10  # the interval's half-width relative to the figure
    confidence: Annotated[float, NotBool, Field(ge=0.5, le=0.999)] = 0.95

    @model_validator(mode="after")
    def _check_runs(self) -> RepeatSpec:
        if self.min_runs > self.max_runs:
            raise field_error("min_runs", f"min_runs ({self.min_runs}) must not exceed max_runs ({self.max_runs}): "
                               "a level runs at most max_runs times; raise max_runs too")
        return self


class PromptSpec(BaseModel):
    model_config = STRICT

    source: Text = "builtin"  # builtin | synthetic | sharegpt | shared_prefix | PATH.jsonl (prompts or conversations)
    len: Tokens = 256
    field: Name = "prompt"
    max_len: Tokens | None = None  # sharegpt/conversations: drop prompts longer than this (vLLM bench: 1024)
    tokenizer: Text | None = None  # token counts (sharegpt): a tokenizer.json or model folder; default the served model's
    multi_turn: MultiTurnSpec | None = None  # replay conversations as sessions (sharegpt or a conversations JSONL)
    shared_prefix: SharedPrefixSpec | None = None  # with source: shared_prefix

    @field_validator("source")
    @classmethod
    def _check_source(cls, value: str) -> str:
        value = value.strip()
        if value in ("builtin", "synthetic", "sharegpt", "shared_prefix") or value.lower().endswith(".jsonl"):
            return value
        raise ValueError(
            "prompt source must be 'builtin', 'synthetic', 'sharegpt', 'shared_prefix' or a path to a .jsonl file; "
            f"got {value!r}"
        )


class ClassesSpec(BaseModel):
    """Traffic classes (infertool.bench.classes). A request keeps the `class` its trace or prompt file gives it;
    the others get the first that applies: multi-turn (a conversation of more than one user turn), shared-prefix
    (its prompt's first prefix_chars characters or more start another request's prompt too), long (an input of
    at least long_chars characters), short. Characters, not tokens: the classes do not change with the server.
    replay sends that class alone (bench --class); unset, the mix."""

    model_config = STRICT

    prefix_chars: Annotated[int, NotBool, Field(ge=16, le=10_000_000)] = 1024
    long_chars: Annotated[int, NotBool, Field(ge=1, le=10_000_000)] = 4096
    replay: ClassName | None = None


class PerClassSpec(BaseModel):
    """Speculative decoding and prefix caching measured per traffic class (infertool.bench.perclass): one server
    per arm (speculation off; each speculative variant; prefix caching off; for each max_num_batched_tokens),
    each class of the traffic replayed alone on each at the bench's load levels. speculative: the variants tried
    (default: the recipe's serve.speculative, else n-gram k=3); [] tries none. A class with fewer than
    min_requests requests is not measured; the report says how many it needs. lossless: each speculative variant
    checked against the baseline on each measured class's own prompts (infertool.evaluate.lossless; the decode
    settings of eval.decode); one that changes answers beyond the noise floor loses at every load."""

    model_config = STRICT

    speculative: Annotated[list[SpeculativeSpec], Field(max_length=16)] | None = None
    prefix_caching: bool = True
    lossless: bool = True
    # each budget tried with prefix caching on and off (None: the recipe's serve.max_num_batched_tokens)
    max_num_batched_tokens: Annotated[list[Tokens], Field(min_length=1, max_length=8)] | None = None
    min_requests: Annotated[int, NotBool, Field(ge=2, le=100_000)] = 10


BASE_ADAPTER = "base"  # a mix's name for the base model (the served model itself, no adapter)


class AdapterMixSpec(BaseModel):
    """Traffic that mixes LoRA adapters (infertool.bench.adapters): each request's "model" is one name of ``mix``
    (``base``, or the served model's name: the base model; else an adapter of serve.lora), drawn in proportion to
    its share (the shares are normalised; each must be positive). ``order``: random (a seeded shuffle), round_robin
    (the names interleaved as evenly as the shares allow) or grouped (runs of ``run_length`` requests of one name):
    grouped against random shows what switching adapters costs. The names are checked against serve.lora when the
    recipe loads (``mix_problems``)."""

    model_config = STRICT

    mix: Annotated[dict[Name, Annotated[float, NotBool, Field(allow_inf_nan=False)]], Field(min_length=1, max_length=64)]
    order: Literal["random", "round_robin", "grouped"] = "random"
    run_length: Annotated[int, NotBool, Field(ge=1, le=MAX_REQUESTS)] = 8  # grouped: requests in a run of one name

    def shares(self) -> dict[str, float]:
        """The mix's shares normalised to sum to 1 (in the mix's order); {} when they cannot be (not positive)."""
        total = sum(self.mix.values())
        if total <= 0 or any(v <= 0 for v in self.mix.values()):
            return {}
        return {name: v / total for name, v in self.mix.items()}


def mix_problems(spec: AdapterMixSpec, adapters: list[str], served_name: str | None) -> list[str]:
    """Every problem of a mix, given serve.lora's adapter names and serve.served_model_name: a share that is not
    positive, a name that is neither the base (``base`` or ``served_name``) nor an adapter of serve.lora (listed
    with the known names), an adapter called ``base`` (that name is the base model's)."""
    problems = [f"{name}: share {v:g} is not positive (a name in the mix is sent a positive share of the requests; "
                "remove it to send it none)" for name, v in spec.mix.items() if v <= 0]
    known = {BASE_ADAPTER, *([served_name] if served_name else []), *adapters}
    unknown = [name for name in spec.mix if name not in known]
    if unknown:
        listed = ", ".join([BASE_ADAPTER + " (the base model)"] + [a for a in adapters if a != BASE_ADAPTER])
        problems.append(f"{', '.join(repr(n) for n in unknown)}: not served: the known names are {listed}"
                        + ("" if adapters else " (serve.lora lists no adapters)"))
    if BASE_ADAPTER in adapters:
        problems.append(f"serve.lora names an adapter {BASE_ADAPTER!r}: in bench.adapters.mix that name is the base "
                        "model's; rename the adapter")
    return problems


class SLOSpec(BaseModel):
    model_config = STRICT

    ttft_ms: Millis | None = None
    tpot_ms: Millis | None = None
    e2e_ms: Millis | None = None


class BenchSection(BaseModel):
    """The load generator: closed-loop concurrency sweeps, open-loop rates, bursts. Each concurrency and rate is
    listed once; rate and rate_sweep exclude each other; burstiness needs arrival: gamma."""

    model_config = STRICT

    endpoint: Literal["completions", "chat"] = "completions"
    concurrency: Annotated[list[Seqs], Field(min_length=1, max_length=MAX_LIST)] = [1, 8, 32]
    rate: Annotated[list[Rate], Field(min_length=1, max_length=MAX_LIST)] | None = None  # requests per second
    arrival: Literal["poisson", "gamma"] = "poisson"  # open-loop rates: exponential or gamma gaps
    burstiness: Annotated[float, NotBool, Field(ge=0.01, le=100)] = 1.0  # gamma shape (vLLM bench's --burstiness): < 1 burstier, 1 = Poisson
    rate_sweep: RateSweepSpec | None = None  # find the knee instead of listing rates
    trace: Text | None = None  # a timestamped JSONL trace to replay (arrival times and lengths)
    trace_speedup: Annotated[float, NotBool, Field(ge=0.001, le=1000)] = 1.0
    repeats: RepeatSpec = Field(default_factory=RepeatSpec)
    burst: BurstSpec | None = None
    requests: Requests = 64
    max_duration_s: Seconds = 600
    prompt: PromptSpec = Field(default_factory=PromptSpec)
    output_len: Tokens = 128
    shared_prefix_ratio: Fraction = 0.0
    slo: SLOSpec | None = None
    classes: ClassesSpec = Field(default_factory=ClassesSpec)
    per_class: PerClassSpec | None = None  # speculation and prefix caching measured per traffic class
    adapters: AdapterMixSpec | None = None  # traffic that mixes LoRA adapters (serve.lora): per-adapter figures
    cost_per_hour: Annotated[float, NotBool, Field(ge=0, le=1e6)] | None = None
    seed: Seed = 0
    experiments: list[Literal["batching", "prefix_caching", "speculative"]] = []
    # output lengths uniform within +-spread x output_len (0: all equal); static batching shows its
    # cost when lengths differ
    output_len_spread: Fraction = 0.0
    # vLLM's ignore_eos: every request generates exactly its output length (comparable runs); set
    # false for servers that reject unknown request fields
    ignore_eos: bool = True
    scrape_interval_s: Annotated[float, NotBool, Field(ge=0.01, le=3600)] = 0.5  # how often the server's /metrics is sampled
    # load-generator processes: auto (by concurrency and cores; infertool.bench.loadgen) or a count
    client_processes: Literal["auto"] | Annotated[int, NotBool, Field(ge=1, le=256)] = "auto"

    @model_validator(mode="after")
    def _check_traffic(self) -> BenchSection:
        """Fields that contradict each other, or that nothing reads, are refused rather than silently dropped."""
        if self.rate is not None and self.rate_sweep is not None:
            raise field_error("rate_sweep", "rate and rate_sweep exclude each other: rate_sweep finds its own rates "
                               "(the listed rates would never run); keep one of them")
        lists: dict[str, list[float]] = {"concurrency": list(self.concurrency), "rate": list(self.rate or [])}
        for name, levels in lists.items():
            repeated = sorted({v for v in levels if levels.count(v) > 1})
            if repeated:
                raise field_error(name, f"{', '.join(f'{v:g}' for v in repeated)} listed more than once: each "
                                   "level runs once (bench.repeats repeats a level); list each value once")
        if self.burstiness != 1.0 and self.arrival != "gamma":
            raise field_error("burstiness", f"burstiness {self.burstiness:g} shapes gamma arrivals only, and arrival "
                               f"is {self.arrival}: set arrival: gamma, or remove burstiness")
        return self

def bench_request_tokens(bench: BenchSection) -> int:
    """The most tokens one bench request asks of the server: its prompt (builtin or synthetic text of prompt.len
    tokens; a .jsonl file's prompts are what they are) and its longest output (output_len + spread)."""
    longest_output = max(1, round(bench.output_len * (1 + bench.output_len_spread)))
    return longest_output + (bench.prompt.len if bench.prompt.source in ("builtin", "synthetic") else 0)

