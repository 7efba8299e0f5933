"""The search space of `infertool tune`: candidates x serving grid -> trials, each a complete recipe that every
other command would read the same way (the recipe's one resolution), and the roofline's prediction of each.

Pure apart from ``predict`` (which reads model facts the way `infertool plan` does, no weights).
"""

from __future__ import annotations

import itertools
from dataclasses import asdict, dataclass, field

from infertool.data.fingerprint import digest
from infertool.errors import RecipeError, UsageError
from infertool.tune.records import PredictionRecord


@dataclass(frozen=True)
class Candidate:
    index: int
    spec: dict | None  # the merged quantize section; None: the original model
    label: str
    key: str

    @property
    def original(self) -> bool:
        return self.spec is None

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class Trial:
    id: str
    candidate: Candidate
    serve: dict  # the grid point: serve field -> value
    recipe: object  # the trial's full recipe (quantize = the candidate, serve = the grid point, no tune)
    prediction: PredictionRecord = field(default_factory=PredictionRecord)

    @property
    def label(self) -> str:
        point = ", ".join(f"{k}={v}" for k, v in self.serve.items())
        return f"{self.candidate.label}" + (f" | {point}" if point else "")

    def to_dict(self) -> dict:
        return {"id": self.id, "label": self.label, "candidate": self.candidate.to_dict(), "serve": dict(self.serve),
                "prediction": self.prediction.to_dict()}


def candidates(recipe) -> list[Candidate]:
    """The recipe's candidates, each merged over the recipe's quantize section (validated by the recipe)."""
    from infertool.recipe import QuantizeSection
    from pydantic import TypeAdapter

    base = recipe.quantize.model_dump(mode="json", exclude={"output"}) if recipe.quantize is not None else {}
    out: list[Candidate] = []
    seen: dict[str, int] = {}
    for i, cand in enumerate(recipe.tune.candidates):
        if cand == "none":
            spec, label = None, "original"
        else:
            merged = {**(base if cand.get("method", base.get("method")) == base.get("method") else {}), **cand}
            merged.pop("output", None)
            q = TypeAdapter(QuantizeSection).validate_python(merged)
            spec = q.model_dump(mode="json", exclude={"output"})
            label = q.label()
        key = digest(spec)
        if key in seen:
            raise UsageError(f"tune.candidates[{i}] is the same quantization as tune.candidates[{seen[key]}]",
                             hint="remove the duplicate candidate")
        seen[key] = i
        out.append(Candidate(i, spec, label, key))
    return out


def grid_points(recipe) -> list[dict]:
    """Every combination of the serving grid's values (fields in the recipe's order); [{}] without a grid."""
    grid = {k: v for k, v in recipe.tune.serve_grid.model_dump().items() if v is not None}
    if not grid:
        return [{}]
    keys = list(grid)
    return [dict(zip(keys, values)) for values in itertools.product(*(grid[k] for k in keys))]


def trial_recipe(recipe, candidate: Candidate, point: dict):
    """The recipe of one trial: the candidate as its quantize section, the grid point over its serve section,
    serve.model cleared (the trial serves its candidate), no tune section."""
    from infertool.recipe import recipe_to_dict, validate_recipe_data

    data = recipe_to_dict(recipe)
    data.pop("tune", None)
    data["quantize"] = dict(candidate.spec) if candidate.spec is not None else None
    serve = dict(data.get("serve") or {})
    serve.update(point)
    serve["model"] = None
    data["serve"] = serve
    try:
        return validate_recipe_data({k: v for k, v in data.items() if v is not None or k in ("serve",)},
                                    source=f"tune trial ({candidate.label}, {point})")
    except RecipeError as e:
        raise UsageError(f"the trial {candidate.label} with {point} is not a valid recipe: "
                         + "; ".join(f"{i.path}: {i.message}" for i in e.issues)) from None


def trials(recipe) -> list[Trial]:
    out = []
    for cand in candidates(recipe):
        for point in grid_points(recipe):
            tid = digest({"candidate": cand.key, "serve": point})[:12]
            out.append(Trial(tid, cand, point, trial_recipe(recipe, cand, point)))
    return out


def predict(trial: Trial, concurrency: int | None = None) -> PredictionRecord:
    """What `infertool plan` says of the trial before anything is measured: does it fit (memory, KV capacity
    for the traffic, position limits), and the roofline bound for decode tokens/s at ``concurrency``
    (default: the largest batch its KV cache allows, capped by max_num_seqs) and the $ per 1M output tokens
    that bound would cost."""
    from infertool import plan as planning
    from infertool.resolve import resolve

    r = trial.recipe
    res = resolve(r)
    bench = r.bench
    per_request = bench.prompt.len + bench.output_len
    p = planning.plan(res, planning.PlanOptions(context=bench.prompt.len + bench.output_len // 2,
                                                batches=[concurrency] if concurrency else None))
    reasons = list(p.reasons)
    if p.capacity["kv_tokens"] and p.capacity["kv_tokens"] < per_request:
        reasons.append(f"the KV cache holds {p.capacity['kv_tokens']:,} tokens, fewer than one request of the traffic "
                       f"({per_request:,})")
    rows = p.roofline.get("decode") or []
    row = next((x for x in rows if concurrency and x["batch"] == concurrency), rows[-1] if rows else None)
    tps = row["tokens_per_s"] if row else None
    cost = bench.cost_per_hour
    return PredictionRecord(
        fits=not reasons, reasons=reasons, weight_bytes=p.model["weight_bytes"], kv_tokens=p.capacity["kv_tokens"],
        max_batch_by_kv=max(1, p.capacity["kv_tokens"] // max(1, per_request)) if p.capacity["kv_tokens"] else 0,
        batch=row["batch"] if row else None, decode_tokens_per_s=tps, bound=row["bound"] if row else None,
        peak_source=p.roofline.get("peak_source"),
        cost_per_1m_output_tokens=(cost / (tps * 3600) * 1e6) if (cost is not None and tps) else None)
