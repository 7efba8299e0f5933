"""tune across machine kinds (issue 23, deliverable 5): tune.machines validated with field paths; the kind is one
more dimension of the search space (counted, indexed, sampled by TPE); each kind's trials planned on its GPU and
priced at its price; the Ray executor asks for each kind's resources, skips a kind no live node offers and never
waits forever; $ per 1M output tokens compared across kinds.

These drive the executor through a stand-in for the `ray` module (a scheduler over crafted nodes: the same
executor code, no cluster, a trial function that measures nothing: the executor's seam). A real two-node Ray
cluster (custom resources {small: 1} and {big: 1}, and a kind no node offers) with real vLLM trials is
tests/test_tune_real.py::test_tune_through_a_local_ray_instance (slow)."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from infertool.errors import UsageError
from infertool.recipe import ray_accelerator_type, validate_recipe_data
from infertool.tune import core, executor, search, space
from infertool.tune.records import CapacityResult
from tests.conftest import ROOT, cli_in_process

SMALL = {"name": "small", "price_per_hour": 0.5, "resources": {"small": 1}}
BIG = {"name": "big", "price_per_hour": 2.0, "resources": {"big": 1}}
TOKENS_PER_S = 360.0  # what the stand-in trial "measures" at its largest load, on every kind


def quickstart(machines=None, executor_: str = "ray", candidates=None, **tune) -> dict:
    data = yaml.safe_load((ROOT / "recipes" / "quickstart-tune.yaml").read_text())
    data["tune"].update(executor=executor_, **tune)
    if machines is not None:
        data["tune"]["machines"] = machines
    if candidates is not None:
        data["tune"]["candidates"] = candidates
    return data


def write(tmp_path: Path, data: dict) -> Path:
    p = tmp_path / "recipe.yaml"
    p.write_text(yaml.safe_dump(data, sort_keys=False))
    return p


# --------------------------------------------------------------------------------------------- the recipe
@pytest.mark.parametrize("machines, executor_, path, words", [
    ([SMALL, {**BIG, "name": "small"}], "ray", "tune.machines[1].name", "machine kind 'small' is also machines[0]"),
    ([SMALL, BIG], "local", "tune.machines", "2 machine kinds need tune.executor: ray"),
    ([{"name": "bare", "price_per_hour": 1.0}], "ray", "tune.machines[0]", "accelerator_type or custom resources"),
    ([{"name": "g", "price_per_hour": 1.0, "gpu": "RTX4090"}], "ray", "tune.machines[0]",
     "gpu RTX4090 has no Ray accelerator type"),
    ([{**SMALL, "price_per_hour": 0}], "ray", "tune.machines[0].price_per_hour", "greater than 0"),
    ([{**SMALL, "price_per_hour": 20000}], "ray", "tune.machines[0].price_per_hour", "less than or equal to 10000"),
    ([{**SMALL, "resources": {"GPU": 1}}], "ray", "tune.machines[0].resources", "one of Ray's own resources"),
    ([{**SMALL, "gpu": "Z80"}], "ray", "tune.machines[0].gpu", "unknown GPU 'Z80'"),
    ([{**SMALL, "name": "a b"}], "ray", "tune.machines[0].name", "only letters, digits"),
])
def test_a_bad_machine_kind_is_refused_with_its_field_path(tmp_path, machines, executor_, path, words):
    r = cli_in_process("validate", str(write(tmp_path, quickstart(machines, executor_))))
    assert r.returncode == 2, r.stdout + r.stderr
    assert path in r.stderr and words in r.stderr, r.stderr
    assert "Traceback" not in r.stderr


def test_machine_kinds_price_the_trials_without_bench_cost_per_hour(tmp_path):
    data = quickstart([SMALL, BIG])
    del data["bench"]["cost_per_hour"]
    assert cli_in_process("validate", str(write(tmp_path, data))).returncode == 0
    one_local = quickstart([{"name": "this-box", "price_per_hour": 0.3}], "local")  # local: one kind, this machine
    del one_local["bench"]["cost_per_hour"]
    assert validate_recipe_data(one_local).tune.machines[0].name == "this-box"
    data = quickstart()
    del data["bench"]["cost_per_hour"]  # without kinds the price is still bench.cost_per_hour, as before
    r = cli_in_process("validate", str(write(tmp_path, data)))
    assert r.returncode == 2 and "bench.cost_per_hour" in r.stderr


def test_ray_accelerator_types_of_the_gpu_table():
    # as Ray labels a node it detects each on (the first all-caps model token of the NVIDIA name)
    assert [ray_accelerator_type(g) for g in ("H100-SXM", "H200-SXM", "A100-80GB-SXM", "L40S", "L4", "RTX4090")] == \
        ["H100", "H200", "A100", "L40S", "L4", None]


def test_the_ray_names_are_rays_own_reading_of_the_datasheet_names():
    """Every GPU of the table that has a Ray name has the one Ray's own detection gives its NVIDIA name."""
    pytest.importorskip("ray")
    from ray._private.accelerators.nvidia_gpu import NvidiaGPUAcceleratorManager

    from infertool.perf.hardware import GPUS

    named = {k: ray_accelerator_type(k) for k in GPUS
             if ray_accelerator_type(k) and GPUS[k].name.startswith("NVIDIA ")}
    assert named and all(NvidiaGPUAcceleratorManager._gpu_name_to_accelerator_type(GPUS[k].name) == v
                         for k, v in named.items())


# --------------------------------------------------------------------------------------------- the space
def test_the_kind_is_one_more_dimension_of_the_space():
    r = validate_recipe_data(quickstart([SMALL, BIG]))
    sp = space.search_space(r)
    assert sp.size == 3 * 2 * 2 and sp.kinds == 2
    assert sp.describe() == "12 trials (3 candidates x 2 serving settings: max_num_seqs 2 x 2 machine kinds)"
    trials = [sp.trial(i) for i in range(sp.size)]
    assert [t.machine.name for t in trials[:4]] == ["small", "big", "small", "big"]  # the kind varies fastest
    assert len({t.id for t in trials}) == 12  # the same configuration on another kind is another trial
    first, second = trials[0], trials[1]
    assert (first.candidate, first.serve) == (second.candidate, second.serve) and first.id != second.id
    assert first.label.endswith("@ small") and second.label.endswith("@ big")
    assert sp.index(2, {"max_num_seqs": 1}, 1) == 11 and sp.trial(11).machine.name == "big"
    assert (first.recipe.bench.cost_per_hour, second.recipe.bench.cost_per_hour) == (0.5, 2.0)
    assert first.to_dict()["machine"] == {"name": "small", "price_per_hour": 0.5, "price_per": "machine", "gpus": 1,
                                          "trial_price_per_hour": 0.5, "resources": {"small": 1.0}}
    # the space's size with kinds is refused from the lengths, as before
    with pytest.raises(UsageError, match=r"x 40 machine kinds\), more than"):
        space.search_space(validate_recipe_data(quickstart(
            [{"name": f"k{i}", "price_per_hour": 1.0, "resources": {f"k{i}": 1}} for i in range(40)],
            serve_grid={"max_num_seqs": list(range(1, 65)), "max_num_batched_tokens": list(range(1000, 1064)),
                        "max_model_len": list(range(1024, 1064))})))


def test_a_kind_with_a_gpu_is_planned_on_it_and_priced_per_gpu():
    l4 = {"name": "l4", "price_per_hour": 0.8, "gpu": "L4"}
    h100 = {"name": "h100", "price_per_hour": 4.0, "gpu": "H100-SXM"}
    r = validate_recipe_data(quickstart([l4, h100], serve_grid={"tensor_parallel_size": [2]}, candidates=["none"]))
    on_l4, on_h100 = (core.predicted(t) for t in space.trials(r))
    assert (on_l4.recipe.target.gpu, on_h100.recipe.target.gpu) == ("L4", "H100-SXM")
    assert (on_l4.price_per_hour, on_h100.price_per_hour) == (1.6, 8.0)  # per GPU x TP 2
    assert on_l4.to_dict()["machine"]["gpus"] == 2 and on_l4.to_dict()["machine"]["price_per"] == "gpu"
    for t in (on_l4, on_h100):  # the prediction's $/1M is the kind's price over its roofline bound
        p = t.prediction
        assert p.cost_per_1m_output_tokens == pytest.approx(t.price_per_hour / (p.decode_tokens_per_s * 3600) * 1e6)
    # H100's bandwidth (3.35 TB/s) against L4's (0.3): the same model decodes faster on it
    assert on_h100.prediction.decode_tokens_per_s > 5 * on_l4.prediction.decode_tokens_per_s
    # and Ray is asked for the kind's GPU type and TP x PP GPUs of it
    opts = executor.ray_options(r.tune, on_h100)
    assert opts == {"num_cpus": 1, "num_gpus": 2, "accelerator_type": "H100"}


def test_tpe_sees_the_kind_as_a_dimension():
    pytest.importorskip("optuna")
    r = validate_recipe_data(quickstart([SMALL, BIG], sampler="tpe", max_trials=5))
    plan = core.plan_search(r)
    chosen = executor._select(SimpleNamespace(exhaustive=False, tune=r.tune), plan)
    assert len(chosen) == 5 and len({t.id for t in chosen}) == 5
    for t in chosen:
        assert plan.space.trial(t.index).id == t.id
    assert {t.machine.name for t in chosen} == {"small", "big"}


def test_no_machines_keeps_the_trial_ids_and_the_records():
    from tests.test_tune_grid_bounds import QUICKSTART_IDS

    r = validate_recipe_data(quickstart(executor_="local"))
    trials = space.trials(r)
    assert {t.id for t in trials} == QUICKSTART_IDS
    assert all(t.machine is None and "machine" not in t.to_dict() and t.price_per_hour is None for t in trials)
    rec = core.trial_record(trials[0])
    assert "machine" not in rec.to_dict() and "cost_per_1m_output_tokens" not in rec.to_dict()


# --------------------------------------------------------------------------------------------- the objective
def test_cost_per_1m_is_the_kinds_price_over_the_tokens_of_an_hour():
    cap = CapacityResult(max_load=4, at_max_load={"output_token_throughput": 250.0,
                                                  "cost": {"per_1m_output_tokens": 0.5555}})
    # 2.0 $/h over 250 tok/s x 3600 s = 900,000 tokens an hour: 2.2222 $ per 1M
    assert search.cost_per_1m(cap, 2.0) == pytest.approx(2.2222, abs=1e-4)
    assert search.objective_value("cost", cap, 2.0) == pytest.approx(2.2222, abs=1e-4)
    assert search.objective_value("cost", cap) == 0.5555  # no kind: bench.cost_per_hour's figure, as before
    assert search.objective_value("cost", CapacityResult(max_load=0), 2.0) is None
    assert search.cost_per_1m(CapacityResult(max_load=4, at_max_load={}), 2.0) is None


# --------------------------------------------------------------------------------------------- placement
def node(nid: str, **resources) -> dict:
    return {"NodeID": nid, "Alive": True, "Resources": {"node:127.0.0.1": 1.0, "memory": 1e9, **resources}}


def test_a_kind_no_live_node_offers_is_said_with_what_it_needs():
    r = validate_recipe_data(quickstart([SMALL, BIG, {"name": "l4", "price_per_hour": 0.8, "gpu": "L4"}]))
    small, big, l4 = (space.search_space(r).trial(i) for i in range(3))
    nodes = [node("a", CPU=1.0, small=1.0), {**node("b", CPU=4.0, big=1.0), "Alive": False}]
    totals = {"CPU": 1.0, "small": 1.0, "node:127.0.0.1": 1.0, "memory": 1e9}
    assert executor.unplaceable(small, executor.ray_options(r.tune, small), nodes, totals) is None
    why = executor.unplaceable(big, executor.ray_options(r.tune, big), nodes, totals)
    assert why == ("not run: no live Ray node offers what machine kind 'big' needs (CPU 1, big 1); the cluster has "
                   "1 live node(s) with CPU 1, small 1 in all")
    opts = executor.ray_options(r.tune, l4)
    assert opts["accelerator_type"] == "L4" and executor.demand(opts)["accelerator_type:L4"] == 0.001
    assert "accelerator_type:L4 0.001" in executor.unplaceable(l4, opts, nodes, totals)
    # a node with the kind but too few CPUs for a trial cannot take it either
    assert executor.unplaceable(small, {"num_cpus": 2, "num_gpus": 0, "resources": {"small": 1}}, nodes, totals)


class Ref:
    """A task's object ref (hashable, by identity, like Ray's)."""

    def __init__(self, opts: dict):
        self.opts, self.done, self.value = opts, False, None


class FakeRay:
    """A stand-in for the `ray` module the executor uses: tasks run when submitted, on the first node whose free
    resources cover the request (none: they stay pending until cancelled)."""

    def __init__(self, nodes: list[dict]):
        self._nodes, self.free = nodes, {n["NodeID"]: dict(n["Resources"]) for n in nodes}
        self.submitted, self.cancelled, self.current = [], [], None

    def init(self, **kw):
        pass

    def nodes(self):
        return self._nodes

    def cluster_resources(self):
        out: dict = {}
        for n in self._nodes:
            for k, v in n["Resources"].items():
                out[k] = out.get(k, 0) + v
        return out

    def remote(self, **kw):
        return lambda fn: SimpleNamespace(options=lambda **opts: SimpleNamespace(
            remote=lambda *args: self._submit(fn, opts, args)))

    def _submit(self, fn, opts, args):
        need = executor.demand(opts)
        ref = Ref(opts)
        self.submitted.append(ref)
        for nid, free in self.free.items():
            if all(free.get(k, 0) >= v for k, v in need.items()):
                self.current = SimpleNamespace(get_node_id=lambda nid=nid: nid, get_assigned_resources=lambda: need)
                ref.value, ref.done = fn(*args), True
                break
        return ref

    def get_runtime_context(self):
        return self.current

    def wait(self, refs, num_returns=1, timeout=None):
        done = [r for r in refs if r.done][:num_returns]
        if not done and timeout:
            time.sleep(timeout)  # as Ray's: blocks up to its timeout when nothing is ready
        return done, [r for r in refs if r not in done]

    def get(self, ref, timeout=None):
        return ref.value

    def cancel(self, ref):
        self.cancelled.append(ref)
        ref.done = True


def fake_trial(recipe_data: dict, tune_dir: str, exhaustive: bool, trial_index: int, trial_id: str):
    """A Ray worker's trial without vLLM: the real trial (its record, its objective at its kind's price), its
    stages answered by a capacity "measured" at TOKENS_PER_S output tokens/s at concurrency 4."""
    from infertool.stages import StageOutput
    from infertool.tune.context import Context

    recipe = validate_recipe_data(recipe_data, source="test")
    ctx = Context(recipe, Path(tune_dir), exhaustive=exhaustive, on_event=None, on_trial=None)

    def run_stages(trial, wanted, outputs, rec=None):
        if "capacity" in wanted:
            outputs["capacity"] = StageOutput(Path(tune_dir), CapacityResult(
                max_load=4, stopped="measured by the test", at_max_load={"output_token_throughput": TOKENS_PER_S,
                                                                          "tpot_ms": {"p50": 11.1}}), "key")
        return outputs

    ctx.run_stages = run_stages
    trial = core.predicted(space.search_space(recipe).trial(trial_index))
    assert trial.id == trial_id
    return core.run_trial(ctx, trial)


def two_kind_tune(tmp_path: Path, machines: list[dict], **ray):
    data = quickstart(machines, candidates=["none"], serve_grid={"max_num_seqs": [4]}, out_dir=str(tmp_path))
    data["tune"]["ray"] = {"address": "test", **ray}
    data["tune"]["accuracy"]["served_check"] = False
    from infertool.tune.context import Context

    r = validate_recipe_data(data)
    events: list = []
    ctx = Context(r, tmp_path / "tune", exhaustive=False, on_event=events.append, on_trial=None)
    return ctx, core.plan_search(r), events


def test_each_trial_runs_on_its_kind_and_the_cheaper_kind_wins(tmp_path, monkeypatch):
    fake = FakeRay([node("n-small", CPU=1.0, small=1.0), node("n-big", CPU=1.0, big=1.0)])
    monkeypatch.setitem(sys.modules, "ray", fake)
    ctx, plan, _ = two_kind_tune(tmp_path, [SMALL, BIG])
    records = executor.execute(ctx, plan, "ray", trial_fn=fake_trial)
    result = core.finish(ctx, plan.trials, records, 1.0, plan)
    by_kind = {t.machine.name: t for t in result.trials}
    for kind, nid in (("small", "n-small"), ("big", "n-big")):
        t = by_kind[kind]
        assert t.status == "done" and t.executor.node_id == nid and t.executor.resources[kind] == 1.0
        assert t.executor.kind == "ray" and t.executor.address == "test"
        price = {"small": 0.5, "big": 2.0}[kind]
        assert t.cost_per_1m_output_tokens == pytest.approx(price / (TOKENS_PER_S * 3600) * 1e6)
        assert t.objective == t.cost_per_1m_output_tokens
    # 0.5 $/h over 1,296,000 tokens an hour: 0.3858 $ per 1M; 2.0 $/h: 1.543
    assert result.winner.machine.name == "small"
    assert by_kind["big"].why_lost == "cost per 1M output tokens at the SLO: 1.543 $ vs the winner's 0.3858 $"
    doc = json.loads((ctx.dir / "tune.json").read_text())
    assert {t["machine"]["name"]: t["cost_per_1m_output_tokens"] for t in doc["trials"]} == \
        {"small": pytest.approx(0.38580, abs=1e-5), "big": pytest.approx(1.54321, abs=1e-5)}
    assert doc["space"]["machines"] == ["small", "big"]
    md = (ctx.dir / "tune.md").read_text()
    assert "| machine kind |" in md and "small ($0.5/h)" in md and "big ($2/h)" in md
    assert json.loads((ctx.dir / "trials" / by_kind["big"].id / "placed.json").read_text())["node_id"] == "n-big"


def test_a_kind_no_node_offers_is_skipped_and_never_submitted(tmp_path, monkeypatch):
    fake = FakeRay([node("n-small", CPU=1.0, small=1.0)])
    monkeypatch.setitem(sys.modules, "ray", fake)
    ctx, plan, events = two_kind_tune(tmp_path, [SMALL, BIG])
    records = {r.machine.name: r for r in executor.execute(ctx, plan, "ray", trial_fn=fake_trial)}
    assert records["small"].status == "done"
    assert records["big"].status == "skipped" and records["big"].reason.startswith(
        "not run: no live Ray node offers what machine kind 'big' needs (CPU 1, big 1)")
    assert [ref.opts.get("resources") for ref in fake.submitted] == [{"small": 1.0}]
    assert any("big" in e["message"] and e["level"] == "warning" for e in events)


def test_a_trial_ray_never_places_is_cancelled_and_skipped(tmp_path, monkeypatch):
    # the node offers the kind but never has it free (another tenant holds it): the wait is bounded
    busy = node("n-big", CPU=1.0, big=1.0)
    fake = FakeRay([busy])
    fake.free["n-big"]["big"] = 0.0
    monkeypatch.setitem(sys.modules, "ray", fake)
    monkeypatch.setattr(executor, "RAY_POLL_S", 0.05)
    ctx, plan, events = two_kind_tune(tmp_path, [BIG], placement_timeout_s=1)
    (rec,) = executor.execute(ctx, plan, "ray", trial_fn=fake_trial)
    assert rec.status == "skipped" and rec.reason == (
        "not run: Ray did not place it on a node of machine kind 'big' within tune.ray.placement_timeout_s (1 s); "
        "the cluster's nodes had not its resources free")
    assert fake.cancelled == fake.submitted and len(fake.submitted) == 1
    assert any("not placed within 1 s: cancelled" in e["message"] for e in events)


def test_the_executor_flag_is_the_recipes_executor(tmp_path):
    """`--executor ray` validates the recipe with it (two kinds need ray) and the dry run lists each trial's kind
    and its $/1M bound at the kind's price (the same roofline on both: no GPU named)."""
    p = write(tmp_path, quickstart([SMALL, BIG], "local", candidates=["none"], serve_grid={"max_num_seqs": [4]}))
    r = cli_in_process("tune", str(p), "--dry-run", "--json")
    assert r.returncode == 2 and "2 machine kinds need tune.executor: ray" in r.stderr
    r = cli_in_process("tune", str(p), "--executor", "ray", "--dry-run", "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["space"]["machines"] == ["small", "big"] and doc["space"]["trials"] == 2
    cost = {t["machine"]["name"]: t["prediction"]["cost_per_1m_output_tokens"] for t in doc["trials"]}
    assert cost["big"] == pytest.approx(4 * cost["small"])  # $2.00 against $0.50 an hour, the same bound
    r = cli_in_process("tune", str(p), "--executor", "ray", "--dry-run")
    assert r.returncode == 0 and "@ small" in r.stdout and "@ big" in r.stdout
