"""tune's search space is counted from its axis lengths and read by index, never listed (issue 25, finding 3: a
16^3 grid took 88 MB, 32^3 55 s and 395 MB, a schema-valid 64^4 x 4 grid 18.5 GB, whatever max_trials said).

The issue's grids go through the real CLI (`infertool tune RECIPE --dry-run`, a recipe written from the shipped
quickstart-tune): the large ones list their size and first trials, the one beyond a million trials is refused
with exit 2, its size and its axes; the shipped recipe and a grid small enough to plan whole list the same trials
as main did (main's enumeration is rebuilt here from the space's own pieces). That nothing is materialised is
asserted on the enumerator (a 10^12-point grid answering its size, its first and last points) and by counting
the trials built, never by memory or time."""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from infertool.data.fingerprint import digest
from infertool.errors import UsageError
from infertool.recipe import recipe_to_dict, validate_recipe_data
from infertool.tune import core, executor, space
from tests.conftest import ROOT, run_cli

# the shipped recipe's trial ids on main (2f60529): a digest of the candidate's quantize section and the grid
# point, the same on every host
QUICKSTART_IDS = {"057207103a7b", "199499cc259b", "322c28ecd044", "3a2f07986292", "47423fad2dfb", "bba4b2157dc4"}
W8A8 = {"backend": "llmcompressor", "scheme": "W8A8", "bits": 8}


def quickstart(**grid) -> dict:
    """The shipped quickstart-tune recipe's data, its serving grid replaced by ``grid`` when given."""
    data = yaml.safe_load((ROOT / "recipes" / "quickstart-tune.yaml").read_text())
    if grid:
        data["tune"]["serve_grid"] = grid
    return data


def cube(n: int) -> dict:
    """The issue's n^3 grid: n values of max_num_seqs, max_num_batched_tokens and max_model_len."""
    return {"max_num_seqs": list(range(1, n + 1)), "max_num_batched_tokens": list(range(1000, 1000 + n)),
            "max_model_len": list(range(512, 512 + n))}


def hypercube_x4() -> dict:
    """The issue's schema-valid 64^4 x 4: four axes of 64 values, four candidates: 67,108,864 trials."""
    data = quickstart(**cube(64), gpu_memory_utilization=[round(0.3 + i / 100, 2) for i in range(64)])
    data["tune"]["candidates"] = ["none", W8A8, {"bits": 4, "group_size": 64}, {"bits": 8}]
    return data


def write(tmp_path: Path, data: dict) -> Path:
    p = tmp_path / "recipe.yaml"
    p.write_text(yaml.safe_dump(data, sort_keys=False))
    return p


def main_enumeration(recipe) -> list[dict]:
    """What main's dry run listed: every candidate x every point of ``itertools.product`` over the grid, each
    predicted, most promising first (main's space.trials + core.plan_trials, rebuilt from the same pieces)."""
    grid = {k: v for k, v in recipe.tune.serve_grid.model_dump().items() if v is not None}
    points = [dict(zip(grid, values)) for values in itertools.product(*grid.values())] if grid else [{}]
    trials = [space.Trial(digest({"candidate": c.key, "serve": p})[:12], c, p, space.trial_recipe(recipe, c, p),
                          scoring=space.scoring_point(recipe, p))  # its output-changing settings (issue 22.5)
              for c in space.candidates(recipe) for p in points]
    return [t.to_dict() for t in core._order([core.predicted(t) for t in trials], recipe.tune.objective)]


# --------------------------------------------------------------------------------------------- the enumerator
def test_a_trillion_point_grid_answers_its_size_and_points_without_listing_them():
    axes = tuple((f"axis{i}", tuple(range(100))) for i in range(6))
    g = space.Grid(axes)
    assert g.size == 10**12
    first = list(itertools.islice(g, 3))
    assert first == [{**{f"axis{i}": 0 for i in range(5)}, "axis5": v} for v in (0, 1, 2)]
    assert g.point(0) == first[0] and g.point(2) == first[2]
    assert g.point(10**12 - 1) == {f"axis{i}": 99 for i in range(6)}
    assert g.point(123_456_789_012) == {"axis0": 12, "axis1": 34, "axis2": 56, "axis3": 78, "axis4": 90, "axis5": 12}
    assert g.index({"axis0": 12, "axis1": 34, "axis2": 56, "axis3": 78, "axis4": 90, "axis5": 12}) == 123_456_789_012
    with pytest.raises(IndexError):
        g.point(10**12)
    # two candidates over it: 2 x 10^12 trials, a seeded sample of indices drawn without listing them
    cands = [space.Candidate(0, None, "original", "a"), space.Candidate(1, {"bits": 4}, "b", "b")]
    sp = space.Space(None, cands, g)
    assert sp.size == 2 * 10**12 and sp.index(1, {f"axis{i}": 0 for i in range(6)}) == 10**12
    s = sp.sample(5, seed=0)
    assert s == sorted(set(s)) and len(s) == 5 and all(0 <= i < sp.size for i in s)
    assert sp.sample(5, seed=0) == s and sp.sample(5, seed=1) != s
    assert space.Space(None, cands, space.Grid((("a", (1, 2)),))).sample(5, seed=0) == [0, 1, 2, 3]  # all of it


def test_points_by_index_follow_the_product_order():
    axes = (("max_num_seqs", (4, 8)), ("speculative", (None, {"method": "ngram"}, {"method": "eagle"})),
            ("enforce_eager", (False, True)))
    g = space.Grid(axes)
    keys = [k for k, _ in axes]
    product = [dict(zip(keys, v)) for v in itertools.product(*(v for _, v in axes))]
    assert g.size == 12 and list(g) == product and [g.point(i) for i in range(12)] == product
    for i, p in enumerate(product):
        assert g.index({k: [json.dumps(x) for x in dict(axes)[k]].index(json.dumps(p[k])) for k in keys}) == i
    assert space.Grid(()).size == 1 and list(space.Grid(())) == [{}] and space.Grid(()).point(0) == {}


def test_a_space_beyond_the_limit_is_refused_before_anything_is_built(monkeypatch):
    def boom(*a, **k):
        raise AssertionError("the space was built")

    monkeypatch.setattr(space.Space, "trial", boom)
    monkeypatch.setattr(space, "trial_recipe", boom)
    monkeypatch.setattr(itertools, "product", boom)
    r = validate_recipe_data(hypercube_x4())
    with pytest.raises(UsageError) as e:
        core.plan_search(r)
    assert "67,108,864 trials (4 candidates x 16,777,216 serving settings" in e.value.message
    assert e.value.exit_code == 2 and f"{space.MAX_SPACE:,}" in e.value.message


def test_a_large_space_is_planned_on_a_seeded_sample(monkeypatch):
    monkeypatch.setattr(space, "PLAN_SAMPLE", 128)  # the same rule on a smaller sample (each plan is ~3 ms a trial)
    built: list[int] = []
    trial = space.Space.trial
    monkeypatch.setattr(space.Space, "trial", lambda self, i: built.append(i) or trial(self, i))
    r = validate_recipe_data(quickstart(**cube(16)))  # 3 candidates x 4,096 settings
    plan = core.plan_search(r)
    assert plan.space.size == 12_288 and plan.sampled and len(plan.trials) == space.PLAN_SAMPLE
    assert len(built) == space.PLAN_SAMPLE  # the sample, nothing else of the space
    assert sorted(built) == plan.space.sample(space.PLAN_SAMPLE, r.tune.seed)
    for t in plan.trials[:20]:
        assert t.id == digest({"candidate": t.candidate.key, "serve": t.serve})[:12]
        assert t.recipe.serve.max_num_seqs == t.serve["max_num_seqs"] and t.recipe.tune is None
    again = core.plan_search(r)
    assert [t.id for t in again.trials] == [t.id for t in plan.trials]  # the same seed, the same plan
    other = core.plan_search(validate_recipe_data({**quickstart(**cube(16)), "tune": {**r.tune.model_dump(
        mode="json", exclude_none=True), "seed": 1}}))
    assert {t.id for t in other.trials} != {t.id for t in plan.trials}
    # max_trials above the sample size: that many planned
    big = quickstart(**cube(16))
    big["tune"]["max_trials"] = 200
    assert len(core.plan_search(validate_recipe_data(big)).trials) == 200


def test_tpe_picks_over_the_whole_space_by_index(monkeypatch):
    pytest.importorskip("optuna")
    monkeypatch.setattr(space, "PLAN_SAMPLE", 128)  # the same rule on a smaller sample
    data = quickstart(**cube(32))  # 98,304 trials; 128 planned
    data["tune"].update(sampler="tpe", max_trials=3)
    r = validate_recipe_data(data)
    picks = []
    for _ in range(2):
        plan = core.plan_search(r)
        chosen = executor._select(SimpleNamespace(exhaustive=False, tune=r.tune), plan)
        assert len(chosen) == 3 and len({t.id for t in chosen}) == 3 and all(t.prediction.fits for t in chosen)
        for t in chosen:
            assert plan.space.trial(t.index).id == t.id
        assert len(plan.built) <= space.PLAN_SAMPLE + 20 * 3  # the asks, each planned when asked
        picks.append([t.id for t in chosen])
    assert picks[0] == picks[1]  # tune.seed: the same picks


def test_exhaustive_is_refused_on_a_sampled_space(tmp_path):
    from infertool.tune.run import run_tune

    data = quickstart(**cube(16))
    data["tune"]["out_dir"] = str(tmp_path / "tune")
    with pytest.raises(UsageError, match="--exhaustive runs every trial, and this search space is 12,288 trials"):
        run_tune(validate_recipe_data(data), exhaustive=True)
    assert not (tmp_path / "tune").exists()


def test_a_ray_worker_rebuilds_its_trial_from_its_index(tmp_path, monkeypatch):
    monkeypatch.setattr(space, "PLAN_SAMPLE", 128)  # the same rule on a smaller sample
    monkeypatch.setattr(core, "run_trial", lambda ctx, trial: trial)
    r = validate_recipe_data(quickstart(**cube(16)))
    t = core.plan_search(r).trials[7]
    got = executor._remote_trial(recipe_to_dict(r), str(tmp_path), False, t.index, t.id)
    assert (got.id, got.serve, got.candidate.key) == (t.id, t.serve, t.candidate.key)
    assert got.prediction.to_dict() == t.prediction.to_dict()
    with pytest.raises(UsageError, match="is not trial"):
        executor._remote_trial(recipe_to_dict(r), str(tmp_path), False, t.index + 1, t.id)


def test_a_value_listed_twice_on_an_axis_is_refused():
    with pytest.raises(UsageError, match=r"tune.serve_grid.max_num_seqs lists 4 twice"):
        core.plan_search(validate_recipe_data(quickstart(max_num_seqs=[4, 8, 4])))


# --------------------------------------------------------------------------------------------- the real CLI
def test_the_shipped_recipe_lists_the_same_trials_as_before(tmp_home):
    r = run_cli("tune", "quickstart-tune", "--dry-run", "--json", timeout=300)
    assert r.returncode == 0, r.stderr
    plan = json.loads(r.stdout)
    from infertool.recipe import load_recipe

    assert plan["trials"] == main_enumeration(load_recipe("quickstart-tune"))
    assert {t["id"] for t in plan["trials"]} == QUICKSTART_IDS
    assert plan["grid"] == [{"max_num_seqs": 4}, {"max_num_seqs": 8}] and plan["pruned"] == []
    assert plan["space"] == {"trials": 6, "candidates": 3, "serving_settings": 2, "axes": {"max_num_seqs": 2},
                             "planned": 6, "sampled": False, "shown": 6, "sampler": "grid", "pruned_planned": 0,
                             "max_trials": 6}
    table = run_cli("tune", "quickstart-tune", "--dry-run", timeout=300)
    assert table.returncode == 0 and "6 trials, most promising first" in table.stdout
    assert "search space:" not in table.stdout  # every trial is listed: nothing to count


def test_a_grid_planned_whole_lists_the_same_trials_as_before(tmp_path, tmp_home):
    data = quickstart(max_num_seqs=list(range(1, 17)), enforce_eager=[True, False])  # 3 x 32 = 96 trials
    r = run_cli("tune", str(write(tmp_path, data)), "--dry-run", "--json", timeout=300)
    assert r.returncode == 0, r.stderr
    plan = json.loads(r.stdout)
    assert plan["trials"] == main_enumeration(validate_recipe_data(data))
    assert plan["space"]["trials"] == 96 and not plan["space"]["sampled"] and plan["space"]["sampler"] == "tpe"


@pytest.mark.parametrize("n", [16, 32])
def test_the_issues_cubes_show_their_size_and_first_trials(n, tmp_path, tmp_home):
    recipe = write(tmp_path, quickstart(**cube(n)))
    r = run_cli("tune", str(recipe), "--dry-run", "--json", timeout=300)
    assert r.returncode == 0, r.stderr
    plan = json.loads(r.stdout)
    sp = plan["space"]
    assert sp == {"trials": 3 * n**3, "candidates": 3, "serving_settings": n**3,
                  "axes": {"max_model_len": n, "max_num_seqs": n, "max_num_batched_tokens": n},
                  "planned": space.PLAN_SAMPLE, "sampled": True, "shown": core.DRY_RUN_SHOWN, "sampler": "tpe",
                  "pruned_planned": sp["pruned_planned"], "max_trials": 6}
    assert len(plan["trials"]) == core.DRY_RUN_SHOWN == len({t["id"] for t in plan["trials"]})
    assert len(plan["grid"]) == core.DRY_RUN_SHOWN and plan["grid"][1] == {"max_model_len": 512, "max_num_seqs": 1,
                                                                            "max_num_batched_tokens": 1001}
    for t in plan["trials"]:
        assert 1 <= t["serve"]["max_num_seqs"] <= n and 512 <= t["serve"]["max_model_len"] < 512 + n
    table = run_cli("tune", str(recipe), "--dry-run", timeout=300)
    assert table.returncode == 0, table.stderr
    assert f"the first 100 of {space.PLAN_SAMPLE:,} planned trials" in " ".join(table.stdout.split())
    assert (f"search space: {3 * n**3:,} trials (3 candidates x {n**3:,} serving settings: max_model_len {n} x "
            f"max_num_seqs {n} x max_num_batched_tokens {n}); {space.PLAN_SAMPLE:,} planned (a sample drawn with "
            "tune.seed)") in " ".join(table.stdout.split())


def test_the_issues_64_to_the_4_by_4_grid_is_refused_with_its_size_and_axes(tmp_path, tmp_home):
    recipe = write(tmp_path, hypercube_x4())
    r = run_cli("tune", str(recipe), "--dry-run", timeout=300)
    assert r.returncode == 2, r.stdout + r.stderr
    msg = " ".join(r.stderr.split())
    assert ("tune's search space is 67,108,864 trials (4 candidates x 16,777,216 serving settings: max_model_len 64 "
            "x max_num_seqs 64 x max_num_batched_tokens 64 x gpu_memory_utilization 64), more than the 1,000,000 "
            "one tune searches") in msg
    assert "Traceback" not in r.stderr and "internal error" not in msg
    j = run_cli("tune", str(recipe), "--dry-run", "--json", timeout=300)
    assert j.returncode == 2 and json.loads(j.stdout)["error"] == "UsageError"
    run = run_cli("tune", str(recipe), "--json", timeout=300)  # tune itself: refused before any trial
    assert run.returncode == 2 and "67,108,864 trials" in json.loads(run.stdout)["message"]
    check = run_cli("validate", str(recipe), timeout=300)  # and validate says so, like every recipe error
    assert check.returncode == 2 and "67,108,864 trials" in " ".join(check.stderr.split()), check.stderr


def test_a_load_range_with_no_concurrency_in_it_is_refused(tmp_path, tmp_home):
    data = quickstart()
    data["tune"]["load"].update(min_concurrency=16, max_concurrency=4)
    r = run_cli("tune", str(write(tmp_path, data)), "--dry-run", timeout=300)
    assert r.returncode == 2 and "tune.load.min_concurrency (16) is above tune.load.max_concurrency (4)" in r.stderr


# --------------------------------------------------------------------------------------------- a tune's records
class AnyLoad(dict):
    """Stand-in capacity for every (candidate, max_num_seqs): load 2 at $5 per 1M output tokens."""

    def __missing__(self, key):
        return (2, 5.0)


def test_a_tune_of_a_sampled_space_records_what_ran_and_says_the_size(tmp_path, monkeypatch):
    from tests.fakes import layout_model
    from tests.test_tune import Stand, tune_recipe

    from infertool.tune.run import run_tune

    monkeypatch.setattr(space, "PLAN_SAMPLE", 128)  # the same rule on a smaller sample (planned twice below)
    model = layout_model(tmp_path / "m" / "smollm2", "smollm2-135m", shards=1)
    grid = {"max_num_seqs": list(range(1, 33)), "max_num_batched_tokens": list(range(1000, 1032))}
    r = validate_recipe_data(tune_recipe(model, tmp_path, serve_grid=grid, sampler="grid", max_trials=2))
    stand = Stand(monkeypatch, verdicts={"W8A8 (llmcompressor)": "PASS", "GPTQ 4-bit g32 (gptqmodel)": "PASS"},
                  loads=AnyLoad(), served={})
    planned = core.plan_search(r).trials
    res = run_tune(r)
    assert [t.id for t in res.trials] == [t.id for t in planned[:2]]  # the two most promising of the sample, only
    assert sum(c.startswith("capacity:") for c in stand.calls) == 2
    assert any("the search space is 3,072 trials (3 candidates x 1,024 serving settings" in n for n in res.notes)
    doc = json.loads((Path(res.tune_dir) / "tune.json").read_text())
    assert len(doc["trials"]) == 2 and doc["space"] == {
        "trials": 3072, "candidates": 3, "serving_settings": 1024,
        "axes": {"max_num_seqs": 32, "max_num_batched_tokens": 32}, "planned": space.PLAN_SAMPLE, "sampled": True,
        "sampler": "grid", "max_trials": 2}
    md = " ".join((Path(res.tune_dir) / "tune.md").read_text().split())
    assert ("Search space: 3,072 trials, 128 planned (a sample drawn with tune.seed), the trials run chosen by the "
            "grid sampler") in md
    # a tune.json written by hand (or by an older version): its space is said only when it reads as one
    from infertool.tune.records import TuneDoc
    from infertool.tune.report import trial_rows, _summary

    for crafted in ({"sampled": True, "trials": "many", "planned": None}, ["x"], None):
        lines = _summary(TuneDoc.from_dict({**doc, "space": crafted}))
        assert not any(x.startswith("Search space") for x in lines)
        assert trial_rows(TuneDoc.from_dict({**doc, "space": crafted}))
