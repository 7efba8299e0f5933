"""tune's accuracy evidence (issue 21.5, issue 22.5): the as-served phases (lm-eval tasks, the decode path) in the
reference, the screening rounds and the served check; serve settings that can change outputs screened as served per
setting (``accuracy.scored_with``); the tables and report that show them.

The real reference and screen stage bodies run here (the one registry, the real stage cache, the real gates); only
the server is a stand-in (``launch_scored`` hands the stage a scorer of hand-made numbers) and the phase is a small
fake of the protocol (infertool.evaluate.phases), so rounds, windows, joins and gates are checked by hand."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from infertool.evaluate.verdict import Gate
from infertool.recipe import validate_recipe_data
from infertool.tune import space
from infertool.tune import stages as tstages
from infertool.tune.records import Judgement, ScreenResult, TrialRecord, TuneDoc
from tests.test_tune import _cwd, smol  # noqa: F401  (the same fixtures: a working directory, the laid-out model)

TOKENS = 300  # per perplexity window: enough that an exact agreement passes top-1 at the screening's confidence


def recipe(model: Path, tmp_path: Path, *, candidates=("none",), grid=None, rounds=(2, 4, 8), **extra) -> dict:
    data = {
        "name": "t",
        "model": {"source": str(model)},
        "quantize": {"method": "gptq", "bits": 4, "group_size": 64},
        "eval": {"accept": {"preset": "standard"}},
        "serve": {"max_model_len": 2048, "cpu": {"kv_cache_space_gib": 1}, "enforce_eager": True},
        "bench": {"requests": 4, "prompt": {"len": 64}, "output_len": 8, "slo": {"ttft_ms": 1000}, "cost_per_hour": 1.0},
        "tune": {"candidates": list(candidates), "serve_grid": grid or {"enforce_eager": [True, False]},
                 "out_dir": str(tmp_path / "tune"), "accuracy": {"rounds": list(rounds)}},
    }
    data.update(extra)
    return data


# ------------------------------------------------------------------------------------------ pure
def test_every_output_setting_is_a_tunable_serve_field_with_a_reason():
    from infertool.recipe import ServeGrid, ServeSection

    assert set(space.OUTPUT_SETTINGS) <= set(ServeSection.model_fields) & set(ServeGrid.model_fields)
    assert all(len(why) > 20 for why in space.OUTPUT_SETTINGS.values())
    # settings that shape load, memory and scheduling share their candidate's screening
    assert not {"max_num_seqs", "max_num_batched_tokens", "enable_prefix_caching", "enable_chunked_prefill",
                "gpu_memory_utilization"} & set(space.OUTPUT_SETTINGS)


def test_a_trial_that_changes_an_output_setting_is_screened_on_its_own(smol, tmp_path):
    r = validate_recipe_data(recipe(smol, tmp_path, candidates=["none", {"bits": 8}],
                                    grid={"enforce_eager": [True, False], "max_num_seqs": [2, 4],
                                          "kv_cache_dtype": ["auto"]}))
    by = {(t.candidate.label.split()[0], t.serve["enforce_eager"], t.serve["max_num_seqs"]): t for t in space.trials(r)}
    assert len(by) == 8
    eager = by[("original", True, 2)]
    assert eager.scoring == {} and not eager.own_screening  # the recipe's own value (true), kv_cache_dtype its default
    assert eager.screening().to_dict() == {"own": False, "settings": {},
                                 "shares": "the reference itself, at the recipe's serve settings"}
    compiled = by[("original", False, 4)]
    assert compiled.scoring == {"enforce_eager": False} and compiled.own_screening
    assert compiled.screening().own is True and "CUDA graphs" in (compiled.screening().why or "")
    assert compiled.to_dict()["screening"]["settings"] == {"enforce_eager": False}
    assert by[("GPTQ", True, 4)].scoring == {} and by[("GPTQ", False, 2)].scoring == {"enforce_eager": False}
    # the screen stage's recipe: the candidate at the recipe's settings, the output-changing ones over them
    from infertool.tune.context import Context

    ctx = Context(r, tmp_path / "tune", exhaustive=False, on_event=None, on_trial=None)
    assert tstages.screen_recipe(ctx, by[("GPTQ", True, 2)]) is tstages.screen_recipe(ctx, by[("GPTQ", True, 4)])
    own = tstages.screen_recipe(ctx, by[("GPTQ", False, 2)])
    assert own is tstages.screen_recipe(ctx, by[("GPTQ", False, 4)])  # one screening per output configuration
    assert own.serve.enforce_eager is False and own.serve.max_num_seqs is None and own.quantize.bits == 8
    assert not tstages.screen_wanted(eager) and tstages.screen_wanted(compiled) and tstages.screen_wanted(by[("GPTQ", True, 2)])


def test_dry_run_lists_which_trials_get_their_own_screening(smol, tmp_path):
    from typer.testing import CliRunner

    from infertool.cli import app

    p = tmp_path / "r.yaml"
    p.write_text(yaml.safe_dump(recipe(smol, tmp_path)))
    r = CliRunner().invoke(app, ["tune", str(p), "--dry-run", "--json"])
    assert r.exit_code == 0, r.output
    got = {t["serve"]["enforce_eager"]: t["screening"] for t in json.loads(r.stdout)["trials"]}
    assert got[False] == {"own": True, "settings": {"enforce_eager": False}, "why": "enforce_eager: "
                          + space.OUTPUT_SETTINGS["enforce_eager"]}
    assert got[True]["own"] is False and got[True]["shares"].startswith("the reference itself")
    r = CliRunner().invoke(app, ["tune", str(p), "--dry-run"])
    assert r.exit_code == 0, r.output
    own = next(t["id"] for t in json.loads(CliRunner().invoke(app, ["tune", str(p), "--dry-run", "--json"]).stdout)["trials"]
               if t["serve"]["enforce_eager"] is False)
    assert (f"accuracy screened as served on their own (1 of 2, serve settings that change outputs): {own} "
            "(enforce_eager=false); the others share") in " ".join(r.stdout.split())


def test_gates_are_decided_only_when_every_measured_one_is():
    g = lambda *s: [Gate.from_dict({"name": f"g{i}", "status": x}) for i, x in enumerate(s)]  # noqa: E731
    assert tstages.gates_decided(g("PASS", "FAIL", "n/a"))
    assert not tstages.gates_decided(g("FAIL", "INCONCLUSIVE"))  # a FAIL verdict, an open gate: not decided
    assert not tstages.gates_decided(g("n/a")) and not tstages.gates_decided([])


def test_phase_windows_join_cumulatively():
    a = {"prompts": [{"id": "p0"}], "meta": {"n": 1, "ids": ["p0"]}, "model": "m"}
    b = {"prompts": [{"id": "p1"}], "meta": {"n": 2, "ids": ["p1"]}, "model": "m"}
    assert tstages.merge_raw(a, b) == {"prompts": [{"id": "p0"}, {"id": "p1"}], "meta": {"n": 2, "ids": ["p0", "p1"]},
                                       "model": "m"}

    class Own:
        name = "own"

        def merge(self, old, new):
            return {"sum": old["sum"] + new["sum"]}

    got = tstages.join_phases([Own(), SimpleNamespace(name="plain")], {"own": {"sum": 1}},
                              {"own": {"sum": 2}, "plain": {"x": [1]}})
    assert got == {"own": {"sum": 3}, "plain": {"x": [1]}}


def test_not_scored_as_served_until_its_own_configuration_is():
    own = {"own": True, "settings": {"enforce_eager": False}}
    t = TrialRecord(id="t", screening=own)
    assert t.accuracy_text == "not scored as served" and not t.scored_as_served
    t.accuracy = ScreenResult(verdict="PASS", reason="the original model is the reference", reference=True,
                              scored_with={"enforce_eager": True, "dtype": "auto"})
    assert t.accuracy_text == "not scored as served"  # the reference's PASS is not this configuration's
    t.accuracy = ScreenResult(verdict="PASS", scored_with={"enforce_eager": False, "dtype": "auto"})
    assert t.scored_as_served and t.accuracy_text == "PASS"
    shared = TrialRecord(id="s", screening={"own": False, "settings": {}})
    assert shared.accuracy_text == "-"
    shared.accuracy = ScreenResult(verdict="FAIL")
    assert shared.accuracy_text == "FAIL"


# ------------------------------------------------------------------------------------ stand-in serving
class FakePhase:
    """A phase of the protocol: ids [lo, hi) per window; its comparison a decode block whose KLD interval narrows
    with the prompts joined (``ci``: n -> (lo, hi)); each run recorded."""

    name = "decode"
    gates = ("max_decode_kld",)

    def __init__(self, ci: dict[int, tuple[float, float]]):
        self.ci, self.runs = ci, []

    def run(self, served, prior, events, window=(0, 0)):
        lo, hi = window
        self.runs.append((served.label, window, sorted((prior or {}).get("ids", []))[:1] if prior else None))
        return {"ids": list(range(lo, hi)), "eager": served.extra.get("eager")}

    def compare(self, raw_ref, raw_cand, *, confidence, first):
        shared = [i for i in raw_cand["ids"] if i in set(raw_ref["ids"])]
        n = len(shared)
        lo, hi = self.ci[n]
        return {"n_prompts": n, "exact_match": 1.0, "exact_match_ci": [0.8, 1.0], "first_divergence_median": None,
                "kld": (lo + hi) / 2, "kld_ci": [lo, hi], "top1": 1.0, "steps": 10 * n, "near_ties": 0, "first": first}


class FakeScorer:
    """The stage's view of one server: the suite scored identically for every model (its gates pass at once), the
    phases run for real on their windows."""

    def __init__(self, label, purpose, log, diverge=False):
        self.label, self.log, self.diverge = label, log, diverge
        self.plan = SimpleNamespace(spec=SimpleNamespace(argv=["vllm", "serve", purpose]))

    def score(self, reqs):
        out = {}
        for r in reqs:
            assert r["type"] == "perplexity"
            start, n = int(r.get("window_start") or 0), int(r["max_windows"])
            top = {"a": -2.4, "b": -0.1} if self.diverge and self.label == "candidate" else {"a": -0.1, "b": -2.4}
            items = [{"id": f"w{i:04d}", "lp": [-1.0] * TOKENS, "top": [top] * TOKENS,
                      "tokens": ["x"] * (TOKENS + 1), "n_bytes": TOKENS} for i in range(start, n)]
            out[r["name"]] = {"type": "perplexity", "seq_len": r["seq_len"], "corpus_tokens": 10_000, "items": items}
        self.log.append((self.label, [r.get("window_start") for r in reqs]))
        return {"tasks": out, "stats": {"tokens": 0, "gen_tokens": 0, "seconds": 0.1}}

    def phases(self, phases, prior, window):
        from infertool.evaluate.phases import Served

        return {ph.name: tstages.run_phase(ph, Served(self.label, None), (prior or {}).get(ph.name), None, window)
                for ph in phases}


@pytest.fixture
def served(monkeypatch):
    """The reference and screen stages run for real on a stand-in scorer; quantize, capacity and the served check
    are hand-made outcomes."""
    from infertool import stages

    st = SimpleNamespace(log=[], purposes=[], diverge=False)

    def launch(res, model, ctx, purpose, tasks, label):
        st.purposes.append((purpose, res.serve_for(model)[0].enforce_eager))
        return tasks(FakeScorer(label, purpose, st.log, st.diverge))

    def quantize(ctx):
        (ctx.work / "model").mkdir()
        (ctx.work / "model" / "config.json").write_text("{}")
        return {"label": ctx.job.trial.candidate.label}

    def capacity(ctx):
        cost = 2.0 if ctx.job.trial.serve.get("enforce_eager") else 1.0
        return {"max_load": 2, "at_max_load": {"cost": {"per_1m_output_tokens": cost}, "tpot_ms": {"p50": 50.0},
                                               "goodput": {"requests_per_s": 1.0}}, "probes": [], "stopped": "stand-in"}

    def served_check(ctx):
        return {"verdict": "PASS", "reason": "stand-in", "mean_kld": 0.0}

    monkeypatch.setattr(tstages, "launch_scored", launch)
    for name, fn in {"quantize": quantize, "capacity": capacity, "served": served_check}.items():
        monkeypatch.setitem(stages.REGISTRY.by_name, name, replace(stages.get(name), run=fn))
    import infertool.tune.run as tr

    monkeypatch.setattr(tr, "_require_envs", lambda trials: None)
    return st


def test_rounds_stop_when_the_verdict_is_decided_and_score_only_open_gates(smol, tmp_path, monkeypatch, served):
    """The suite's gates pass in round 1; the decode gate (max_decode_kld 0.05) is open until round 2: screening
    runs round 2 and stops there, not at round 3. Round 2 scores the decode prompts only (the suite's gates are
    decided: their items are not topped up). The phase ran on each round's window, the candidate with the
    reference's raw as prior, and its raws joined cumulatively."""
    from infertool.tune.run import run_tune

    phase = FakePhase({2: (0.0, 0.2), 4: (0.0, 0.04), 8: (0.0, 0.01)})
    monkeypatch.setattr(tstages, "tune_phases", lambda tune: [phase])
    r = validate_recipe_data(recipe(smol, tmp_path, candidates=["none", {"bits": 8}], grid={"max_num_seqs": [2]}))
    res = run_tune(r)
    q = next(t for t in res.trials if t.candidate.spec is not None)
    acc = q.accuracy
    assert [h.items for h in acc.rounds] == [2, 4] and acc.stopped_early and acc.verdict == "PASS"
    assert [h.scored for h in acc.rounds] == [["suite", "decode"], ["decode"]]
    assert acc.items == 2  # the suite's items: decided in round 1
    assert acc.rounds[0].gates["max_mean_kld"] == "PASS" and acc.rounds[0].gates["max_decode_kld"] == "INCONCLUSIVE"
    assert acc.rounds[1].gates["max_decode_kld"] == "PASS" and acc.rounds[1].gates["max_mean_kld"] == "PASS"
    assert acc.decode["n_prompts"] == 4 and acc.decode["kld_ci"] == [0.0, 0.04] and acc.decode["exact_match"] == 1.0
    # the reference once on its largest round (saved beside raw.json), then the candidate's windows, prior given
    assert phase.runs == [("reference", (0, 8), None), ("candidate", (0, 2), [0]), ("candidate", (2, 4), [0])]
    assert served.log == [("reference", [0]), ("candidate", [0])]  # the suite: once for the candidate
    screen_dir = Path(q.stages["screen"].entry)
    assert json.loads((screen_dir / "phases.json").read_text()) == {"decode": {"ids": [0, 1, 2, 3], "eager": None}}
    assert [len(t["items"]) for t in json.loads((screen_dir / "raw.json").read_text())["tasks"].values()] == [2]
    ref_dir = Path(q.stages["reference"].entry)
    assert json.loads((ref_dir / "phases.json").read_text())["decode"]["ids"] == list(range(8))
    doc = json.loads((Path(res.tune_dir) / "tune.json").read_text())
    rec = next(t for t in doc["trials"] if t["id"] == q.id)
    assert rec["accuracy"]["decode"]["kld"] == pytest.approx(0.02) and rec["accuracy"]["scored_with"]["enforce_eager"] is True
    # a suite gate FAILs in round 1 (the candidate's distributions differ): the verdict is decided (a FAIL is final),
    # so screening stops before the decode phase runs; the decode gate says it was not measured, and why
    served.diverge = True
    phase2 = FakePhase({2: (0.0, 0.2), 4: (0.0, 0.04), 8: (0.0, 0.01)})
    monkeypatch.setattr(tstages, "tune_phases", lambda tune: [phase2])
    res = run_tune(validate_recipe_data(recipe(smol, tmp_path / "2", candidates=[{"bits": 8}], grid={"max_num_seqs": [2]})))
    acc = res.trials[0].accuracy
    assert acc.verdict == "FAIL" and [h.items for h in acc.rounds] == [2] and acc.rounds[0].scored == ["suite"]
    assert acc.rounds[0].gates["max_mean_kld"] == "FAIL" and acc.rounds[0].gates["max_decode_kld"] == "n/a"
    dec = next(g for g in acc.gates if g.name == "max_decode_kld")
    assert dec.status == "n/a" and "decided (FAIL) before this phase ran" in dec.note
    assert [w for who, w, _ in phase2.runs if who == "candidate"] == []


def test_open_sources_name_what_the_next_round_scores():
    dec = SimpleNamespace(name="decode", gates=("max_decode_kld",))
    lm = SimpleNamespace(name="lm_eval", gates=("min_recovery",))
    legacy = SimpleNamespace(name="legacy")  # names no gates: scored while anything is open
    g = lambda **s: [Gate.from_dict({"name": k, "status": v}) for k, v in s.items()]  # noqa: E731
    assert tstages.open_sources(g(max_mean_kld="PASS", max_decode_kld="INCONCLUSIVE", min_recovery="PASS"),
                                [dec, lm]) == {"decode"}
    assert tstages.open_sources(g(min_top1="INCONCLUSIVE", min_recovery="n/a"), [dec, lm]) == {"suite"}
    assert tstages.open_sources(g(min_top1="INCONCLUSIVE"), [dec, legacy]) == {"suite", "legacy"}
    assert tstages.open_sources(g(min_top1="PASS", max_decode_kld="PASS"), [dec, legacy]) == set()


def test_the_original_with_enforce_eager_false_is_scored_as_served(smol, tmp_path, monkeypatch, served):
    """The 2-trial tune of issue 22: the original with enforce_eager true (the recipe's: the reference, PASS by
    definition) vs false (its own screening, keyed by it, served with enforce_eager false); each trial's
    accuracy.scored_with names the settings scored; the tables and report show it."""
    from infertool.tune.run import run_tune

    phase = FakePhase({2: (0.0, 0.01), 4: (0.0, 0.01), 8: (0.0, 0.01)})
    monkeypatch.setattr(tstages, "tune_phases", lambda tune: [phase])
    res = run_tune(validate_recipe_data(recipe(smol, tmp_path)))
    by = {t.serve["enforce_eager"]: t for t in res.trials}
    eager, compiled = by[True], by[False]
    assert eager.accuracy.reference and eager.accuracy.verdict == "PASS" and "screen" not in eager.stages
    assert eager.accuracy.scored_with["enforce_eager"] is True and eager.accuracy_text == "PASS"
    assert not compiled.accuracy.reference and compiled.accuracy.reason != "the original model is the reference"
    assert set(compiled.stages) >= {"reference", "screen", "capacity"}
    assert compiled.accuracy.scored_with["enforce_eager"] is False and compiled.scored_as_served
    assert ("tune: screen original with enforce_eager=False", False) in served.purposes
    assert ("tune: reference (original)", True) in served.purposes
    assert compiled.accuracy.decode["n_prompts"] == 2 and compiled.accuracy_text == "PASS"
    # scored_with in tune.json; the report's accuracy section names it
    doc = json.loads((Path(res.tune_dir) / "tune.json").read_text())
    assert {t["serve"]["enforce_eager"]: t["accuracy"]["scored_with"]["enforce_eager"] for t in doc["trials"]} == {
        True: True, False: False}
    md = (Path(res.tune_dir) / "tune.md").read_text()
    assert "## Accuracy as served" in md and "enforce_eager=false" in md and "own: enforce_eager=false" in md


def test_accuracy_rows_show_lm_eval_per_task_and_the_decode_figures():
    from infertool.tune.report import accuracy_rows, trial_rows

    acc = {"verdict": "PASS", "scored_with": {"enforce_eager": False, "dtype": "bfloat16", "speculative": None},
           "lm_eval": {"infertool_mc": {"metric": "acc", "base": 0.5, "candidate": 0.45, "recovery": 0.9,
                                        "recovery_ci": [0.8, 1.01], "lost": 3, "gained": 1, "mcnemar_p": 0.62, "n": 40}},
           "decode": {"n_prompts": 12, "exact_match": 0.75, "exact_match_ci": [0.47, 0.91], "first_divergence_median": 7.0,
                      "kld": 0.012, "kld_ci": [0.004, 0.02], "top1": 0.98, "near_ties": 2, "divergences": 3}}
    doc = TuneDoc(trials=[TrialRecord(id="a", accuracy=ScreenResult.from_dict(acc),
                                      screening={"own": True, "settings": {"enforce_eager": False}}),
                          TrialRecord(id="b", screening={"own": True, "settings": {"enforce_eager": False}})])
    rows = accuracy_rows(doc)
    assert rows[1][:4] == ["a", "PASS", "enforce_eager=false, dtype=bfloat16", "own: enforce_eager=false"]
    assert rows[1][4] == "infertool_mc: 0.9 [0.8, 1.01] (0.5 -> 0.45; lost 3, gained 1, n 40)"
    assert rows[1][5:] == ["0.75 [0.47, 0.91] of 12", "7", "0.012 [0.004, 0.02]",
                          "2 of 5 divergences start at a near tie"]
    assert rows[2][:2] == ["b", "not scored as served"] and rows[2][4:] == ["-"] * 5
    assert [r[3] for r in trial_rows(doc)[1:]] == ["PASS", "not scored as served"]


def test_near_ties_cell_counts_of_all_divergences():
    """The decode block counts near ties apart from the other divergences: 5 near ties and 1 other divergence is
    "5 of 6", never "5 of 1" (issue 32 item 7)."""
    from infertool.tune.records import TrialDecode
    from infertool.tune.report import near_ties_cell as cell

    def near_ties_cell(dec: dict) -> str:  # the decode block as the report reads it: its record
        return cell(TrialDecode.from_dict(dec))

    assert near_ties_cell({"near_ties": 5, "divergences": 1}) == "5 of 6 divergences start at a near tie"
    assert near_ties_cell({"near_ties": 1, "divergences": 0}) == "1 of 1 divergence starts at a near tie"
    assert near_ties_cell({"near_ties": 0, "divergences": 3}) == "0 of 3 divergences start at a near tie"
    assert near_ties_cell({"near_ties": 0, "divergences": 0}) == "no divergence"
    assert near_ties_cell({"near_ties": None, "divergences": 2}) == "-"


def test_lm_eval_tasks_need_the_lmeval_environment_up_front(smol, tmp_path, monkeypatch):
    import infertool.envs.state as state
    import infertool.tune.run as tr

    asked: list[str] = []
    monkeypatch.setattr(state, "require_env", lambda name, needed_by=None: asked.append(name))
    data = recipe(smol, tmp_path)
    tr._require_envs(space.trials(validate_recipe_data(data)))
    assert asked == ["serve"]
    asked.clear()
    data["eval"]["lm_eval"] = {"tasks": ["infertool_mc"]}
    tr._require_envs(space.trials(validate_recipe_data(data)))
    assert asked == ["serve", "lmeval"]


def test_the_served_check_runs_in_the_same_rounds(smol, tmp_path, monkeypatch, served):
    """The winner's served check (the real stage, on the stand-in server): the screening's rounds up to
    served_items with the same stopping rule: round 2 scores the decode prompts only and decides it; its
    confidence is the per-look one."""
    from infertool import stages
    from infertool.tune.run import run_tune

    monkeypatch.setitem(stages.REGISTRY.by_name, "served", replace(stages.get("served"), run=tstages.run_served))
    phase = FakePhase({2: (0.0, 0.2), 4: (0.0, 0.04), 8: (0.0, 0.01)})
    monkeypatch.setattr(tstages, "tune_phases", lambda tune: [phase])
    data = recipe(smol, tmp_path, candidates=[{"bits": 8}], grid={"max_num_seqs": [2]})
    data["tune"]["accuracy"]["served_items"] = 6
    res = run_tune(validate_recipe_data(data))
    sc = res.trials[0].served_check
    assert sc.verdict == "PASS" and sc.rounds_planned == [2, 4, 6] and sc.stopped_early
    assert [(h.items, h.scored) for h in sc.rounds] == [(2, ["suite", "decode"]), (4, ["decode"])]
    assert sc.confidence == pytest.approx(1 - 0.05 / 3) and sc.decode["n_prompts"] == 4
    assert [w for who, w, _ in phase.runs if who == "served"] == [(0, 2), (2, 4)]


def test_the_winners_served_check_reuses_a_screening_of_the_same_configuration(smol, tmp_path, monkeypatch, served):
    """Issue 32.7: the 2-trial tune eager vs compiled. The compiled trial wins; its screening served exactly what
    its served check would (the original with enforce_eager false, every serve setting the same, the same rounds
    and items): no vLLM is started for the served check, the screening's result is its result, and tune.json and
    the report say it was reused. With other items (served_items 6) the served check runs on its own server."""
    from infertool import stages
    from infertool.tune.run import run_tune

    monkeypatch.setitem(stages.REGISTRY.by_name, "served", replace(stages.get("served"), run=tstages.run_served))
    phase = FakePhase({2: (0.0, 0.01), 4: (0.0, 0.01), 8: (0.0, 0.01)})
    monkeypatch.setattr(tstages, "tune_phases", lambda tune: [phase])
    events: list[str] = []
    res = run_tune(validate_recipe_data(recipe(smol, tmp_path)), on_event=lambda e: events.append(e.get("message", "")))
    compiled = next(t for t in res.trials if t.serve["enforce_eager"] is False)
    assert res.winner.id == compiled.id
    launched = [p for p, _ in served.purposes]
    assert not any(p.startswith("tune: served check") for p in launched), launched
    assert launched.count("tune: screen original with enforce_eager=False") == 1
    sc = compiled.served_check
    assert sc.verdict == compiled.accuracy.verdict == "PASS" and sc.rounds == compiled.accuracy.rounds
    assert "its screening (stage entry screen-" in sc.reused and "the same items (2, 4, 8 per task)" in sc.reused
    assert "served" not in compiled.stages and any("served check not run again" in m for m in events)
    doc = json.loads((Path(res.tune_dir) / "tune.json").read_text())
    assert next(t for t in doc["trials"] if t["id"] == compiled.id)["served_check"]["reused"] == sc.reused
    md = (Path(res.tune_dir) / "tune.md").read_text()
    assert "the served check reused its screening" in md and "its exact settings: its screening's, reused" in md
    # other items: the served check is its own (a server started for it), nothing reused
    served.purposes.clear()
    data = recipe(smol, tmp_path / "2")
    data["tune"]["accuracy"]["served_items"] = 6
    res = run_tune(validate_recipe_data(data))
    compiled = next(t for t in res.trials if t.serve["enforce_eager"] is False)
    assert compiled.served_check.reused is None and "served" in compiled.stages
    assert any(p.startswith("tune: served check") for p, _ in served.purposes)


def test_a_check_with_no_measurable_gate_stops_after_round_1(monkeypatch):
    """INCONCLUSIVE because no gate could be measured (all n/a): more items cannot decide it, so no round 2."""
    scored = []
    monkeypatch.setattr(tstages, "judge", lambda tune, ref, acc, n, conf, blocks=None: Judgement.from_dict({
        "verdict": "INCONCLUSIVE", "items": n, "mean_kld": None, "top1": None, "n_needed": None,
        "gates": [{"name": "max_mean_kld", "status": "n/a"}]}))
    monkeypatch.setattr(tstages, "requests", lambda job, lo, hi: [(lo, hi)])
    sc = SimpleNamespace(score=lambda reqs: scored.append(reqs) or {"tasks": {}, "stats": {}})
    ctx = SimpleNamespace(job=SimpleNamespace(tune=SimpleNamespace(exhaustive=False)), emit=lambda message: None)
    seq = tstages.sequential(ctx, sc, [2, 4, 8], 0.98, {}, [], {}, "screen x")
    assert [h.items for h in seq.history] == [2] and scored == [[(0, 2)]]
    ctx.job.tune.exhaustive = True  # brute force: its one look, whatever
    scored.clear()
    assert len(tstages.sequential(ctx, sc, [8], 0.95, {}, [], {}, "screen x").history) == 1 and scored == [[(0, 8)]]
