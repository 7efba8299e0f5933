"""tune weighs machine kinds with a GPU by the performance model before any trial runs (issue 42, item 4): a trial
whose 95 % interval cannot beat the same configuration on another kind is pruned (never submitted to a node of its
kind), with a reason naming both intervals, in tune.json and the report; the decision names the measurement that
would narrow the choice most; kinds without a GPU keep today's behaviour. The executor is the stand-in for Ray of
tests/test_tune_kinds.py (no cluster, no vLLM); the model is the real one, fitted from the shipped store."""

from __future__ import annotations

import json
import sys

import pytest

from infertool.recipe import validate_recipe_data
from infertool.tune import core, executor, space
from tests.test_tune_kinds import FakeRay, fake_trial, node, quickstart, two_kind_tune

# one L4 at a price no cloud asks against an H100 at a bargain: the model's intervals cannot overlap
L4 = {"name": "l4", "price_per_hour": 500.0, "gpu": "L4"}
H100 = {"name": "h100", "price_per_hour": 0.5, "gpu": "H100-SXM"}
GPU_NODES = [node("n-l4", CPU=1.0, GPU=1.0, **{"accelerator_type:L4": 1.0}),
             node("n-h100", CPU=1.0, GPU=1.0, **{"accelerator_type:H100": 1.0})]


def test_a_kind_that_cannot_win_is_pruned_before_it_is_rented(tmp_path, monkeypatch):
    fake = FakeRay(GPU_NODES)
    monkeypatch.setitem(sys.modules, "ray", fake)
    ctx, plan, events = two_kind_tune(tmp_path, [L4, H100])
    kinds = {k.name: k for k in plan.kinds.kinds}
    assert not kinds["l4"].in_play and kinds["h100"].in_play
    assert kinds["l4"].best.lo95 > kinds["h100"].best.hi95  # its best case is worse than the other's worst
    on_l4 = next(t for t in plan.trials if t.machine.name == "l4")
    why = on_l4.prediction.cannot_win
    assert why.startswith("cannot win: predicted $ per 1M output tokens on l4 (L4)")
    assert kinds["l4"].best.text in why and kinds["h100"].best.text in why  # both intervals named
    assert plan.kinds.narrowing.startswith("bench on ")  # the measurement that would narrow the choice most

    records = executor.execute(ctx, plan, "ray", trial_fn=fake_trial)
    result = core.finish(ctx, plan.trials, records, 1.0, plan)
    by_kind = {t.machine.name: t for t in result.trials}
    assert by_kind["l4"].status == "pruned" and by_kind["l4"].reason == why
    assert by_kind["h100"].status == "done" and result.winner.machine.name == "h100"
    # never submitted to a node of its kind
    assert [r.opts.get("accelerator_type") for r in fake.submitted] == ["H100"]
    assert any(e["message"].startswith(on_l4.label + ": cannot win") for e in events)
    doc = json.loads((ctx.dir / "tune.json").read_text())
    assert [k["name"] for k in doc["kinds"]["kinds"] if not k["in_play"]] == ["l4"]
    assert doc["decision"]["narrowing"] == plan.kinds.narrowing
    h100 = next(t for t in doc["trials"] if t["machine"]["name"] == "h100")
    model = h100["prediction"]["model"]
    assert model["gpu"] == "H100-SXM" and model["usd_per_mtok"]["lo95"] <= model["usd_per_mtok"]["hi95"]
    md = (ctx.dir / "tune.md").read_text()
    assert "## Machine kinds, predicted" in md and "no: pruned" in md and plan.kinds.narrowing in md
    assert "## Predicted vs measured" in md  # the h100 trial was measured: its $/1M beside the model's interval


def test_kinds_without_a_gpu_keep_todays_behaviour(tmp_path, monkeypatch):
    from tests.test_tune_kinds import BIG, SMALL

    monkeypatch.setitem(sys.modules, "ray", FakeRay([node("n-small", CPU=1.0, small=1.0),
                                                     node("n-big", CPU=1.0, big=1.0)]))
    ctx, plan, _ = two_kind_tune(tmp_path, [SMALL, BIG])
    assert plan.kinds is None and all(t.prediction.model is None for t in plan.trials)
    records = executor.execute(ctx, plan, "ray", trial_fn=fake_trial)
    core.finish(ctx, plan.trials, records, 1.0, plan)
    doc = json.loads((ctx.dir / "tune.json").read_text())
    assert "kinds" not in doc and "narrowing" not in doc["decision"]
    assert all("model" not in t["prediction"] for t in doc["trials"])


def test_kinds_whose_intervals_overlap_are_both_kept(tmp_path):
    """The same GPU at the same price on two kinds: neither can be ruled out, both stay in play."""
    twin = {**H100, "name": "h100-b"}
    r = validate_recipe_data(quickstart([H100, twin], candidates=["none"], serve_grid={"max_num_seqs": [4]}))
    plan = core.plan_search(r)
    assert all(k.in_play for k in plan.kinds.kinds) and not any(t.prediction.cannot_win for t in plan.trials)
    a, b = (t.prediction.model for t in plan.trials)
    assert a.usd_per_mtok.value == pytest.approx(b.usd_per_mtok.value)


def test_the_dry_run_lists_the_pruned_kind_with_its_reason(tmp_path):
    from tests.conftest import cli_in_process
    from tests.test_tune_kinds import write

    p = write(tmp_path, quickstart([L4, H100], candidates=["none"], serve_grid={"max_num_seqs": [4]}))
    r = cli_in_process("tune", str(p), "--dry-run", "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    pruned = [t for t in doc["trials"] if t["id"] in doc["pruned"]]
    assert [t["machine"]["name"] for t in pruned] == ["l4"]
    assert pruned[0]["prediction"]["cannot_win"].startswith("cannot win")
    assert doc["kinds"]["narrowing"].startswith("bench on ")
    assert space.search_space(validate_recipe_data(quickstart([L4, H100]))).kinds == 2


def test_a_kind_measured_cheaper_rules_out_a_kind_still_in_play_before_it_is_rented(tmp_path, monkeypatch):
    """No GPU kind can be ruled out at plan time against a CPU kind (the model does not predict it), but once the
    CPU kind is measured, the L4 kind's predicted best case is above that measured cost: it is never submitted."""
    from tests.test_tune_kinds import SMALL

    fake = FakeRay([node("n-small", CPU=1.0, small=1.0), *GPU_NODES])
    monkeypatch.setitem(sys.modules, "ray", fake)
    dear_l4 = {**L4, "price_per_hour": 200.0}
    ctx, plan, events = two_kind_tune(tmp_path, [SMALL, dear_l4], max_concurrent_trials=1)
    assert all(k.in_play for k in plan.kinds.kinds)  # nothing pruned before anything runs
    assert [t.machine.name for t in plan.trials] == ["small", "l4"]  # the roofline's order: small first
    records = {r.machine.name: r for r in executor.execute(ctx, plan, "ray", trial_fn=fake_trial)}
    assert records["small"].status == "done"
    why = records["l4"].reason
    assert records["l4"].status == "pruned" and why.startswith("cannot win: predicted $ per 1M output tokens on l4")
    assert f"what trial {records['small'].id} on small was measured to cost" in why
    assert [r.opts.get("resources") for r in fake.submitted] == [{"small": 1.0}]  # the L4 node never asked for
