"""The recipe init writes, but for the serve values the fit searches (``RecipeShape``), and the order of its
fields."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from infertool.backends.base import QuantProposal
from infertool.init.base import API_KEY_ENV, EVAL_MIN_LEN, SUITE, Choice, InitTarget, Traffic, levels
from infertool.init.model import LocatedModel


@dataclass(frozen=True)
class BaseServe:
    """eval.base_serve: the original's own server settings, when it needs more GPUs than the served model (and a
    shorter max_model_len when no degree holds a KV cache of the served one)."""

    tensor_parallel_size: int
    max_model_len: int | None = None

    def model_len(self, default: int) -> int:
        return self.max_model_len if self.max_model_len is not None else default

    def section(self) -> dict[str, int]:
        return {k: v for k, v in asdict(self).items() if v is not None}


@dataclass
class RecipeShape:
    """Everything of the recipe but the serve values the fit searches: ``shape(tp, max_model_len, max_num_seqs,
    kv_space_gib, dtype)`` is the recipe (as data) with those values."""

    name: str
    m: LocatedModel
    target: InitTarget
    q: QuantProposal
    engine: str
    traffic: Traffic
    prompt_len: int
    output_len: int
    ctx: int
    prompt_source: str = "builtin"  # a .jsonl traffic file (--traffic) or the built-in corpus
    base: BaseServe | None = None  # eval.base_serve: the original's own serve settings (set once its fit is known)

    @property
    def per_request(self) -> int:
        return self.prompt_len + self.output_len

    @property
    def endpoint(self) -> str:
        return "chat" if self.m.info.has_chat_template else "completions"

    def __call__(self, tp: int, max_len: int, seqs: int, space: int | None, dtype: str = "auto",
                 base: BaseServe | None = None) -> dict:
        gpu = self.target.kind == "gpu"
        serve: dict[str, object] = {"host": "127.0.0.1", "port": 8000, "dtype": dtype, "max_model_len": max_len,
                                 "max_num_seqs": seqs}
        if gpu:
            serve.update({"tensor_parallel_size": tp, "gpu_memory_utilization": 0.9, "enforce_eager": False})
        else:
            serve.update({"enforce_eager": True, "cpu": {"kv_cache_space_gib": space}})
        serve["enable_prefix_caching"] = True
        serve["api_key_env"] = API_KEY_ENV
        r: dict[str, object] = {"name": self.name, "description": "",
                             "model": {"source": self.m.source, "dtype": self.m.dtype}}
        if gpu:
            r["target"] = {"gpu": self.target.device.key}
        r["quantize"] = self.q.section()
        ev: dict[str, object] = {"suite": SUITE, "engine": self.engine, "accept": {"preset": "standard"}}
        r["eval"] = ev
        base = base if base is not None else self.base
        if max_len < EVAL_MIN_LEN or (base and base.model_len(EVAL_MIN_LEN) < EVAL_MIN_LEN):
            # the eval's windows must fit the model as served
            ev["seq_len"] = max(8, min(max_len, base.model_len(max_len) if base else max_len) - 1)
        if base:
            ev["base_serve"] = base.section()
        r["serve"] = serve
        t = self.traffic
        r["bench"] = {
            "endpoint": self.endpoint, "concurrency": levels(seqs), "requests": t.requests,
            "prompt": {"source": self.prompt_source, "len": self.prompt_len}, "output_len": self.output_len,
            "slo": {"ttft_ms": t.ttft_ms, "tpot_ms": t.tpot_ms},
            "cost_per_hour": round(_gpu_price(self.target) * tp if gpu else 0.5, 2),
        }
        return r


def _gpu_price(target: InitTarget) -> float:
    """$ per GPU-hour for the bench's cost: the GPU table's typical price (an assumption, said), else 1.0 (a
    placeholder)."""
    price = getattr(target.gpu, "price_per_hour", None)
    return float(price) if isinstance(price, int | float) and price > 0 else 1.0


def in_recipe_order(recipe: dict, decisions: list[Choice]) -> list[Choice]:
    order: dict[str, int] = {}

    def walk(d: dict, prefix: str) -> None:
        for k, v in d.items():
            order.setdefault(prefix + k, len(order))
            if isinstance(v, dict):
                walk(v, prefix + k + ".")

    walk(recipe, "")
    return sorted(decisions, key=lambda d: order.get(d.field, len(order)))
