"""`tune --dry-run`'s price of a tune (issue 44, item 5): the planned vLLM starts, one per distinct serve
configuration with the stages that use it, and the wall-time estimate with its basis; the launcher's record of
measured start times; and benchmarks/tune_starts.py's pure parts (the traffic, the variants, the counting and the
ratios on stand-in tune directories). Nothing here starts vLLM."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from infertool.cli import app
from infertool.perf.calibration import Calibration, StepPoint
from infertool.recipe import validate_recipe_data
from infertool.serve import start_times
from infertool.tune import core, starts
from tests.test_tune import smol, tune_recipe  # noqa: F401 - smol: the fixture
from tests.test_tune_classes import classed_recipe

ROOT = Path(__file__).resolve().parents[1]
W8 = {"backend": "llmcompressor", "scheme": "W8A8", "bits": 8}
NGRAM = {"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_max": 4, "prompt_lookup_min": 2}


@pytest.fixture(autouse=True)
def _cwd(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)


def _plan(data: dict) -> tuple[object, list, starts.StartPlan]:
    r = validate_recipe_data(data)
    trials = core.plan_search(r).trials
    return r, trials, starts.plan_starts(r, trials)


def _server_of(plan: starts.StartPlan, use: str) -> starts.PlannedServer:
    (s,) = [s for s in plan.servers if use in s.used_by]
    return s


def test_the_reference_is_the_server_of_the_original_trial_at_the_recipes_settings(smol, tmp_path):
    """The recipe serves max_num_seqs 4 and the grid holds 4: the reference IS the original trial's capacity server,
    and a candidate's screening IS its capacity server at the recipe's settings: 4 starts for 4 trials, not 7."""
    data = tune_recipe(smol, tmp_path, candidates=["none", W8], serve_grid={"max_num_seqs": [2, 4]})
    data["serve"]["max_num_seqs"] = 4
    _, trials, plan = _plan(data)
    by = {(t.candidate.label, t.serve["max_num_seqs"]): t for t in trials}
    assert plan.starts == 4 == len(plan.servers) and plan.trials == 4 and plan.pruned == 0 and plan.upper_bound
    ref = _server_of(plan, "reference")
    assert ref.used_by == ["reference", f"capacity {by[('original', 4)].id}"] and ref.settings == {}
    assert ref.model == "original" and ref.why.startswith("the reference")
    w8 = _server_of(plan, "screen W8A8 (llmcompressor)")
    assert w8.used_by == ["screen W8A8 (llmcompressor)", f"capacity {by[('W8A8 (llmcompressor)', 4)].id}"]
    assert _server_of(plan, f"capacity {by[('original', 2)].id}").settings == {"max_num_seqs": 2}
    uses = [u for s in plan.servers for u in s.used_by if u.startswith("capacity")]
    assert sorted(uses) == sorted(f"capacity {t.id}" for t in trials)  # each trial probed on one server
    assert "screening may stop a candidate early" in plan.lines()[0] and "at most 4" in plan.lines()[0]


def test_a_speculative_screenings_lossless_server_is_another_trials(smol, tmp_path):
    """speculation off / n-gram on, for the original and W8A8: each speculative screening's lossless check serves
    the same settings without speculation, which is the reference (the original) or W8A8's own screening and
    capacity server: 4 starts, none of them for a lossless check alone."""
    data = tune_recipe(smol, tmp_path, candidates=["none", W8], serve_grid={"speculative": [None, NGRAM]})
    _, trials, plan = _plan(data)
    by = {(t.candidate.label, t.serve["speculative"] is not None): t for t in trials}
    assert plan.starts == 4
    ref = _server_of(plan, "reference")
    spec_label = by[("original", True)].screen_label
    w8_label = by[("W8A8 (llmcompressor)", True)].screen_label
    ngram = '{"method":"ngram","num_speculative_tokens":2,"prompt_lookup_max":4,"prompt_lookup_min":2}'
    assert spec_label == f"original with speculative={ngram}"  # unset fields left out
    assert ref.used_by == ["reference", f"lossless check of {spec_label} (without speculation)",
                           f"capacity {by[('original', False)].id}"]
    spec = _server_of(plan, f"screen {spec_label}")
    assert spec.used_by == [f"screen {spec_label}", f"capacity {by[('original', True)].id}"]
    assert list(spec.settings) == ["speculative"] and spec.settings["speculative"]["num_speculative_tokens"] == 2
    w8 = _server_of(plan, "screen W8A8 (llmcompressor)")
    assert f"lossless check of {w8_label} (without speculation)" in w8.used_by
    assert f"capacity {by[('W8A8 (llmcompressor)', False)].id}" in w8.used_by


def test_pruned_trials_start_nothing(smol, tmp_path):
    _, trials, plan = _plan(tune_recipe(smol, tmp_path, serve_grid={"max_model_len": [2048, 99999]}))
    assert plan.pruned == 3 and plan.trials == 3
    pruned = {t.id for t in trials if not t.prediction.fits}
    assert not [u for s in plan.servers for u in s.used_by if any(p in u for p in pruned)]


def _dry(path: Path, *args: str) -> dict:
    r = CliRunner().invoke(app, ["tune", str(path), "--dry-run", "--json", *args])
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)


def test_a_per_class_tune_plans_the_same_starts_as_the_plain_one(smol, tmp_path, tmp_home):
    """The classes are probed on the capacity servers the plain tune starts, and share its accuracy servers: the
    reference, W8A8's screening and 4 capacity servers either way."""
    per, plain = tmp_path / "per.yaml", tmp_path / "plain.yaml"
    for path, classes in ((per, True), (plain, None)):
        data = classed_recipe(smol, tmp_path, classes=classes)
        data["tune"]["serve_grid"] = {"max_num_seqs": [2, 4]}
        path.write_text(yaml.safe_dump(data))
    a, b = _dry(per)["starts"], _dry(plain)["starts"]
    assert a["starts"] == b["starts"] == 6
    assert [s["key"] for s in a["servers"]] == [s["key"] for s in b["servers"]]
    caps = [u for s in a["servers"] for u in s["used_by"] if u.startswith("capacity")]
    assert len(caps) == 2 * len([u for s in b["servers"] for u in s["used_by"] if u.startswith("capacity")])
    assert {u.rsplit(" ", 1)[-1] for u in caps} == {"(chat)", "(rag)"}
    assert any("every class (chat, rag) is probed on the same capacity servers" in n for n in a["notes"])


def test_the_json_carries_the_plan_and_the_estimate_states_its_basis(smol, tmp_path, tmp_home):
    """No start measured on this host, no calibration: the default range, said as not measured, and no upper
    bound (the probes cannot be estimated). Three measured starts of the model: their range, said as measured."""
    from infertool.resolve import resolve

    p = tmp_path / "r.yaml"
    data = tune_recipe(smol, tmp_path)
    p.write_text(yaml.safe_dump(data))
    got = _dry(p)["starts"]
    assert got["starts"] == len(got["servers"]) == 9 and got["upper_bound"] is True
    assert set(got["servers"][0]) >= {"key", "model", "settings", "used_by", "why"}
    est = got["estimate"]
    assert est["start_measured"] is False and "(not measured on this host)" in est["start_basis"]
    res = resolve(validate_recipe_data(data))
    lo, hi = starts.DEFAULT_START_S[res.host.accelerator]  # a GPU host's default differs
    assert est["start_s"] == [lo, hi] and est["low_s"] == 9 * lo and est["high_s"] is None
    assert len(est["uncalibrated"]) == 6 and est["calibrated"] == [] and est["probes_s"] == []
    assert any("without a calibration" in n and "infertool profile" in n for n in est["not_counted"])
    text = CliRunner().invoke(app, ["tune", str(p), "--dry-run"]).stdout
    flat = " ".join(text.split())
    assert "vLLM starts planned: at most 9" in flat and "estimated wall time: at least" in flat
    assert "(not measured on this host)" in flat and "capacity probes not estimated" in flat

    model = res.base.label
    for s in (60.0, 40.0, 50.0):
        assert start_times.note(model, None, s, host=start_times.host_label()) is not None
    start_times.note(model, None, 999.0, host="cpu: another host, 64 cores")  # not this host's
    est = _dry(p)["starts"]["estimate"]
    assert est["start_measured"] is True and est["start_s"] == [40.0, 60.0]
    assert est["start_basis"] == f"3 measured start(s) of {model} on this host: 40-60 s" and est["low_s"] == 9 * 40.0


def test_a_calibration_bounds_the_probes(smol, tmp_path):
    """Every capacity search calibrated: the range has a top, each search between min_runs runs at its faster end
    and max_probes x max_runs runs at its slower end of the calibrated model; one without: no top, and named."""
    r, trials, plan = _plan(tune_recipe(smol, tmp_path))
    cal = Calibration("k", [StepPoint(1, 0.02), StepPoint(4, 0.05)], prefill_per_token_s=0.001, prefill_fixed_s=0.05)
    for t in trials:
        t.prediction.calibration = "k"
    est = starts.estimate(plan, r, trials, times=[], host="h", model="m", accelerator="cpu",
                          calibration=lambda key: cal if key == "k" else None)
    t = trials[0]
    n, load = r.bench.requests, r.tune.load
    ends = [starts.run_seconds(cal, c, n, r.bench.prompt.len, r.bench.output_len, t.max_num_seqs)
            for c in (load.min_concurrency, t.max_num_seqs)]
    assert starts.probe_range(t, cal, n, r) == (load.repeats.min_runs * min(ends),
                                                 load.max_probes * load.repeats.max_runs * max(ends))
    assert ends[0] == pytest.approx(4 * (0.05 + 64 * 0.001 + 8 * 0.02))  # 4 requests, one at a time
    assert est.high_s is not None and est.low_s < est.high_s and len(est.calibrated) == 6 and not est.uncalibrated
    assert "by this host's calibration of the engine's step cost" in est.probe_basis
    trials[1].prediction.calibration = None
    est = starts.estimate(plan, r, trials, times=[], host="h", model="m", accelerator="cpu",
                          calibration=lambda key: cal)
    assert est.high_s is None and est.uncalibrated == [trials[1].id] and "at least" in est.text


def test_a_per_class_estimate_counts_one_search_of_the_mix_and_each_class_alone_once_per_speculative_setting(
        smol, tmp_path):
    """A per-class tune on local servers sends the whole traffic once per probe (every class read from it): one
    search a trial, not one a class; a speculative trial adds one run of each class alone at its top load. On Ray
    each class replays its own traffic: a search a class."""
    data = tune_recipe(smol, tmp_path)
    data["tune"]["serve_grid"] = {"max_num_seqs": [4], "speculative": [None, {"method": "ngram",
                                                                              "num_speculative_tokens": 2}]}
    r, trials, plan = _plan(data)
    cal = Calibration("k", [StepPoint(1, 0.02), StepPoint(4, 0.05)], prefill_per_token_s=0.001, prefill_fixed_s=0.05)
    for t in trials:
        t.prediction.calibration = "k"
    run = [t for t in trials if t.prediction.runs]
    est = starts.estimate(plan, r, trials, times=[], host="h", model="m", accelerator="cpu",
                          calibration=lambda key: cal, class_requests=[3, 1])
    n = r.bench.requests
    searches = [starts.probe_range(t, cal, n, r) for t in run]
    alone = sum(starts.run_seconds(cal, starts.load_top(t, r), k, r.bench.prompt.len, r.bench.output_len,
                                   t.max_num_seqs) for t in run if t.recipe.serve.speculative is not None for k in (3, 1))
    assert alone > 0 and est.probes_s == [round(sum(a for a, _ in searches) + alone, 1),
                                          round(sum(b for _, b in searches) + alone, 1)]
    assert "the whole traffic's" in est.probe_basis
    ray = r.model_copy(update={"tune": r.tune.model_copy(update={"executor": "ray"})})
    est = starts.estimate(plan, ray, trials, times=[], host="h", model="m", accelerator="cpu",
                          calibration=lambda key: cal, class_requests=[3, 1])
    per_class = [starts.probe_range(t, cal, k, ray) for t in run for k in (3, 1)]
    assert est.probes_s == [round(sum(a for a, _ in per_class), 1), round(sum(b for _, b in per_class), 1)]
    assert "each class's requests a probe (3, 1)" in est.probe_basis


def test_start_times_keep_the_latest_vllm_starts_only(tmp_path, monkeypatch):
    f = tmp_path / "starts.json"
    monkeypatch.setattr(start_times, "KEEP", 3)
    for i in range(5):
        start_times.note("m", "/p", 10.0 + i, file=f, host="h")
    assert [s.ready_s for s in start_times.read(f).starts] == [12.0, 13.0, 14.0]
    monkeypatch.setattr(start_times, "path", lambda: f)
    for stand_in in (["python", "fake_server.py", "--port", "1"],
                     ["python", "-c", "serve()", "vllm.entrypoints.openai.api_server"]):  # not vLLM
        start_times.note_launch(stand_in, "m", "/p", 1.0)
    assert len(start_times.read(f).starts) == 3
    start_times.note_launch(["python", "-m", "vllm.entrypoints.openai.api_server", "--enforce-eager"], "m", "/p", 2.0)
    last = start_times.read(f).starts[-1]
    assert last.ready_s == 2.0 and last.eager is True and last.host == start_times.host_label()
    f.write_text("{not json")
    assert start_times.read(f).starts == []
    from infertool.errors import UsageError

    def no_facts():
        raise UsageError("no host facts")

    monkeypatch.setattr(start_times, "host_label", no_facts)
    assert start_times.note("m", None, 3.0, file=f) is None  # never the launch's failure
    monkeypatch.setattr(start_times, "path", lambda: tmp_path / "file" / "under" / "a-file")
    (tmp_path / "file").write_text("x")
    assert start_times.note("m", None, 3.0, host="h") is None  # unwritable: said by None, not raised
    f.write_text(json.dumps({"v": 1, "starts": [{"model": "m", "host": "h", "ready_s": -1}, "x"]}))
    assert start_times.read(f).starts == []  # nonsense kept out


# ---------------------------------------------------------------------------------- benchmarks/tune_starts.py
@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("tune_starts", ROOT / "benchmarks" / "tune_starts.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules["tune_starts"] = mod  # its dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


def test_the_benchmarks_traffic_has_a_class_that_repeats_its_input_and_one_that_does_not(bench, tmp_path):
    counts = bench.write_traffic(tmp_path / "t.jsonl", 5, seed=1)
    assert counts == {"listcopy": 5, "story": 5}
    rows = [json.loads(x) for x in (tmp_path / "t.jsonl").read_text().splitlines()]
    for row in rows:
        ask, reply = (m["content"] for m in row["messages"])
        assert (reply in ask) == (row["class"] == "listcopy")
    assert rows == [json.loads(x) for x in bench.write_traffic(tmp_path / "u.jsonl", 5, seed=1) and
                    (tmp_path / "u.jsonl").read_text().splitlines()]  # seeded
    from infertool.bench.prompts import read_jsonl_classed

    assert {c for _, _, c in read_jsonl_classed(tmp_path / "t.jsonl")} == {"listcopy", "story"}


def test_the_benchmarks_variants_are_the_same_grid_three_ways(bench, tmp_path):
    args = bench.parse([])
    base = bench.base_recipe(args, tmp_path / "t.jsonl", 80)
    validate_recipe_data(base)
    per, plain, brute = bench.variants(base, ["listcopy", "story"], tmp_path)
    assert per.recipes[0]["tune"]["classes"] is True and "classes" not in plain.recipes[0]["tune"]
    # brute force: every setting x every class alone, each its own tune of one grid point replaying one class
    assert [r["bench"]["classes"]["replay"] for r in brute.recipes] == ["listcopy"] * 2 + ["story"] * 2
    assert brute.classes == ["listcopy"] * 2 + ["story"] * 2
    assert len({per.out, plain.out, brute.out}) == 3 and len({r["name"] for r in brute.recipes}) == 4
    assert [r["tune"]["serve_grid"]["speculative"] for r in brute.recipes[:2]] == [
        [s] for s in base["tune"]["serve_grid"]["speculative"]]
    for r in [*per.recipes, *plain.recipes]:
        assert r["tune"]["serve_grid"] == base["tune"]["serve_grid"] and validate_recipe_data(r)
    assert all(validate_recipe_data(r) for r in brute.recipes)
    assert base["tune"]["serve_grid"]["speculative"][0] is None and len(base["tune"]["serve_grid"]["speculative"]) == 2


def _log(path: Path, starts_n: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(f"# 2026-12-07T00:00:0{i}+00:00 infertool serve: python -m vllm ... --model m\nINFO up\n"
                            for i in range(starts_n)))


def test_the_benchmark_counts_starts_and_computes_ratios_and_agreement(bench, tmp_path):
    # per-class: tune.json's servers, a server the classes share counted once
    shared = {"key": "k1", "log": "/l/server-1.log", "started_by": "reference", "used_by": ["screen"]}
    for c, win in (("listcopy", "aaa"), ("story", "bbb")):
        d = tmp_path / "per" / bench.NAME / "classes" / c
        d.mkdir(parents=True)
        own = {"key": f"k-{c}", "log": f"/l/{c}.log", "started_by": f"capacity ({c})", "used_by": []}
        (d / "tune.json").write_text(json.dumps({"recipe": "r", "winner": win, "servers": [shared, own]}))
    assert bench.starts(tmp_path / "per") == (3, "tune.json servers")
    (tmp_path / "per" / bench.NAME / "routing.json").write_text(json.dumps({"recipe": "r", "servers": [
        shared, {"key": "k-mix", "log": "/l/mix.log", "started_by": "capacity (mix)", "used_by": []}]}))
    assert bench.starts(tmp_path / "per") == (4, "tune.json servers")
    assert bench.winners(tmp_path / "per", ["listcopy", "story"]) == {"listcopy": "aaa", "story": "bbb"}
    # plain: no servers in tune.json: the logs' header lines (a log started twice counts twice)
    d = tmp_path / "plain" / bench.NAME
    d.mkdir(parents=True)
    (d / "tune.json").write_text(json.dumps({"recipe": "r", "winner": "aaa"}))
    _log(d / ".stages" / "capacity" / "x" / "vllm.log", 2)
    _log(d / ".stages" / "screen" / "y" / "vllm.log", 1)
    (d / "notes.log").write_text("# not a start\n")
    assert bench.starts(tmp_path / "plain") == (3, "server log headers")
    assert bench.winners(tmp_path / "plain", ["listcopy", "story"]) == {"listcopy": "aaa", "story": "aaa"}

    O = bench.Outcome
    res = [O("per-class", 3, "x", 120.0, {"listcopy": "aaa", "story": "bbb"}),
           O("plain", 3, "x", 100.0, {"listcopy": "aaa", "story": "aaa"}),
           O("brute force", 6, "x", 300.0, {"listcopy": "aaa", "story": "bbb"})]
    s = bench.compare(res, ["listcopy", "story"])
    assert s["per_class_over_plain"] == {"wall": 1.2, "starts": 1.0, "goal": 1.5, "met": True}
    assert s["per_class_over_brute"] == {"wall": 0.4, "starts": 0.5, "goal": 0.5, "met": True}
    assert s["winners_agree"] is True
    res[2] = O("brute force", 6, "x", 200.0, {"listcopy": "aaa", "story": "ccc"})
    s = bench.compare(res, ["listcopy", "story"])
    assert s["per_class_over_brute"]["met"] is False and s["winners_agree"] is False
    assert s["winners"]["story"] == {"per_class": "bbb", "brute_force": "ccc", "agree": False}
    out = bench.table(res, s)
    assert "per-class / brute: wall 0.60 (goal <= 0.5: MISSED)" in out and "winners agree" in out and "no;" in out
    assert json.loads(json.dumps([o.to_dict() for o in res]))[0]["starts"] == 3
    assert bench.planned_starts({"starts": {"starts": 6, "servers": []}}) == 6 and bench.planned_starts({}) is None


def test_brute_force_takes_each_class_s_cheapest_setting(bench, tmp_path):
    """Brute force tunes each setting x class alone: a class's winner is tune's decision over its settings' winners
    (here no interval: the cheapest)."""
    args = bench.parse([])
    base = bench.base_recipe(args, tmp_path / "t.jsonl", 80)
    v = bench.variants(base, ["listcopy", "story"], tmp_path)[2]
    costs = {"listcopy": [("aaa", 4.0), ("bbb", 3.0)], "story": [("aaa", 2.0), (None, None)]}
    for r, c in zip(v.recipes, v.classes):
        win, cost = costs[c].pop(0)
        d = v.out / r["name"]
        d.mkdir(parents=True)
        trials = [{"id": win, "objective": cost, "status": "done", "verdict": "PASS",
                   "accuracy": {"verdict": "PASS"}, "capacity": {"max_load": 4}}] if win else []
        (d / "tune.json").write_text(json.dumps({"recipe": r["name"], "winner": win, "trials": trials}))
    o = bench.outcome(v, 10.0, ["listcopy", "story"], [0, 0, 0, 0])
    assert o.winners == {"listcopy": "bbb", "story": "aaa"}
