"""`infertool tune`: the search space from a recipe, the dry run, and the staged orchestration (pruning, early
stopping, capacity, the winner re-checked as served, tuned.yaml, the report, resuming after an interruption)
with stand-in stage work; the real stages run in tests/test_tune_real.py."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from infertool.cli import app
from infertool.errors import UsageError
from infertool.stages import cached_stage
from infertool.recipe import validate_recipe_data
from infertool.tune import core, space
from infertool.tune.records import TuneDoc
from tests.fakes import layout_model


@pytest.fixture(autouse=True)
def _cwd(tmp_path, monkeypatch):
    """tune publishes its winner to out/<recipe>-<method> by default, relative to the working directory."""
    monkeypatch.chdir(tmp_path)


@pytest.fixture(scope="module")
def smol(tmp_path_factory) -> Path:
    return layout_model(tmp_path_factory.mktemp("m") / "smollm2", "smollm2-135m", shards=1)


def tune_recipe(model: Path, tmp_path: Path, **tune) -> dict:
    return {
        "name": "t",
        "model": {"source": str(model)},
        "quantize": {"method": "gptq", "bits": 4, "group_size": 64},
        "serve": {"max_model_len": 2048, "cpu": {"kv_cache_space_gib": 1}, "enforce_eager": True},
        "bench": {"requests": 4, "prompt": {"len": 64}, "output_len": 8, "slo": {"ttft_ms": 1000},
                  "cost_per_hour": 1.0},
        "tune": {"candidates": ["none", {"backend": "llmcompressor", "scheme": "W8A8", "bits": 8}, {"group_size": 32}],
                 "serve_grid": {"max_num_seqs": [2, 4]}, "out_dir": str(tmp_path / "tune"),
                 "accuracy": {"rounds": [2, 4, 8]}, **tune},
    }


def test_space_candidates_grid_and_trial_recipes(smol, tmp_path):
    r = validate_recipe_data(tune_recipe(smol, tmp_path))
    cands = space.candidates(r)
    assert [c.label for c in cands] == ["original", "W8A8 (llmcompressor)", "GPTQ 4-bit g32 (gptqmodel)"]
    assert cands[2].spec["bits"] == 4 and cands[2].spec["group_size"] == 32 and cands[2].spec["method"] == "gptq"
    assert list(space.grid(r)) == [{"max_num_seqs": 2}, {"max_num_seqs": 4}]
    trials = space.trials(r)
    assert len(trials) == 6 and len({t.id for t in trials}) == 6
    t = next(t for t in trials if t.candidate.index == 1 and t.serve == {"max_num_seqs": 4})
    assert t.recipe.quantize.scheme == "W8A8" and t.recipe.serve.max_num_seqs == 4 and t.recipe.tune is None
    from infertool.resolve import resolve

    res = resolve(t.recipe, candidate_path=tmp_path / "cand")
    assert res.served_origin == "candidate" and res.served.path == str(tmp_path / "cand")
    orig = next(t for t in trials if t.candidate.original)
    assert orig.recipe.quantize is None and resolve(orig.recipe).served_origin == "original"
    with pytest.raises(UsageError, match="same quantization"):
        space.candidates(validate_recipe_data(tune_recipe(smol, tmp_path, candidates=[{"bits": 8}, {"bits": 8}])))


def test_tune_validation_lists_field_paths(smol, tmp_path):
    from infertool.errors import RecipeError

    data = tune_recipe(smol, tmp_path, serve_grid={"max_num_seqs": [2, 0], "enforce_eagre": [True]})
    with pytest.raises(RecipeError) as e:
        validate_recipe_data(data)
    paths = {i.path for i in e.value.issues}
    assert {"tune.serve_grid.max_num_seqs[1]", "tune.serve_grid.enforce_eagre"} <= paths
    bad = tune_recipe(smol, tmp_path, candidates=["none", {"group_size": 100}])
    with pytest.raises(RecipeError) as e:
        validate_recipe_data(bad)
    assert e.value.issues[0].path == "tune.candidates[1].group_size"
    no_slo = tune_recipe(smol, tmp_path)
    no_slo["bench"].pop("slo")
    with pytest.raises(RecipeError) as e:
        validate_recipe_data(no_slo)
    assert e.value.issues[0].path == "tune.slo"


def test_dry_run_orders_by_prediction_and_prunes_what_cannot_fit(smol, tmp_path):
    data = tune_recipe(smol, tmp_path, serve_grid={"max_model_len": [2048, 99999]})
    p = tmp_path / "r.yaml"
    p.write_text(yaml.safe_dump(data))
    r = CliRunner().invoke(app, ["tune", str(p), "--dry-run", "--json"])
    assert r.exit_code == 0, r.output
    plan = json.loads(r.stdout)
    assert len(plan["trials"]) == 6 and len(plan["pruned"]) == 3
    for t in plan["trials"]:
        if t["id"] in plan["pruned"]:
            assert t["serve"]["max_model_len"] == 99999
            assert any("position limit" in x for x in t["prediction"]["reasons"])
    fits = [t for t in plan["trials"] if t["prediction"]["fits"]]
    assert plan["trials"][: len(fits)] == fits  # what fits first
    costs = [t["prediction"]["cost_per_1m_output_tokens"] for t in fits]
    assert costs == sorted(costs)  # most promising first


def test_dry_run_refuses_a_publish_destination_the_real_tune_refuses(smol, tmp_path):
    """`tune --dry-run --publish DIR`, DIR someone's own model folder: exit 2, as the real tune says before any
    trial (the dry run is where a user finds out), and the folder untouched."""
    p = tmp_path / "r.yaml"
    p.write_text(yaml.safe_dump(tune_recipe(smol, tmp_path)))
    mine = layout_model(tmp_path / "mine", "smollm2-135m", shards=1, num_hidden_layers=2)
    (mine / "notes.txt").write_text("mine")
    before = sorted(x.name for x in mine.iterdir())
    r = CliRunner().invoke(app, ["tune", str(p), "--dry-run", "--publish", str(mine)])
    assert r.exit_code == 2 and "infertool did not publish this folder" in r.output, r.output
    assert sorted(x.name for x in mine.iterdir()) == before
    r = CliRunner().invoke(app, ["tune", str(p), "--dry-run", "--publish", str(tmp_path / "new")])
    assert r.exit_code == 0, r.output


def test_a_checkpoint_already_published_is_not_what_a_candidate_is_planned_from(smol, tmp_path):
    """A checkpoint an earlier `run` published where the recipe's quantize stage writes (out/<recipe>-<method>, in
    the working directory; here a 2-layer model) is not what tune plans a candidate from: each candidate is
    planned from its base and method, the same plan as without it."""
    def plan() -> list:
        p = tmp_path / "r.yaml"
        p.write_text(yaml.safe_dump(tune_recipe(smol, tmp_path)))
        r = CliRunner().invoke(app, ["tune", str(p), "--dry-run", "--json"])
        assert r.exit_code == 0, r.output
        return [(t["label"], t["prediction"]["fits"], t["prediction"]["weight_bytes"]) for t in json.loads(r.stdout)["trials"]]

    before = plan()
    layout_model(tmp_path / "out" / "t-gptq", "smollm2-135m", shards=1, num_hidden_layers=2)
    assert plan() == before


# ------------------------------------------------------------------------------ stand-in stage work
class Stand:
    """The tune stages' bodies replaced by hand-made outcomes (in the one registry: the declarations, keys and
    the real stage cache stay): which candidate passes, the load each setting holds, the winner's served check."""

    def __init__(self, monkeypatch, *, verdicts, loads, served, interrupt_at=None):
        from dataclasses import replace

        from infertool import stages

        self.calls: list[str] = []
        self.verdicts, self.loads, self.served, self.interrupt_at = verdicts, loads, served, interrupt_at
        bodies = {"quantize": self.quantize, "reference": self.reference, "screen": self.screen,
                  "capacity": self.capacity, "served": self.served_check}
        for name, fn in bodies.items():
            monkeypatch.setitem(stages.REGISTRY.by_name, name, replace(stages.get(name), run=fn))
        import infertool.tune.executor as ex

        monkeypatch.setattr(ex, "_needs_reference", lambda trials: True)
        import infertool.tune.run as tr

        self.envs_checked: list[str] = []
        monkeypatch.setattr(tr, "_require_envs", lambda trials: self.envs_checked.append(len(trials)))

    def quantize(self, ctx):
        assert ctx.options.verify is False  # tune's quantization: without the load check (a declared option)
        self.calls.append(f"quantize:{ctx.job.trial.candidate.key}")
        (ctx.work / "model").mkdir()
        (ctx.work / "model" / "config.json").write_text("{}")
        return {"label": ctx.job.trial.candidate.label}

    def reference(self, ctx):
        self.calls.append("reference:ref")
        return {"items": 8}

    def screen(self, ctx):
        trial = ctx.job.trial
        assert ctx.upstream["quantize"].dir.name.startswith("quantize-") and "reference" in ctx.upstream
        self.calls.append(f"screen:{trial.candidate.key}")
        v = self.verdicts[trial.candidate.label]
        rounds = {"PASS": 1, "FAIL": 1, "INCONCLUSIVE": 3}[v]
        return {"verdict": v, "reason": f"stand-in {v}", "items": [2, 4, 8][rounds - 1], "mean_kld": 0.01 * rounds,
                "rounds": [{"items": n} for n in [2, 4, 8][:rounds]], "stopped_early": rounds < 3,
                "n_needed": 500 if v == "INCONCLUSIVE" else None}

    def capacity(self, ctx):
        trial = ctx.job.trial
        if self.interrupt_at and trial.id == self.interrupt_at:
            self.interrupt_at = None
            raise KeyboardInterrupt
        self.calls.append(f"capacity:{trial.id}")
        load, cost = self.loads[(trial.candidate.label, trial.serve["max_num_seqs"])]
        at = {"cost": {"per_1m_output_tokens": cost}, "tpot_ms": {"p50": 50.0}, "goodput": {"requests_per_s": 1.0}} if load else None
        return {"max_load": load, "at_max_load": at, "probes": [], "stopped": "stand-in" if load else "the SLO is missed at 1"}

    def served_check(self, ctx):
        trial = ctx.job.trial
        self.calls.append(f"served:{trial.id}")
        return {"verdict": self.served.get(trial.id, "PASS"), "reason": "stand-in", "mean_kld": 0.0}


def test_staged_search_prunes_stops_early_and_rechecks_the_winner(smol, tmp_path, monkeypatch):
    from infertool.tune.run import run_tune

    r = validate_recipe_data(tune_recipe(smol, tmp_path))
    trials = {(t.candidate.label, t.serve["max_num_seqs"]): t.id for t in space.trials(r)}
    w8_4 = trials[("W8A8 (llmcompressor)", 4)]
    stand = Stand(monkeypatch, verdicts={"W8A8 (llmcompressor)": "PASS", "GPTQ 4-bit g32 (gptqmodel)": "FAIL"},
                  loads={("original", 2): (2, 9.0), ("original", 4): (3, 8.0), ("W8A8 (llmcompressor)", 2): (2, 6.0),
                         ("W8A8 (llmcompressor)", 4): (4, 4.0), ("GPTQ 4-bit g32 (gptqmodel)", 2): (4, 1.0),
                         ("GPTQ 4-bit g32 (gptqmodel)", 4): (4, 1.0)},
                  served={w8_4: "FAIL"})  # the cheapest that passed diverges as served: the next one wins
    res = run_tune(r)
    by = {(t.candidate.label, t.serve["max_num_seqs"]): t for t in res.trials}
    assert res.winner.id == trials[("W8A8 (llmcompressor)", 2)]
    assert "served outputs diverge" in by[("W8A8 (llmcompressor)", 4)].why_lost
    gptq = by[("GPTQ 4-bit g32 (gptqmodel)", 2)]
    assert gptq.why_lost.startswith("accuracy FAIL") and gptq.capacity is None  # no capacity measured
    assert by[("original", 4)].why_lost == "cost per 1M output tokens at the SLO: 8 $ vs the winner's 6 $"
    # the original's trials need neither quantization nor screening: their graph is the capacity search alone
    assert set(by[("original", 2)].stages) == {"capacity"}
    assert set(by[("W8A8 (llmcompressor)", 2)].stages) == {"quantize", "reference", "screen", "capacity", "served"}
    # each candidate quantized and screened once, however many settings it is crossed with
    assert sum(c.startswith("quantize:") for c in stand.calls) == 2 and sum(c.startswith("screen:") for c in stand.calls) == 2
    assert not any(c.startswith(f"capacity:{trials[('GPTQ 4-bit g32 (gptqmodel)', 2)]}") for c in stand.calls)
    # the answer: tune.json, a report, and a recipe every command takes as it is
    d = Path(res.tune_dir)
    doc = json.loads((d / "tune.json").read_text())
    assert doc["winner"] == res.winner.id and set(res.report) >= {"tune.md", "tune.html"}
    # an objective that was not measured is null in the file (never Infinity), and reads back as not measured
    assert by[("GPTQ 4-bit g32 (gptqmodel)", 2)].objective is None
    assert {t["id"]: t["objective"] for t in doc["trials"]}[gptq.id] is None and "Infinity" not in (d / "tune.json").read_text()
    from infertool.tune.records import TuneDoc

    back = TuneDoc.from_dict(doc)
    assert back.trial(res.winner.id).capacity.max_load == 2 and back.trial(gptq.id).objective is None
    tuned = yaml.safe_load(Path(res.tuned_recipe).read_text())
    assert tuned["quantize"]["scheme"] == "W8A8" and tuned["serve"]["max_num_seqs"] == 2
    assert Path(tuned["quantize"]["output"]) == tmp_path / "out" / "t-tuned-w8a8" and (Path(tuned["quantize"]["output"]) / "config.json").is_file()
    from infertool.recipe import load_recipe
    from infertool.resolve import resolve

    again = resolve(load_recipe(res.tuned_recipe))
    assert again.served_origin == "candidate" and again.served.exists and again.recipe.tune is None
    from infertool import publish

    pub = json.loads((d / publish.TUNE_PUBLISHED).read_text())  # the winner published with its card, checked
    assert pub == res.published.to_dict() and pub["path"] == tuned["quantize"]["output"]
    assert pub["fingerprint"] == publish.fingerprint(pub["path"]) == publish.fingerprint(Path(res.winner.stages["quantize"].entry) / "model")
    assert json.loads((Path(pub["path"]) / publish.FACTS).read_text())["label"] == res.winner.label
    from infertool.provenance import read_provenance, summary  # the winner's provenance: the trial's recipe, id

    prov = summary(read_provenance(Path(pub["path"])))
    assert prov.recipe == "t" and len(prov.recipe_sha256) == 64 and prov.invocation == f"{d.name}/{res.winner.id}"
    assert prov.verdict == "PASS" and prov.subjects >= 1
    assert publish.served(str(d)).published == pub["path"]  # `infertool serve TUNE_DIR`
    assert f"published at `{pub['path']}`" in (d / "tune.md").read_text()
    for tid in trials.values():
        assert (d / "trials" / tid / "manifest.json").is_file()
    # the same command again: every stage reused, nothing runs, the same answer
    stand.calls.clear()
    from infertool.signing import check_folder, new_key_pair

    keys = new_key_pair(tmp_path / "keys")  # tune --sign-key: the winner's folder, published again, is signed
    res2 = run_tune(validate_recipe_data(tune_recipe(smol, tmp_path)), sign_key=keys.private_key)
    assert stand.calls == [] and res2.winner.id == res.winner.id
    assert check_folder(Path(pub["path"]), [keys.public_key]).status == "valid"
    assert res2.published is not None and res2.published.signature is not None
    # a later tune in the same directory that the original wins: nothing published, the earlier record gone
    res3 = run_tune(validate_recipe_data(tune_recipe(smol, tmp_path, candidates=["none"])))
    assert Path(res3.tune_dir) == d and res3.winner.candidate.spec is None and not res3.published
    assert not (d / publish.TUNE_PUBLISHED).exists() and Path(pub["path"]).is_dir()  # the checkpoint itself stays


def test_one_tune_resolves_its_recipe_once(smol, tmp_path, monkeypatch):
    """The tune's recipe is resolved once (the context, the publish checks and the stages read that one), the
    reference once, each trial's recipe once (its plan, its decode check); the winner's checkpoint once more."""
    import infertool.resolve as resolving
    from infertool.tune.run import run_tune

    real, calls = resolving.resolve, []

    def counting(recipe, *a, **k):
        calls.append((recipe, k.get("candidate_path")))
        return real(recipe, *a, **k)

    monkeypatch.setattr(resolving, "resolve", counting)
    r = validate_recipe_data(tune_recipe(smol, tmp_path))
    n_trials = len(space.trials(r))
    Stand(monkeypatch, verdicts={"W8A8 (llmcompressor)": "PASS", "GPTQ 4-bit g32 (gptqmodel)": "FAIL"},
          loads={(c, m): (2, 5.0 + m) for c in ("original", "W8A8 (llmcompressor)", "GPTQ 4-bit g32 (gptqmodel)")
                 for m in (2, 4)}, served={})
    calls.clear()
    res = run_tune(r)
    assert res.winner is not None and res.winner.stages.get("quantize") is not None
    assert sum(rec is r for rec, _ in calls) == 1  # the tune's own recipe: once
    planned = [rec for rec, path in calls if path is None and rec is not r]
    assert len(planned) == len({id(rec) for rec in planned}) == n_trials + 1  # every trial once, the reference once
    assert [path for _, path in calls if path is not None] == [Path(res.winner.stages["quantize"].entry) / "model"]
    assert len(calls) == n_trials + 3


def test_interrupted_tune_resumes_with_finished_trials_reused(smol, tmp_path, monkeypatch):
    from infertool.tune.run import run_tune

    r = validate_recipe_data(tune_recipe(smol, tmp_path, candidates=["none", {"group_size": 32}]))
    ordered = core.plan_search(r).trials
    loads = {(t.candidate.label, t.serve["max_num_seqs"]): (2, 5.0 + i) for i, t in enumerate(ordered)}
    stand = Stand(monkeypatch, verdicts={"GPTQ 4-bit g32 (gptqmodel)": "PASS"}, loads=loads, served={},
                  interrupt_at=ordered[2].id)
    with pytest.raises(KeyboardInterrupt):
        run_tune(r)
    done_before = [c for c in stand.calls if c.startswith("capacity:")]
    assert len(done_before) == 2
    m = json.loads((Path(r.tune.out_dir) / "t" / "trials" / ordered[2].id / "manifest.json").read_text())
    assert m["status"] == "interrupted"
    stand.calls.clear()
    res = run_tune(r)
    assert [c for c in stand.calls if c.startswith("capacity:")] == [f"capacity:{t.id}" for t in ordered[2:]]
    assert all(t.status == "done" for t in res.trials)


def test_a_missing_environment_stops_tune_before_any_trial(smol, tmp_path, tmp_home):
    data = tune_recipe(smol, tmp_path)
    p = tmp_path / "r.yaml"
    p.write_text(yaml.safe_dump(data))
    r = CliRunner().invoke(app, ["tune", str(p), "--json"])
    assert r.exit_code == 3, r.output
    err = json.loads(r.stdout)
    assert err["error"] == "EnvNotReady" and "infertool env setup" in err["hint"]
    assert not (tmp_path / "tune" / "t" / "trials").exists()  # no trial recorded as failed for it


def test_report_escapes_what_a_recipe_can_say(smol, tmp_path, monkeypatch):
    from infertool.tune.report import render_html

    doc = {"recipe": "<script>x</script>", "objective": "cost", "slo": None, "accept": {"preset": "standard"},
           "seconds": 1.0, "winner": None, "pareto": [], "exhaustive": False, "tuned_recipe": None,
           "trials": [{"id": "a", "label": "<b>", "candidate": {"label": "<img src=x>"}, "serve": {"k": "<i>"},
                       "status": "failed", "objective": math.inf, "why_lost": "<evil>"}]}
    page = render_html(TuneDoc.from_dict(doc), None, None)
    assert "<script>x" not in page and "<img src=x>" not in page and "&lt;evil&gt;" in page


def test_a_stage_left_half_written_by_a_killed_process_is_swept(tmp_path):
    import subprocess
    import sys

    from infertool.stages.cache import writer as _writer

    cache = tmp_path / "stages"
    # a process that started the stage and was killed (SIGKILL: no cleanup), one still writing, another host's
    code = ("import sys; from pathlib import Path; from infertool.stages import cached_stage\n"
            "cached_stage(Path(sys.argv[1]), 'capacity', 'k', lambda w: (print(w, flush=True), __import__('time').sleep(600)))")
    proc = subprocess.Popen([sys.executable, "-c", code, str(cache)], stdout=subprocess.PIPE, text=True)
    dead = Path(proc.stdout.readline().strip())
    proc.kill()
    proc.wait(timeout=30)
    assert dead.is_dir()
    host = _writer().rsplit("-", 1)[0]
    live = cache / f".capacity-k.{host}-{os.getpid()}.abcd1234.tmp"
    other = cache / ".capacity-k.otherhost-1.abcd1234.tmp"
    for d in (live, other):
        d.mkdir()
    st = cached_stage(cache, "capacity", "k", lambda w: {"max_load": 3})
    assert st.status == "done" and st.summary == {"max_load": 3}
    assert not dead.exists() and live.is_dir() and other.is_dir()
