"""What a speculative trial's drafts did, in tune.json and the report: the acceptance rate per draft position and
the mean accepted length pooled over its capacity probes (vLLM's spec-decode counters in levels.json), and the
crossover load against its sibling without speculation at the concurrencies both probed
(``infertool.tune.speculation``, over bench.per_class's pairing); "not measured" with why where the sibling or the
counters are missing; old tune.json files still read. With the stand-in stage work of tests/test_tune.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from infertool.atomic import write_json
from infertool.recipe import validate_recipe_data
from infertool.tune import space
from infertool.tune.records import CapacityResult, TrialRecord, TrialStage, TuneDoc
from tests.test_tune import Stand, smol, tune_recipe  # noqa: F401 - smol: the fixture

W8 = "W8A8 (llmcompressor)"
NGRAM = {"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_max": 4, "prompt_lookup_min": 2}
# goodput req/s at each concurrency: without speculation, and with it (c2 measured twice, near each other)
OFF = {1: [1.0], 2: [1.9], 4: [3.5], 8: [6.0]}
ON = {1: [1.6], 2: [2.89, 2.91], 4: [3.2], 8: [5.0]}
# the speculative server's counters at each concurrency: (acceptance at positions 0 and 1, drafts per run)
COUNTERS = {1: ([0.8, 0.6], 100.0), 2: ([0.7, 0.5], 150.0), 4: ([0.6, 0.4], 100.0), 8: ([0.5, 0.3], 100.0)}


@pytest.fixture(autouse=True)
def _cwd(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)


def level(c: int, run: int, goodput: float, counters: tuple[list[float], float] | None) -> dict:
    """A capacity probe's bench level as levels.json keeps it (bench's LevelResult)."""
    sm: dict = {"available": True, "samples": 3}
    if counters is not None:
        pos, drafts = counters
        sm.update(spec_decode_acceptance_per_pos=pos, spec_decode_drafts=drafts,
                  spec_decode_acceptance_rate=sum(pos) / len(pos), spec_decode_mean_accepted_len=1 + sum(pos))
    return {"arm": f"c{c}" + (f"-r{run + 1}" if run else ""),
            "level": {"kind": "concurrency", "value": c, "label": f"concurrency {c}"},
            "summary": {"requests": 8, "completed": 8, "failed": 0, "output_token_throughput": goodput * 8,
                        "request_throughput": goodput, "goodput": {"requests_per_s": goodput, "fraction": 1.0},
                        "tpot_ms": {"p50": 40.0}, "ttft_ms": {"p50": 100.0, "p90": 150.0}},
            "server_metrics": sm}


class SpecStand(Stand):
    """Capacity writes the probes' levels (levels.json): each trial's goodput per concurrency, the speculative
    one's with spec-decode counters (``counters``: False, a server that exposes none)."""

    def __init__(self, monkeypatch, counters: bool = True):
        super().__init__(monkeypatch, verdicts={W8: "PASS"}, loads={}, served={})
        self.counters = counters

    def capacity(self, ctx):
        trial = ctx.job.trial
        self.calls.append(f"capacity:{trial.id}")
        spec = trial.serve.get("speculative") is not None
        levels = [level(c, run, g, COUNTERS[c] if spec and self.counters else None)
                  for c, runs in (ON if spec else OFF).items() for run, g in enumerate(runs)]
        write_json(ctx.work / "levels.json", levels, indent=None)
        best = 2 if spec else 4
        at = {"cost": {"per_1m_output_tokens": 5.0 if spec else 4.0}, "tpot_ms": {"p50": 40.0},
              "goodput": {"requests_per_s": 2.0}}
        return {"max_load": best, "at_max_load": at, "probes": [], "stopped": "stand-in"}


def spec_recipe(model: Path, tmp_path: Path) -> dict:
    return tune_recipe(model, tmp_path, candidates=[{"backend": "llmcompressor", "scheme": "W8A8", "bits": 8}],
                       serve_grid={"max_num_seqs": [8], "speculative": [None, NGRAM]})


def test_acceptance_per_position_and_the_crossover_reach_tune_json_and_the_report(smol, tmp_path, monkeypatch):
    from infertool.tune.run import run_tune

    r = validate_recipe_data(spec_recipe(smol, tmp_path))
    ids = {t.serve["speculative"] is not None: t.id for t in space.trials(r)}
    SpecStand(monkeypatch)
    res = run_tune(r)
    doc = json.loads((Path(res.tune_dir) / "tune.json").read_text())
    by = {t["id"]: t for t in doc["trials"]}
    assert "speculation" not in by[ids[False]]  # no speculation: no figures, no key
    s = TuneDoc.from_dict(doc).trial(ids[True]).speculation
    assert s is not None and s.setting == "ngram k=2 lookup 2-4" and s.sibling == ids[False]
    assert s.config["num_speculative_tokens"] == 2 and s.probes == 5 and s.notes == []
    # pooled over the five probe runs, each weighted by its drafts (100, 150, 150, 100, 100)
    weights = {1: 100, 2: 300, 4: 100, 8: 100}
    for i in (0, 1):
        want = sum(COUNTERS[c][0][i] * w for c, w in weights.items()) / 600
        assert s.acceptance_per_pos[i] == pytest.approx(want)
    assert s.mean_accepted_len == pytest.approx(sum((1 + sum(COUNTERS[c][0])) * w for c, w in weights.items()) / 600)
    assert s.drafts == 600
    # against the sibling at every concurrency both probed: goodput on / off; c2's two runs pooled with an interval
    assert [lv.load for lv in s.levels] == [1, 2, 4, 8] and {lv.figure for lv in s.levels} == {"goodput"}
    assert [lv.verdict for lv in s.levels] == ["pays", "pays", "loses", "loses"]
    two = s.levels[1]
    assert two.on.value == pytest.approx(2.9) and two.on.lo < 2.9 < two.on.hi and two.ratio.lo > 1
    assert two.acceptance_per_pos == pytest.approx([0.7, 0.5]) and two.drafts == 300
    c = s.crossover
    assert c.found and c.kind == "concurrency" and (c.above, c.below) == (2, 4)
    ra, rb = 2.9 / 1.9, 3.2 / 3.5
    assert c.estimate == pytest.approx(2 + (ra - 1) / (ra - rb) * 2)
    # the report says them
    md = (Path(res.tune_dir) / "tune.md").read_text()
    assert "## Speculation, measured" in md and "0.67 / 0.47" in md and "between concurrency 2 (pays) and 4 (loses)" in md
    row = next(line for line in md.splitlines() if line.startswith(f"| {ids[True]} ") and "ngram k=2" in line)
    assert f"{ids[False]} (no speculation)" in row and "1.53x" in row
    assert "Speculation, measured" in (Path(res.tune_dir) / "tune.html").read_text()


def test_a_server_without_spec_counters_says_acceptance_not_measured(smol, tmp_path, monkeypatch):
    from infertool.tune.run import run_tune

    r = validate_recipe_data(spec_recipe(smol, tmp_path))
    SpecStand(monkeypatch, counters=False)
    res = run_tune(r)
    s = next(t.speculation for t in res.trials if t.speculation is not None)
    assert s.acceptance_per_pos is None and s.mean_accepted_len is None
    assert any("acceptance not measured: the server reported no spec-decode counters" in n for n in s.notes)
    assert s.crossover is not None and s.crossover.found  # the throughput still pairs
    md = (Path(res.tune_dir) / "tune.md").read_text()
    assert "acceptance not measured" in md


def _rec(tid: str, spec: dict | None, *, measured: bool = True, grid: bool = True, entry: str | None = None) -> TrialRecord:
    rec = TrialRecord(id=tid, label=tid, serve={"max_num_seqs": 8, **({"speculative": spec} if grid else {})},
                      status="done")
    rec.candidate.key = "cand"
    if measured:
        rec.capacity = CapacityResult(max_load=4)
        rec.stages["capacity"] = TrialStage(entry or f"/nowhere/{tid}", "done", 1.0)
    return rec


def test_what_is_missing_is_said_not_guessed(tmp_path):
    from infertool.bench.results import LevelResult
    from infertool.tune.speculation import capacity_levels, figures

    on = [LevelResult.from_dict(level(c, 0, g[0], COUNTERS[c])) for c, g in ON.items()]
    off = [LevelResult.from_dict(level(c, 0, g[0], None)) for c, g in OFF.items()]
    spec, plain = _rec("s", NGRAM), _rec("p", None)
    levels = {"s": on, "p": off}

    def of(rec: TrialRecord):
        return levels.get(rec.id, f"trial {rec.id}: none")

    # no sibling in the tune: acceptance measured, the crossover not, with why
    alone = figures(spec, [spec], slo_set=True, levels_of=of)
    assert alone.acceptance_per_pos is not None and alone.crossover is None and alone.sibling is None
    assert any("no trial of this tune has the same candidate and serve settings without speculation" in n
               for n in alone.notes)
    assert alone.crossover_text == "not measured"
    # another candidate, or other settings, is no sibling
    other = _rec("o", None)
    other.candidate.key = "another"
    assert figures(spec, [spec, other], slo_set=True, levels_of=of).sibling is None
    # the sibling's capacity not measured (its file missing): said
    lost = figures(spec, [spec, plain], slo_set=True, levels_of=capacity_levels)
    assert lost.acceptance_per_pos is None and lost.crossover is None
    assert any("trial s's capacity stage kept no levels.json" in n for n in lost.notes)
    entry = tmp_path / "capacity-s"
    entry.mkdir()
    write_json(entry / "levels.json", [x.to_dict() for x in on])
    spec.stages["capacity"].entry = str(entry)
    half = figures(spec, [spec, _rec("p", None, measured=False)], slo_set=True, levels_of=capacity_levels)
    weights = {1: 100, 2: 150, 4: 100, 8: 100}  # one run each here
    want = [sum(COUNTERS[c][0][i] * w for c, w in weights.items()) / 450 for i in (0, 1)]
    assert half.acceptance_per_pos == pytest.approx(want) and half.sibling == "p" and half.crossover is None
    assert any("crossover not measured: trial p's capacity was not measured" in n for n in half.notes)
    # no concurrency probed by both
    levels["p"] = [LevelResult.from_dict(level(16, 0, 9.0, None))]
    apart = figures(spec, [spec, plain], slo_set=True, levels_of=of)
    assert any("no concurrency probed by both (this trial: 1, 2, 4, 8; p: 16)" in n for n in apart.notes)
    # a trial without speculation has no figures
    assert figures(plain, [spec, plain], slo_set=True, levels_of=of) is None


def test_an_old_tune_json_without_the_figures_still_reads():
    old = {"recipe": "t", "trials": [{"id": "a", "label": "a", "serve": {"speculative": NGRAM}, "status": "done"}]}
    doc = TuneDoc.from_dict(old)
    assert doc.trials[0].speculation is None and "speculation" not in doc.trials[0].to_dict()
    from infertool.tune.report import render_markdown

    assert "Speculation, measured" not in render_markdown(doc, None, None)


class ClassSpecStand(SpecStand):
    """Per class: the same goodput, the drafts accepted as the class repeats its input (``ACCEPTED``)."""

    ACCEPTED = {"listcopy": [0.9, 0.8], "story": [0.2, 0.1]}

    def capacity(self, ctx):
        cls = ctx.job.tune.bench.classes.replay
        trial = ctx.job.trial
        self.calls.append(f"capacity:{cls}:{trial.id}")
        spec = trial.serve.get("speculative") is not None
        levels = [level(c, run, g, (self.ACCEPTED[cls], 100.0) if spec else None)
                  for c, runs in (ON if spec else OFF).items() for run, g in enumerate(runs)]
        write_json(ctx.work / "levels.json", levels, indent=None)
        at = {"cost": {"per_1m_output_tokens": 5.0 if spec else 4.0}, "tpot_ms": {"p50": 40.0},
              "goodput": {"requests_per_s": 2.0}}
        return {"max_load": 2 if spec else 4, "at_max_load": at, "probes": [], "stopped": "stand-in"}


def test_a_per_class_tune_says_each_classs_acceptance_and_crossover(smol, tmp_path, monkeypatch):
    from infertool.tune.classes import run_per_class, summary_lines
    from infertool.tune.records import RoutingTable
    from tests.test_tune_classes import classed_recipe

    data = classed_recipe(smol, tmp_path, names=("listcopy", "story"))
    data["tune"].update(candidates=[{"backend": "llmcompressor", "scheme": "W8A8", "bits": 8}],
                        serve_grid={"max_num_seqs": [8], "speculative": [None, NGRAM]})
    r = validate_recipe_data(data)
    spec_id = next(t.id for t in space.trials(r) if t.serve["speculative"] is not None)
    ClassSpecStand(monkeypatch)
    per = run_per_class(r)
    d = Path(per.tune_dir)
    table = RoutingTable.from_dict(json.loads((d / "routing.json").read_text()))
    for route in table.classes:
        (s,) = route.speculation
        assert s.trial == spec_id and s.acceptance_per_pos == pytest.approx(ClassSpecStand.ACCEPTED[route.name])
        assert s.crossover.found and (s.crossover.above, s.crossover.below) == (2, 4)
        assert s.levels is None  # routing.json keeps the figures; the levels are in the class's tune.json
        own = TuneDoc.from_dict(json.loads((d / "classes" / route.name / "tune.json").read_text()))
        assert [lv.load for lv in own.trial(spec_id).speculation.levels] == [1, 2, 4, 8]
        assert "Speculation, measured" in (d / "classes" / route.name / "tune.md").read_text()
    lines = summary_lines(table)
    assert any(line.startswith(f"class listcopy, ngram k=2 lookup 2-4 (trial {spec_id}): accepted by draft position "
                               "0.90 / 0.80") and "between concurrency 2 (pays) and 4 (loses)" in line for line in lines)
    assert any(line.startswith("class story, ngram k=2") and "0.20 / 0.10" in line for line in lines)
