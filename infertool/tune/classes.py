"""`tune.classes` / `tune --per-class`: the search per traffic class, and the routing table that serves each class
with its own configuration.

A per-class tune is N ordinary tunes over the same trials, one per class (``plan_classes``): each replays its class
alone (``bench.classes.replay``) under the class's SLO, in <tune dir>/classes/<class>/, with the tune directory's
one stage cache. The quantization, the reference, the screening and the served check read no bench setting, so
their keys are the same for every class: each runs once and every class reuses it. Only capacity (its key holds
the bench section: the class and its SLO) runs per class.

Then ``routing``: each class's winner, its load per replica and the replicas its peak needs (share x
target.peak_rps); whether one configuration serves every class within ``TOLERANCE`` of its best (then one
deployment); and the share-weighted $/1M of the per-class answer against the best single configuration. Written as
routing.json (``records.RoutingTable``) and, per routed class, its own tuned-<class>.yaml beside it (the
configuration it is routed to, with its SLO and traffic: ``write_class_recipes``). ``routed_manifests`` is what
`serve TUNE_DIR --emit k8s` emits from it: a Deployment and a Service per configuration and a Gateway API HTTPRoute
that routes on the class header.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from infertool.errors import UsageError
from infertool.metricspec import COST_PER_1M_OUTPUT_TOKENS, REQUEST_THROUGHPUT
from infertool.tune import search
from infertool.tune.context import EventCallback, emit
from infertool.tune.space import tune_of
from infertool.records import JSONView
from infertool.tune.records import BlendedCost, ClassRoute, RoutedDeployment, RoutingTable, TrialRecord

TOLERANCE = 0.05  # one configuration within 5 % of every class's best (or tied with it) is one deployment
ROUTING = "routing.json"
CLASSES_DIR = "classes"
MAX_NEEDED = 10_000  # requests a class may be asked to have, at most
MAX_REPLICAS = 10_000  # replicas a class's peak may need, at most (more: said, not written)
_TRIAL_ID = re.compile(r"[0-9a-f]{1,40}")

if TYPE_CHECKING:
    from infertool.recipe import Recipe, SLOSpec
    from infertool.resolve import Resolution
    from infertool.serve.k8s import K8sOptions
    from infertool.tune.core import TuneResult


@dataclass(frozen=True)
class ClassPlan:
    """One class to tune apart: its share of target.peak_rps, its SLO (an SLOSpec or None), its requests in one
    probe's traffic and the fewest a probe needs (``needed_requests``)."""

    name: str
    share: float | None
    slo: SLOSpec | None
    requests: int
    needed: int

    @property
    def too_few(self) -> bool:
        """Fewer requests in a probe's traffic than a probe needs: not measured (tune.classes: true leaves it out,
        to the default route; a class named in tune.classes is refused)."""
        return self.requests < self.needed

    def to_dict(self) -> dict[str, JSONView]:
        """The dry run's view of the class (--json)."""
        return {"name": self.name, "share": self.share, "requests": self.requests, "needed": self.needed,
                "tuned": not self.too_few,
                "slo": self.slo.model_dump(exclude_none=True) if self.slo is not None else None}


def needed_requests(confidence: float, target: float, min_concurrency: int) -> int:
    """The fewest requests of a class one load probe must send: enough that every one meeting the SLO proves the
    goodput target at the confidence (the exact binomial bound: target^n <= 1 - confidence; a target of 1 is
    taken as 0.99), and at least twice the smallest load."""
    t = min(max(target, 0.01), 0.99)
    stat = math.ceil(math.log(1 - confidence) / math.log(t))
    return max(2 * min_concurrency, min(MAX_NEEDED, stat))


def plan_classes(recipe: Recipe) -> list[ClassPlan]:
    """The classes tune.classes names (true: every class of the traffic, largest first), each with its share,
    SLO and requests; refused before any server starts (UsageError, exit 2): traffic that is not classed, a class
    the traffic does not have (naming the ones it has), a named class with fewer requests than a probe needs (how
    many; with true such a class is kept, ``too_few``, and left out of the search: ``run_per_class`` says so), no
    class with enough."""
    from infertool.bench.prompts import DEFAULT_CHARS_PER_TOKEN
    from infertool.bench.sweep import traffic_classes

    tune, bench = tune_of(recipe), recipe.bench
    if bench is None:
        raise UsageError("tune.classes needs a bench section: the traffic whose classes are tuned apart",
                         hint="add bench.prompt.source (a JSONL file, its lines' `class`) or bench.trace")
    if bench.classes.replay is not None:
        raise UsageError(f"bench.classes.replay ({bench.classes.replay}) and tune.classes exclude each other: a "
                         "per-class tune replays each class itself",
                         hint="remove bench.classes.replay, or tune.classes to tune that one class's traffic")
    per_probe = tune.load.requests or bench.requests
    mix = bench.model_copy(update={"requests": per_probe})
    summary = traffic_classes(mix, DEFAULT_CHARS_PER_TOKEN)
    if summary is None or not summary.classes:
        raise UsageError("tune.classes: this traffic is not classed (bench.prompt.source sharegpt is sampled with the "
                         "served model's tokenizer)", hint="give a JSONL prompt file or a trace (their lines' "
                         "`class`, or the derived classes): see `infertool bench --class`")
    known = {c.name: c for c in summary.classes}
    wanted = ([(c.name, None) for c in summary.classes] if tune.classes is True
              else [(c, None) if isinstance(c, str) else (c.name, c) for c in tune.classes or []])
    unknown = [name for name, _ in wanted if name not in known]
    if unknown:
        raise UsageError(f"tune.classes names {', '.join(repr(n) for n in unknown)}: not a class of this traffic (its "
                         f"classes: {', '.join(f'{c.name} ({c.requests})' for c in summary.classes)})",
                         hint="name classes the traffic has, or tune.classes: true for every one")
    from infertool.recipe import MAX_TUNE_CLASSES

    if len(wanted) > MAX_TUNE_CLASSES:
        raise UsageError(f"the traffic has {len(wanted)} classes; a per-class tune routes at most {MAX_TUNE_CLASSES} "
                         "(an HTTPRoute's 16 rules, one kept for the default)",
                         hint="list the classes to tune apart in tune.classes")
    load = tune.load
    needed = needed_requests(load.repeats.confidence, load.goodput_target, load.min_concurrency)
    plans = []
    for name, spec in wanted:
        c = known[name]
        slo = (spec.slo if spec is not None else None) or tune.slo or bench.slo
        share = spec.share if spec is not None and spec.share is not None else c.share
        plans.append(ClassPlan(name, share, slo, c.requests, needed))
    few = [p for p in plans if p.too_few]
    if few and (tune.classes is not True or len(few) == len(plans)):
        raise UsageError("too few requests to measure: " + "; ".join(
            f"class {p.name} has {p.requests} of the {per_probe:,} requests a probe sends, it needs {p.needed}"
            for p in few) + f" (all {needed} meeting the SLO prove goodput {load.goodput_target:g} at confidence "
            f"{load.repeats.confidence:g})",
            hint=("raise tune.load.requests (or bench.requests) so each class has enough, or leave the small "
                  "classes out of tune.classes" if not bench.trace else
                  "a longer trace, or leave the small classes out of tune.classes"))
    return plans


def class_recipe(recipe: Recipe, plan: ClassPlan) -> Recipe:
    """The recipe one class's tune runs: its traffic alone (bench.classes.replay), its SLO, named
    <recipe>-<class> (so its published winner does not replace another class's), served under the recipe's name."""
    assert recipe.bench is not None and recipe.tune is not None  # plan_classes refused a recipe without them
    bench = recipe.bench.model_copy(update={"classes": recipe.bench.classes.model_copy(update={"replay": plan.name}),
                                            "slo": plan.slo})
    tune = recipe.tune.model_copy(update={"classes": None, "slo": plan.slo})
    quantize = recipe.quantize
    if quantize is not None and quantize.output:  # each class's winner published apart
        quantize = quantize.model_copy(update={"output": f"{quantize.output}-{plan.name}"})
    # every class serves a configuration under the same name (the recipe's unless serve names one): one server per
    # configuration for all classes in the tune, and one model name for clients behind the class routing
    from infertool.recipe import ServeSection

    given = recipe.serve or ServeSection()
    serve = given.model_copy(update={"served_model_name": given.served_model_name or recipe.name})
    return recipe.model_copy(update={"name": f"{recipe.name}-{plan.name}", "bench": bench, "tune": tune,
                                     "quantize": quantize, "serve": serve})


@dataclass
class PerClassResult:
    tune_dir: str
    routing: RoutingTable
    results: dict[str, TuneResult] = field(default_factory=dict)  # class -> its tune's result
    tuned: dict[str, str] = field(default_factory=dict)  # class -> tuned-<class>.yaml
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        """Some class is routed (a configuration passed)."""
        return bool(self.routing.deployments)

    def to_dict(self) -> dict[str, JSONView]:
        return {"tune_dir": self.tune_dir, "routing": self.routing.to_dict(), "tuned": self.tuned,
                "seconds": self.seconds,
                "classes": {name: {"tune_dir": r.tune_dir, "winner": r.winner.id if r.winner else None,
                                   "tuned_recipe": r.tuned_recipe, "notes": r.notes} for name, r in self.results.items()}}


def run(recipe: Recipe, plans: list[ClassPlan] | None, *, out_dir: str | Path | None, exhaustive: bool,
        executor: str | None, on_event: EventCallback | None, on_trial: Callable[[TrialRecord], None] | None,
        publish: str | None, sign_key: str | None = None) -> TuneResult | PerClassResult:
    """`infertool tune`: a tune per class of ``plans`` (``load_tune``'s), else one tune."""
    from infertool.tune.run import run_tune

    if plans:
        return run_per_class(recipe, out_dir=out_dir, exhaustive=exhaustive, executor=executor, on_event=on_event,
                             on_trial=on_trial, publish=publish, plans=plans, sign_key=sign_key)
    return run_tune(recipe, out_dir=out_dir, exhaustive=exhaustive, executor=executor, on_event=on_event,
                    on_trial=on_trial, publish=publish, sign_key=sign_key)


def run_per_class(recipe: Recipe, *, out_dir: str | Path | None = None, exhaustive: bool = False, executor: str | None = None,
                  on_event: EventCallback | None = None, on_trial: Callable[[TrialRecord], None] | None = None, publish: str | None = None,
                  plans: list[ClassPlan] | None = None, sign_key: str | None = None) -> PerClassResult:
    """Each class's tune (``run.run_tune``) over the shared stage cache, then tuned-<class>.yaml and routing.json.
    ``plans``: ``plan_classes(recipe)`` when the caller already made it (the traffic read and classified once)."""
    import time

    from infertool.atomic import write_json
    from infertool.tune.run import run_tune

    t0 = time.monotonic()
    plans = plans if plans is not None else plan_classes(recipe)  # before anything runs
    few = [p for p in plans if p.too_few]
    plans = [p for p in plans if not p.too_few]
    for p in few:
        emit(on_event, f"class {p.name} left out: {p.requests} requests in a probe's traffic, a probe needs {p.needed}; "
             "its requests take the default route", "warning")
    tune_dir = Path(out_dir or tune_of(recipe).out_dir).expanduser() / recipe.name
    suffix = "-exhaustive" if exhaustive else ""
    results = {}
    recipes = [(class_recipe(recipe, p), tune_dir / CLASSES_DIR / p.name) for p in plans]
    pool, mix = None, None
    if (executor or tune_of(recipe).executor) == "local":  # one server per configuration for every class
        from infertool.resolve import resolve
        from infertool.tune.context import MixedTraffic
        from infertool.tune.run import tune_pool

        pool = tune_pool(tune_dir, resolve(recipe), on_event)
        assert recipe.bench is not None  # plan_classes refused a recipe without one
        key = json.dumps([recipe.bench.model_dump(mode="json"), tune_of(recipe).load.model_dump(mode="json")],
                         sort_keys=True)
        mix = MixedTraffic(recipe.bench, {p.name: p.slo for p in plans},  # one probe of it answers every class
                           hashlib.sha256(key.encode()).hexdigest()[:16])
    try:
        for i, p in enumerate(plans):
            emit(on_event, f"class {p.name} ({i + 1} of {len(plans)}): {p.requests} requests of a probe's traffic, "
                 "share " + (f"{p.share:.1%}" if p.share is not None else "-"))
            results[p.name] = run_tune(
                recipes[i][0], exhaustive=exhaustive, executor=executor, on_event=on_event, on_trial=on_trial,
                publish=str(Path(publish) / p.name) if publish else None, tune_dir=recipes[i][1],
                cache=tune_dir / ".stages", checked=i > 0, pool=pool, peers=tuple(recipes[i + 1:]), sign_key=sign_key,
                mix=mix)
    finally:
        if pool is not None:
            pool.close("the tune ended")
    table = routing(recipe, plans, results, {p.name: f"tuned{suffix}-{p.name}.yaml" for p in plans})
    tuned = write_class_recipes(recipe, plans, results, table, tune_dir)  # each routed class's own
    table.servers = pool.starts() if pool is not None else None
    table.notes += [f"class {p.name} not tuned: {p.requests} requests in a probe's traffic, a probe needs {p.needed} "
                    "(raise tune.load.requests); its requests take the default route" for p in few]
    write_json(tune_dir / f"routing{suffix}.json", table.to_dict())
    return PerClassResult(str(tune_dir), table, results, tuned, round(time.monotonic() - t0, 1))


def write_class_recipes(recipe: Recipe, plans: list[ClassPlan], results: dict[str, TuneResult], table: RoutingTable,
                        tune_dir: Path) -> dict[str, str]:
    """Each routed class's own recipe (``ClassRoute.recipe``, tuned-<class>.yaml): its tune's tuned recipe where
    it is routed to its own winner; else the recipe of the class whose winner its configuration is, made this
    class's (``routed_recipe``). A route whose recipe could not be made names none. Returns class -> path."""
    from infertool.atomic import write_text
    from infertool.report import read_inside

    by_name = {p.name: p for p in plans}
    out = {}
    for route in table.classes:
        src = results[route.winner_of].tuned_recipe if route.winner_of in results else None
        if route.recipe is None or route.configuration is None or src is None:
            route.recipe = None  # no file: routing.json names none
            continue
        text = read_inside(Path(src).parent, Path(src).name, 16 * 1024 * 1024).decode("utf-8")
        if route.winner_of != route.name:
            text = routed_recipe(text, recipe, by_name[route.name], route, Path(results[route.name].tune_dir))
        out[route.name] = str(tune_dir / route.recipe)
        write_text(Path(out[route.name]), text)
    return out


def routed_recipe(text: str, recipe: Recipe, plan: ClassPlan, route: ClassRoute, class_dir: Path) -> str:
    """Another class's tuned recipe (``text``: its winner, the configuration ``route`` sends this class to, its
    published checkpoint) as this class's: named for it, its bench traffic (bench.classes.replay) and SLO, its load
    under that SLO, its runs in its own tune directory; validated as every command takes it."""
    import yaml

    from infertool.recipe import validate_recipe_data

    data = yaml.safe_load(text)
    name = class_recipe(recipe, plan).name
    slo = plan.slo.model_dump(mode="json", exclude_defaults=True) if plan.slo is not None else None
    data["name"] = f"{name}-tuned"
    data["description"] = (f"tuned by `infertool tune {recipe.name}` per class: class {plan.name} is routed to "
                           f"{route.label} ({route.configuration}), class {route.winner_of}'s winner"
                           + (f" (${route.cost_per_1m:,.4g}/1M output tokens on this class)"
                              if route.cost_per_1m is not None else ""))
    data["run"] = {"out_dir": str((class_dir / "runs").absolute())}
    for section in ("bench", "tune"):
        sec = data.get(section)
        if isinstance(sec, dict) and (slo is not None or "slo" in sec):
            if slo is None:
                del sec["slo"]
            else:
                sec["slo"] = slo
    bench = data.get("bench")
    if isinstance(bench, dict):
        bench["classes"] = {**(bench.get("classes") or {}), "replay": plan.name}
        if route.max_load:
            bench["concurrency"] = sorted({1, int(route.max_load)})  # `run` benchmarks at this class's load
    validate_recipe_data(data, source=route.recipe or f"tuned-{plan.name}.yaml")
    head = (f"# Tuned by infertool from recipe {recipe.name!r}, class {plan.name}: routed to configuration "
            f"{route.configuration}, the winner of class {route.winner_of},\n# with this class's SLO and traffic.\n"
            "# `infertool run` and `infertool serve --emit k8s` take this file as it is.\n")
    return head + yaml.safe_dump(data, sort_keys=False, allow_unicode=True)


# ----------------------------------------------------------------------------------------- the routing table
def class_cost(rec: TrialRecord | None, objective: str) -> tuple[float | None, list[float | None] | None]:
    """A trial's $ per 1M output tokens on one class, with its interval (None: it cannot serve the class)."""
    if rec is None or not search.eligible(rec):
        return None, None
    cap = rec.capacity
    cost: float | None
    if rec.cost_per_1m_output_tokens is not None:
        cost = rec.cost_per_1m_output_tokens
    elif objective == "cost":
        cost = rec.objective
    else:
        cost = COST_PER_1M_OUTPUT_TOKENS.of(cap.at_max_load) if cap is not None and cap.at_max_load else None
    ci = rec.objective_ci if objective == "cost" else (cap.cost_ci if cap is not None else None)
    return cost, (list(ci) if ci else None)


def within(cost: float | None, ci: list[float | None] | None, best: float | None, best_ci: list[float | None] | None,
           tolerance: float = TOLERANCE) -> bool:
    """Whether ``cost`` is within ``tolerance`` of the ``best``, or tied with it (its interval reaches the best's)."""
    if cost is None or best is None:
        return False
    if cost <= best * (1 + tolerance):
        return True
    lo, hi = (ci or [None, None])[0], (best_ci or [None, None])[-1]
    return lo is not None and hi is not None and lo <= hi


def blend(rows: list[tuple[float | None, float | None, list[float | None] | None]]) -> tuple[float | None, list[float | None] | None]:
    """(share, $/1M, interval) per class -> their share-weighted $/1M and interval (None: a class not served; equal
    weights when a share is unknown)."""
    if not rows or any(c is None for _, c, _ in rows):
        return None, None
    weights = [w if w is not None else 1.0 for w, _, _ in rows]
    total = sum(weights) or 1.0
    cost = sum(w * c for w, (_, c, _) in zip(weights, rows) if c is not None) / total
    ends: list[float | None] = []
    for k in (0, 1):
        vals = [(ci[k] if ci and len(ci) == 2 else None) for _, _, ci in rows]
        ends.append(sum(w * v for w, v in zip(weights, vals) if v is not None) / total
                    if all(v is not None for v in vals) else None)
    return cost, ends if any(e is not None for e in ends) else None


def load_rps(rec: TrialRecord) -> tuple[float | None, list[float | None] | None]:
    """Requests/s one replica serves at the largest load under the SLO, with the interval the throughput's gives."""
    cap = rec.capacity
    if cap is None or not cap.max_load or cap.at_max_load is None:
        return None, None
    rps = REQUEST_THROUGHPUT.of(cap.at_max_load) or cap.at_max_load.goodput.requests_per_s
    if not rps or rps <= 0:
        return None, None
    ci = cap.throughput_ci
    if ci and cap.throughput and len(ci) == 2 and all(v is not None for v in ci):
        return rps, [rps * ci[0] / cap.throughput, rps * ci[1] / cap.throughput]
    return rps, None


def _replicas(peak: float | None, rps: float | None) -> int | None:
    if peak is None or not rps:
        return None
    return max(1, min(MAX_REPLICAS, math.ceil(peak / rps - 1e-9)))


def routing(recipe: Recipe, plans: list[ClassPlan], results: dict[str, TuneResult], tuned: dict[str, str]) -> RoutingTable:
    """The routing table from each class's tune (``results``: class -> core.TuneResult; ``tuned``: class -> the
    name its own tuned-<class>.yaml takes: the configuration it is routed to, with its SLO and traffic,
    ``write_class_recipes``); a Deployment's recipe is the file of the class whose winner its configuration is;
    each class's speculative trials with their acceptance and crossover (their levels left in its tune.json)."""
    tune = tune_of(recipe)
    objective = tune.objective
    peak_all = recipe.target.peak_rps if recipe.target is not None else None
    recs = {p.name: {t.id: t for t in results[p.name].trials} for p in plans}
    winners = {p.name: results[p.name].winner for p in plans}
    best = {p.name: class_cost(winners[p.name], objective) for p in plans}
    notes: list[str] = []
    # the best single configuration: any trial that can serve every class, share-weighted
    ids = set.intersection(*(set(r) for r in recs.values())) if recs else set()
    single: BlendedCost | None = None
    for tid in sorted(ids):
        rows = [(p.share, *class_cost(recs[p.name][tid], objective)) for p in plans]
        cost, ci = blend(rows)
        if cost is not None and (single is None or cost < (single.cost_per_1m or math.inf)):
            ok = all(within(c, i, *best[p.name]) for p, (_, c, i) in zip(plans, rows))
            single = BlendedCost(tid, recs[plans[0].name][tid].label, cost, ci, ok)
    per_class = None
    if all(w is not None for w in winners.values()):
        cost, ci = blend([(p.share, *best[p.name]) for p in plans])
        per_class = BlendedCost(None, None, cost, ci, True)
    else:
        notes.append("no configuration passes for " + ", ".join(n for n, w in winners.items() if w is None)
                     + ": those classes are not routed")
    # one deployment: a class winner (re-checked as served) within TOLERANCE of every class's best
    one: str | None = None
    for cfg_id in sorted({w.id for w in winners.values() if w is not None},
                    key=lambda i: blend([(p.share, *class_cost(recs[p.name].get(i), objective)) for p in plans])[0] or math.inf):
        if all(within(*class_cost(recs[p.name].get(cfg_id), objective), *best[p.name]) for p in plans):
            one = cfg_id
            break
    differ = len({w.id for w in winners.values() if w is not None}) > 1
    if one is not None and differ:
        notes.append(f"one configuration, {one}, serves every class within {TOLERANCE:.0%} of its best (a tie counts): "
                     "one deployment")
    home = {w.id: name for name, w in winners.items() if w is not None}  # a configuration's class (its recipe's)
    routes = []
    for p in plans:
        w = winners[p.name]
        cfg = one if one is not None else (w.id if w is not None else None)
        rec = recs[p.name].get(cfg) if cfg else None
        peak = p.share * peak_all if (p.share is not None and peak_all is not None) else None
        route = ClassRoute(name=p.name, share=p.share, requests=p.requests,
                           slo=p.slo.model_dump(exclude_none=True) if p.slo is not None else None,
                           winner=w.id if w else None, winner_label=w.label if w else None, peak_rps=peak)
        if rec is not None and cfg is not None:
            rps, rps_ci = load_rps(rec)
            cost, ci = class_cost(rec, objective)
            route.configuration, route.label, route.recipe = cfg, rec.label, tuned.get(p.name)
            route.winner_of = p.name if w is not None and w.id == cfg else home.get(cfg)
            route.max_load = rec.capacity.max_load if rec.capacity else None
            route.max_load_ci = rec.capacity.max_load_ci if rec.capacity else None
            route.load_rps, route.load_rps_ci, route.cost_per_1m, route.cost_per_1m_ci = rps, rps_ci, cost, ci
            route.replicas = _replicas(peak, rps)
            if peak is None:
                route.note = "replicas not sized: set target.peak_rps"
        route.speculation = [replace(t.speculation, levels=None) for t in results[p.name].trials
                             if t.speculation is not None] or None
        routes.append(route)
    deployments = []
    for cfg in dict.fromkeys(r.configuration for r in routes if r.configuration):
        mine = [r for r in routes if r.configuration == cfg]
        need = [r.peak_rps / r.load_rps if (r.peak_rps is not None and r.load_rps) else None for r in mine]
        replicas = (max(1, min(MAX_REPLICAS, math.ceil(sum(n for n in need if n is not None) - 1e-9)))
                    if need and all(n is not None for n in need) else None)
        own = next((r for r in mine if r.winner_of == r.name), mine[0])  # the configuration's own recipe
        deployments.append(RoutedDeployment(cfg, mine[0].label or "", own.recipe or "", [r.name for r in mine],
                                            replicas))
    notes += [line for p in plans if (line := traffic_note(p.name, results[p.name].trials))]
    return RoutingTable(recipe=recipe.name, objective=objective, header=tune.routing.header,
                        gateway=tune.routing.gateway, peak_rps=peak_all, tolerance=TOLERANCE, winners_differ=differ,
                        one_deployment=len(deployments) == 1, classes=routes, deployments=deployments,
                        per_class=per_class, single=single, notes=notes)


def traffic_note(name: str, trials: list[TrialRecord]) -> str | None:
    """What a class's load searches sent (``CapacityResult.mix``): the probes of the whole traffic measured for
    them, those read from another class's, its probes alone; None: it replayed its traffic alone (Ray)."""
    mixes = [t.capacity.mix for t in trials if t.capacity is not None and t.capacity.mix is not None]
    if not mixes:
        return None
    alone = sum(m.alone is not None for m in mixes)
    return (f"class {name}: its figures are its own requests in probes of the whole traffic: "
            f"{sum(len(m.measured) for m in mixes)} load(s) measured for its searches, "
            f"{sum(len(m.reused) for m in mixes)} read from probes already sent"
            + (f"; its traffic alone once for each of {alone} speculative setting(s) (the acceptance per draft "
               "position)" if alone else ""))


def load_tune(recipe: str, overrides: list[str], executor: str | None,
              per_class: bool) -> tuple[Recipe, list[ClassPlan] | None]:
    """The recipe `infertool tune` runs (--executor is tune.executor: the recipe is validated with it, machine kinds
    need ray), and its classes when tuned per class (--per-class: every class of the traffic unless tune.classes
    lists them): unknown classes, too few requests, refused before anything runs."""
    from infertool.recipe import load_recipe

    if executor is not None and executor not in ("local", "ray"):
        raise UsageError(f"--executor {executor!r}: local or ray")
    r = load_recipe(recipe, [*overrides, *([f"tune.executor={executor}"] if executor else [])])
    if r.tune is None:
        raise UsageError(f"recipe {r.name!r} has no tune section", hint="add one (candidates, serve_grid, objective), "
                         "e.g. `infertool recipes show quickstart-tune`")
    if per_class and not r.tune.classes:
        r = r.model_copy(update={"tune": r.tune.model_copy(update={"classes": True})})
    assert r.tune is not None  # checked above
    return r, plan_classes(r) if r.tune.classes else None


def plan_line(classes: list[ClassPlan]) -> str:
    """The dry run's line under its table: each class's requests a probe and its share."""
    return ("per class (each searched with its own traffic and SLO; accuracy evidence shared): "
            + "; ".join(f"{c.name}: {c.requests} requests a probe, share "
                        + (f"{c.share:.1%}" if c.share is not None else "-")
                        + ("" if not c.too_few else f" (left out: a probe needs {c.needed})") for c in classes))


def routing_rows(table: RoutingTable) -> list[list[str]]:
    """The per-class answer's table: a row per class (its winner, the configuration it is routed to, load per
    replica, peak, replicas, $/1M with intervals)."""
    def num(v: float | int | None, fmt: str = "{:,.4g}") -> str:
        return fmt.format(v) if v is not None else "-"

    def ci(pair: list[float | None] | None) -> str:
        return f" [{num(pair[0])}, {num(pair[1])}]" if pair and len(pair) == 2 else ""

    rows = [["class", "share", "winner", "routed to", "max load / replica", "req/s / replica", "peak req/s",
             "replicas", "$/1M out tok", "recipe"]]
    for r in table.classes:
        routed = (r.configuration or "-") + (f" ({r.winner_of}'s winner)" if r.winner_of not in (None, r.name) else "")
        rows.append([r.name, num(r.share, "{:.1%}"), r.winner_label or "none passes", routed,
                     num(r.max_load) + (f" [{r.max_load_ci[0]}, {r.max_load_ci[1]}]" if r.max_load_ci else ""),
                     num(r.load_rps) + ci(r.load_rps_ci), num(r.peak_rps), num(r.replicas),
                     num(r.cost_per_1m) + ci(r.cost_per_1m_ci), r.recipe or "-"])
    return rows


def summary_lines(table: RoutingTable) -> list[str]:
    """What the console says under the table: whether the classes got different winners, one deployment or one
    per configuration, and what a single configuration would have cost instead."""
    def money(cost: float | None, ci: list[float | None] | None) -> str:
        if cost is None:
            return "-"
        return f"${cost:,.4g}/1M" + (f" [{ci[0]:,.4g}, {ci[1]:,.4g}]" if ci and None not in ci else "")

    lines = [("the classes got different winners" if table.winners_differ else "every class got the same winner")
             + (": one deployment serves them all" if table.one_deployment
                else f": {len(table.deployments)} deployments, routed on the header {table.header}")]
    if table.per_class is not None:
        lines.append(f"per class: {money(table.per_class.cost_per_1m, table.per_class.cost_per_1m_ci)} (each class's "
                     "$/1M weighted by its share)")
    s = table.single
    if s is not None:
        lines.append(f"the cheapest single configuration for every class, {s.configuration} {s.label}: "
                     f"{money(s.cost_per_1m, s.cost_per_1m_ci)}"
                     + (f" (within {table.tolerance:.0%} of every class's best)" if s.within else
                        f" (more than {table.tolerance:.0%} above some class's best)"))
        deployed = table.deployments[0].configuration if table.one_deployment and table.deployments else None
        if deployed is not None and deployed != s.configuration:
            lines.append(f"the one deployment serves {deployed}: a class winner within {table.tolerance:.0%} of (or "
                         "tied with) every class's best; only class winners are re-checked as served")
    else:
        lines.append("no single configuration passes for every class")
    return lines + speculation_lines(table) + list(table.notes)


def speculation_lines(table: RoutingTable) -> list[str]:
    """Per class and speculative setting: the acceptance per draft position (mean accepted length) and the
    crossover load against the same settings without speculation, or "not measured" and why."""
    lines = []
    for r in table.classes:
        for s in r.speculation or []:
            why = "; ".join(s.notes)
            lines.append(f"class {r.name}, {s.setting} (trial {s.trial}): accepted by draft position "
                         f"{s.acceptance_text}; crossover: {s.crossover_text}" + (f" ({why})" if why else ""))
    return lines


# ----------------------------------------------------------------------------------------- serve --emit k8s
def read_routing(tune_dir: Path) -> RoutingTable:
    """routing.json of a per-class tune directory, checked before it names a file or a manifest (UsageError)."""
    from infertool.recipe import TuneRouting
    from infertool.report import Unreadable, read_json_inside
    from infertool.schema import class_name_problem

    try:
        table = RoutingTable.from_dict(read_json_inside(tune_dir, ROUTING))
    except (OSError, Unreadable) as e:
        raise UsageError(f"{tune_dir / ROUTING}: {e}", hint="run `infertool tune --per-class` again") from None
    from pydantic import ValidationError

    try:
        TuneRouting(header=table.header, gateway=table.gateway)
    except ValidationError as e:  # the header or the Gateway name: the recipe's own rules
        first = e.errors()[0]
        raise UsageError(f"{tune_dir / ROUTING}: {'.'.join(str(x) for x in first['loc'])}: {first['msg']}",
                         hint="run `infertool tune --per-class` again") from None
    if not table.deployments:
        raise UsageError(f"{tune_dir / ROUTING} routes no class: no configuration passed", hint="see classes/*/tune.md")
    for d in table.deployments:
        bad = (not _TRIAL_ID.fullmatch(d.configuration or "") or not re.fullmatch(r"tuned-[A-Za-z0-9_-]{1,64}\.yaml", d.recipe)
               or any(class_name_problem(c) for c in d.classes) or not d.classes)
        if bad:
            raise UsageError(f"{tune_dir / ROUTING}: a deployment that is not one tune wrote ({d.configuration!r})",
                             hint="run `infertool tune --per-class` again")
    problem = routes_problem(table)
    if problem:
        raise UsageError(f"{tune_dir / ROUTING}: {problem}", hint="run `infertool tune --per-class` again")
    return table


def routes_problem(table: RoutingTable) -> str | None:
    """Why routing.json's classes are not what tune writes (None: they are): each class a class name (a valid
    header value, 64 characters at most) once, its share a fraction; at most MAX_TUNE_CLASSES of them (a Gateway
    API HTTPRoute holds 16 rules: one per class and the default; more are refused, not split); each deployment's
    configuration once, its classes exactly those routed to it; and at least one class routed to a deployment."""
    from infertool.recipe.tune import MAX_TUNE_CLASSES
    from infertool.schema import class_name_problem

    names = [c.name for c in table.classes]
    bad = next((p for p in map(class_name_problem, names) if p), None)
    if bad:
        return bad
    if len(set(names)) != len(names):
        return f"class {next(n for n in names if names.count(n) > 1)!r} is listed twice"
    if len(names) > MAX_TUNE_CLASSES:
        return (f"{len(names)} classes; tune routes at most {MAX_TUNE_CLASSES} (an HTTPRoute holds 16 rules: one "
                "per class and the default), so this is refused rather than split over several HTTPRoutes")
    odd = next((c.name for c in table.classes if c.share is not None
                and not (isinstance(c.share, (int, float)) and 0.0 <= c.share <= 1.0)), None)
    if odd is not None:
        return f"class {odd!r}: its share is not a fraction from 0 to 1"
    configs = [d.configuration for d in table.deployments]
    if len(set(configs)) != len(configs):
        return f"configuration {next(c for c in configs if configs.count(c) > 1)!r} is deployed twice"
    for d in table.deployments:
        routed = sorted(c.name for c in table.classes if c.configuration == d.configuration)
        if sorted(d.classes) != routed:
            return (f"deployment {d.configuration!r} serves {', '.join(d.classes)} but the classes routed to it are "
                    f"{', '.join(routed) or 'none'}")
    if not any(c.configuration in configs for c in table.classes):
        return "no class is routed to a deployment"
    return None


@dataclass
class RoutedManifests:
    """`serve TUNE_DIR --emit k8s` of a per-class tune: the documents, the comment lines, the resolutions served."""

    docs: list[dict[str, JSONView]]  # the Kubernetes documents (serve.k8s's)
    comments: list[str]

    def to_dict(self) -> dict[str, JSONView]:
        return {"emit": "k8s", "manifests": self.docs, "comments": self.comments}

    def yaml(self) -> str:
        from infertool.serve.k8s import dump_docs

        return "".join(f"# {line}\n" for line in self.comments) + "---\n" + dump_docs(self.docs)


def routed_manifests(tune_dir: Path, options: K8sOptions, overrides: list[str] | None = None,
                     checks: Callable[[Resolution], None] | None = None) -> RoutedManifests:
    """A Deployment and a Service per configuration of routing.json (each its tuned recipe, its checkpoint checked
    by fingerprint; replicas: routing.json's unless --replicas), and an HTTPRoute sending each class's header value
    to its Service, every other request to the largest class's."""
    from infertool.publish import served
    from infertool.serve.k8s import comment_text, header_lines, http_route, k8s_name, manifests, with_replicas

    table = read_routing(tune_dir)
    docs: list[dict[str, JSONView]] = []
    comments = [comment_text(f"Per-class deployments of tune {table.recipe!r} (routing.json): "
                             f"{len(table.deployments)} configuration(s) for {len(table.classes)} classes, routed on "
                             f"the request header {table.header} by an HTTPRoute on the Gateway {table.gateway} "
                             "(install the Gateway API CRDs and a Gateway first).", None)]
    service_of: dict[str, tuple[str, int]] = {}
    base = k8s_name(table.recipe)[:37].strip("-") or "infertool"  # + "-" + a 12-character trial id: 50 at most
    named: dict[str, str] = {}
    for d in table.deployments:
        name = f"{base}-{d.configuration[:12]}"
        if k8s_name(name) in named:  # the Deployment's and Service's DNS-1035 name
            raise UsageError(f"{tune_dir / ROUTING}: configurations {named[k8s_name(name)]} and {d.configuration} "
                             f"would both be the Deployment and Service {k8s_name(name)!r}",
                             hint="two configurations must differ in their first 12 characters: run "
                             "`infertool tune --per-class` again")
        named[k8s_name(name)] = d.configuration
        res = served(str(tune_dir / d.recipe), [*(overrides or []), f"name={name}"]).res
        if checks is not None:
            checks(res)
        basis = (f"routing.json: the peaks of {', '.join(d.classes)} over one replica's load under each class's SLO"
                 if d.replicas is not None else "the default: set target.peak_rps before tune to size it")
        o = with_replicas(options, d.replicas, basis)
        mine = manifests(res, options=o)
        service = next(m for m in mine if m["kind"] == "Service")
        service_of[d.configuration] = (service["metadata"]["name"], int(service["spec"]["ports"][0]["port"]))
        comments += [comment_text(f"[{name}: classes {', '.join(d.classes)}] {line}", None) for line in header_lines(res, o)]
        docs += mine
    rules = [(r.name, *service_of[r.configuration]) for r in table.classes
             if r.configuration is not None and r.configuration in service_of]
    largest = max((r for r in table.classes if r.configuration in service_of), key=lambda r: r.share or 0.0)
    assert largest.configuration is not None  # read_routing: at least one class is routed to a deployment
    route = http_route(f"{base}-classes", table.header, table.gateway, rules, service_of[largest.configuration],
                       namespace=options.namespace)
    comments.append(comment_text(f"HTTPRoute {base}-classes: {table.header}: "
                                 + ", ".join(f"{c} -> {s}" for c, s, _ in rules)
                                 + f"; any other request -> {service_of[largest.configuration][0]} (the largest "
                                 f"class, {largest.name}).", None))
    return RoutedManifests(docs + [route], comments)
