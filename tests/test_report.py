"""The report decides: its first section names what was compared (ModelRef labels, never a cache path or
"model"), what the candidate gains (weights; served tok/s and $ per 1M output tokens of both, measured in the
same run), what it costs (the gates with their intervals), the verdict and what to try next. `run`'s bench
measures the original beside the candidate; `compare` keeps working; whatever a recipe or a model says is
escaped in Markdown and HTML."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from infertool import pipeline
from infertool.bench.results import BenchReport
from infertool.decision import RunData, next_steps, speed, summarize
from infertool.evaluate.verdict import Gate
from infertool.report import RecipeChange, compare, compare_runs, md_escape, write_report
from tests.report_fixture import CANDIDATE, ORIGINAL, _bench_report, _level, make_run_dir

CACHE_HASH = "cc951d3e"


def _report(tmp_path, **kw) -> tuple[str, str, Path]:
    run = make_run_dir(tmp_path / "runs", **kw)
    res = write_report(run)
    return Path(res.files["report.md"]).read_text(), Path(res.files["report.html"]).read_text(), run


def _section(md: str, title: str) -> str:
    start = md.index(f"## {title}")
    nxt = md.find("\n## ", start + 3)
    return md[start: nxt if nxt != -1 else None]


def test_summary_comes_first_and_decides_a_failing_candidate(tmp_path):
    md, page, _ = _report(tmp_path, verdict="FAIL")
    assert md.split("\n## ")[1].startswith("Summary: do not ship the candidate")
    s = _section(md, "Summary")
    # what was compared, named as a person names it
    assert f"the original **{md_escape(ORIGINAL)}** and the candidate **{md_escape(CANDIDATE)}**" in s
    # what it gains: weights from quantize, tok/s and $/1M of BOTH at the same level, with the ratio
    assert "| weight bytes | 269,030,016 | 112,394,496 | 0.42x |" in s
    assert "| output tokens/s at concurrency 8 | 61 | 96 | 1.57x |" in s
    assert "| $ per 1M output tokens at concurrency 8 | $2.277 | $1.447 | 0.64x |" in s
    assert "same traffic (16 requests per load level" in s and "TTFT ≤ 2,000 ms, TPOT ≤ 200 ms" in s
    assert "the original ran with --dtype float32 and the candidate with --dtype auto" in s
    # what it costs: the gates with their intervals; the verdict; what to try next (8-bit first: far beyond)
    assert "| max_mean_kld | 0.183 | 0.171 .. 0.196 | 0.05 | FAIL |" in s
    assert "**Verdict: FAIL**" in s
    steps = re.findall(r"^- (.*)$", s, re.M)
    assert steps[0].startswith("8-bit: on a CPU that is W8A8 int8 through llm-compressor")
    assert any("quantize.group_size: 32 (now 64" in x for x in steps) and any("AWQ" in x for x in steps)
    # the HTML has the same first section, with an id the browser test looks for
    assert page.index('<section id="summary">') < page.index('<section id="run">') < page.index('<section id="bench">')


@pytest.mark.parametrize("verdict,compared,title,phrase", [
    ("PASS", True, "ship the candidate", "serves 1.57x the output tokens/s of the original at concurrency 8, 0.64x the $ per 1M"),
    ("INCONCLUSIVE", True, "not decided yet", "cannot yet tell whether the candidate stays within max_mean_kld and min_top1"),
    ("PASS", False, "passes, but not served here", "vLLM on this host loads the candidate but cannot run it"),
])
def test_summary_for_each_outcome(tmp_path, verdict, compared, title, phrase):
    md, _, _ = _report(tmp_path, verdict=verdict, compared=compared)
    s = _section(md, "Summary")
    assert s.startswith(f"## Summary: {title}") and phrase in s.replace("\\", "")
    if not compared:  # the one fallback: nothing to compare, measured, and said
        assert "Speed: nothing to compare, measured: vLLM on this host loads the candidate but cannot run it" in s
        assert "output tokens/s at" not in s
    if verdict == "INCONCLUSIVE":
        assert "eval.max_items: 204 (now 24)" in s
    if verdict == "PASS":
        assert "Next to try" not in s


def test_no_cache_hash_and_no_bare_model_as_a_name(tmp_path):
    md, page, run = _report(tmp_path)
    for text in (md, page):
        assert CACHE_HASH not in text
        assert "model model" not in text and "roofline: /" not in text
    assert f"candidate: **{md_escape(CANDIDATE)}** (vLLM name `quickstart-gptq`)" in md
    assert f"original: **{md_escape(ORIGINAL)}** (vLLM name `smollm2-135m`)" in md
    assert f"profiled: **{md_escape(ORIGINAL)}**" in md


def test_plot_titles_name_models_by_label():
    from infertool.bench.plot import mpl_text, plot_title
    from infertool.profile.core import ProfileResult, roofline_title

    cand = _bench_report(CANDIDATE, "model", [])
    assert plot_title(cand) == f"latency vs throughput: {CANDIDATE}"
    both = {**cand, "original": _bench_report(ORIGINAL, "smollm2-135m", [])}
    assert plot_title(both) == f"latency vs throughput\ncandidate: {CANDIDATE}\noriginal: {ORIGINAL}"
    assert plot_title({"model": "served-name"}) == "latency vs throughput: served-name"  # `bench --url`: the server's name
    assert mpl_text("a $5 model") == r"a \$5 model"
    prof = ProfileResult(model={"label": ORIGINAL, "source": "/home/x/models/cc951d3e/model"}, device={"name": "EPYC"},
                         peaks={}, points=[], analytic={}, crossover_batch=None, verdicts={}, advice=[], nvml={},
                         nsys=None, out_dir=None, plot=None, seconds=0)
    assert roofline_title(prof) == f"roofline: {ORIGINAL} on EPYC"


def test_everything_from_a_recipe_or_model_is_escaped(tmp_path):
    evil_model = "<img src=x onerror=alert(1)> **bold** | pipe\n## heading [link](http://x)"
    md, page, _ = _report(tmp_path, recipe_name="<script>alert(1)</script>", original=evil_model,
                          candidate="GPTQ 4-bit of <b>evil</b> `tick`")
    assert "<script>alert(1)" not in page and "<img src=x" not in page and "<b>evil</b>" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page and "&lt;img src=x onerror=alert(1)&gt;" in page
    # Markdown: no raw HTML, no emphasis, no link, no heading, no extra table cell from the model's name
    outside_code = re.sub(r"`[^`\n]*`", "", md)  # a code span shows its text as it is
    assert not re.search(r"(?<!\\)<(img|script|b>)", outside_code)
    assert "\n## heading" not in md and "**bold**" not in md
    assert "\\[link\\](http://x)" in md and not re.search(r"(?<!\\)\[link", md)
    from infertool.report import md_table

    assert md_table([["a|b"], ["<i>x</i>"]]) == "| a\\|b |\n|---|\n| \\<i>x\\</i> |"  # a cell cannot split a row
    assert md_escape("a_b _c_ x|y <z> *w* `v`") == "a_b \\_c\\_ x\\|y \\<z> \\*w\\* \\`v\\`"


def test_compare_keeps_working_with_both_arms(tmp_path):
    a = make_run_dir(tmp_path / "a", verdict="FAIL")
    b = make_run_dir(tmp_path / "b", verdict="PASS", group_size=32)
    cmp = compare(a, b)
    assert RecipeChange("quantize.group_size", 64, 32) in cmp.recipe_changes
    rows = {r.metric: r for r in cmp.rows}
    assert rows["eval.verdict"].a == "FAIL" and rows["eval.verdict"].b == "PASS"
    assert rows["model.candidate"].a == CANDIDATE and rows["model.original"].b == ORIGINAL
    assert rows["bench.original.concurrency 8.output_tok_s"].a == 61.0
    assert rows["bench.concurrency 8.candidate_over_original.output_tok_s"].a == pytest.approx(96 / 61)
    # weights: 269,030,016 -> 112,394,496 bytes in both; the cost per 1M at concurrency 8: 0.5 $/h over 96 tok/s
    assert rows["quantize.weight_bytes_after"].ratio == 1.0 and not rows["quantize.weight_bytes_after"].changed
    assert rows["bench.concurrency 8.cost_per_1m_output_tokens"].a == pytest.approx(0.5 / 3600 / 96 * 1e6)
    assert compare_runs(a, b) == cmp.to_dict()  # the old entry point: the same JSON
    from tests.conftest import run_cli

    r = run_cli("compare", str(a), str(b), "--json")
    assert r.returncode == 0, r.stderr
    assert {"field": "quantize.group_size", "a": 64, "b": 32} in json.loads(r.stdout)["recipe_changes"]
    r = run_cli("compare", str(a), str(b))
    assert r.returncode == 0 and "quantize.group_size" in r.stdout and "eval.verdict" in r.stdout, r.stderr


# ------------------------------------------------------------------------------------------ older and crafted runs
FIXTURE = Path(__file__).parent / "fixtures" / "main-dc2865d"


def test_a_run_written_before_the_typed_records_still_renders(tmp_path):
    """bench.json and profile.json as main's code wrote them at dc2865d, in a run directory of that time."""
    run = tmp_path / "old-run"
    for stage, name in (("bench", "bench.json"), ("profile", "profile.json")):
        (run / stage).mkdir(parents=True)
        (run / stage / name).write_text((FIXTURE / name).read_text())
    (run / "manifest.json").write_text(json.dumps({
        "recipe_name": "old", "recipe": {"model": {"source": ORIGINAL}, "bench": {}, "profile": {}},
        "stages": {"profile": {"status": "done", "seconds": 30.0}, "bench": {"status": "done", "seconds": 80.0}}}))
    md = Path(write_report(run).files["report.md"]).read_text()
    assert _section(md, "Summary").startswith("## Summary: no quantization to decide")
    assert f"Served: **{md_escape(ORIGINAL)}**." in md
    bench = _section(md, "Bench")  # figures of bench.json's levels, as _fmt shows them (3 significant digits)
    assert f"served: **{md_escape(ORIGINAL)}** (vLLM name `m`), endpoint completions" in bench
    assert "| concurrency 1 | 27.8 | 464 | 2.27 | 3.34 | 7.15 | 2.06 | 1 | 1.5 | 0 |" in bench  # TTFT p50, p90, p99
    assert "| concurrency 4 | 114 | 1,687 | 2.37 | 4.59 | 7.29 | 2.2 | 1 | 0.412 | 0 |" in bench
    assert "| rate 20/s | 17.4 | 285 | 1.42 | 2.94 | 4.21 | 2.01 | 1 | 2.44 | 0 |" in bench
    prof = _section(md, "Profile")  # 4.3278 s = 4,328 ms; MBU 0.0064 = 1 %, MFU 0.052 = 5 %
    assert f"profiled: **{md_escape(ORIGINAL)}** on AMD EPYC" in prof
    assert "peaks: 10 GB/s, 76.6 GFLOP/s (bfloat16)" in prof
    assert "| prefill | 64 tokens | 4,328 | 1% | 5% | overhead-bound | high |" in prof
    assert "| decode | batch 4 @ 66 | 296 | 9% | 5% | overhead-bound | high |" in prof
    assert "| profile | done | 30 |  |" in _section(md, "Run")
    from infertool.profile.core import ProfileResult

    raw = json.loads((FIXTURE / "profile.json").read_text())  # a point read back and written again: the same layout
    assert [p.to_dict() for p in ProfileResult.from_dict(raw).points] == raw["points"]


@pytest.mark.parametrize("manifest", [[], "a string", None, 7, {"stages": []}, {"stages": "x", "recipe": [1]},
                                      {"stages": {"eval": "x", "bench": {"summary": [1], "status": 3}}},
                                      {"recipe": "x", "target": [], "envs": [1], "resolution": "y", "recipe_name": 5}])
def test_a_crafted_manifest_reads_as_not_measured(tmp_path, manifest):
    run = tmp_path / "run"
    run.mkdir()
    (run / "manifest.json").write_text(json.dumps(manifest))
    md = Path(write_report(run).files["report.md"]).read_text()
    assert md.split("\n## ")[1].startswith("Summary: no quantization to decide")
    assert "environments: none recorded" in md and "| stage | status | seconds | key |" in md
    assert "| eval |" not in md  # a stage whose record is not an object: no row
    from tests.conftest import run_cli

    r = run_cli("report", str(run), "--json")
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    r = run_cli("compare", str(run), str(run), "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["recipe_changes"] == [], r.stderr


def test_quantize_section_reads_each_agreement_record(tmp_path):
    """The load check's agreement as token_agreement writes it ({"agreement": 0.81, ...}) or as a bare number (an
    older quantize.json), and the agreement a backend measured in its own kernels."""
    run = make_run_dir(tmp_path / "runs")
    q = _section(Path(write_report(run).files["report.md"]).read_text(), "Quantize")
    assert "weights 269,030,016 -> 112,394,496 bytes (58.2% smaller)" in q
    assert "vLLM load check: loaded=True, generated=True, greedy token agreement with the original 0.81" in q
    _rewrite(run / "quantize" / "quantize.json", lambda d: d.update(
        verify={"loaded": True, "generated": False, "agreement": 0.75, "reason": "no int4 GEMM"},
        local_agreement={"engine": "gptqmodel", "agreement": 0.9375, "tokens": 64}))
    q = _section(Path(write_report(run).files["report.md"]).read_text(), "Quantize")
    assert "vLLM load check: loaded=True, generated=False, greedy token agreement with the original 0.75 (no int4 GEMM)" in q
    assert "greedy token agreement (gptqmodel): 0.938 over 64 tokens" in q


def _rewrite(path: Path, change) -> None:
    doc = json.loads(path.read_text())
    change(doc)
    path.write_text(json.dumps(doc))


def test_values_of_the_wrong_type_read_as_not_measured(tmp_path):
    """Every stage file of a realistic run, with values of the wrong type where the report reads them: each
    reads as not measured ("–", or the line left out), the rest of the report as before."""
    run = make_run_dir(tmp_path / "runs", verdict="FAIL")

    def bench(d):
        d["original"]["levels"][1]["summary"]["output_token_throughput"] = "fast"  # concurrency 8 of the original
        d["levels"][0]["summary"]["ttft_ms"] = [1, 2]
        d["levels"][0]["level"]["label"] = 5  # a level name that is not a string: no row to compare
        d["settings"]["slo"] = "tight"
        d["servers"] = [{"argv": "python -m vllm --dtype float16"}]
        d["notes"] = ["a note", {"not": "text"}]

    def results(d):
        d["gates"].append({"name": 7, "status": "FAIL", "estimate": 9.0})  # a gate name that is not a string
        d["gates"].append("max_mean_kld")
        d["files"]["kld_histogram"] = 12  # a figure name that is not a string
        d["settings"]["accept"]["confidence"] = "high"

    def profile(d):
        d["points"][0] = "prefill"
        d["points"][1].update(seconds="slow", mbu=None, batch=[8])
        d["peaks"] = None
        d["model"] = "a model"

    _rewrite(run / "bench" / "bench.json", bench)
    _rewrite(run / "eval" / "results.json", results)
    _rewrite(run / "profile" / "profile.json", profile)
    _rewrite(run / "quantize" / "quantize.json",
             lambda d: d.update(size={"weight_bytes_before": "big", "weight_bytes_after": 112}, verify=[1], local_agreement=3))
    _rewrite(run / "manifest.json", lambda d: d["stages"]["serve"]["summary"].update(smoke="hi", ready_s="soon"))
    md = Path(write_report(run).files["report.md"]).read_text()
    s = _section(md, "Summary")
    assert s.startswith("## Summary: do not ship the candidate")
    assert "it fails the max_mean_kld and min_top1 gates (the whole interval beyond the threshold)." in s
    assert "although" not in s  # the original's throughput at concurrency 8 is not a number: no speed-up claimed
    assert "| weight bytes |" not in s
    assert "| output tokens/s at concurrency 8 | – | 96 | – |" in s
    assert "| $ per 1M output tokens at concurrency 8 | $2.277 | $1.447 | 0.64x |" in s  # 0.5 $/h over 61 and 96 tok/s
    assert "and SLO (none set), the machine at $0.50 per hour" in s and "--dtype" not in s
    assert "| max_mean_kld | 0.183 | 0.171 .. 0.196 | 0.05 | FAIL |" in s and "| interval (95%) |" in s
    assert "| 7 |" not in md and "None" not in s and "| None |" not in _section(md, "Eval: FAIL")
    assert "![kld_histogram]" not in md and "![roofline]" in md
    assert ': {"weight_bytes_before": "big", "weight_bytes_after": 112}' in _section(md, "Quantize")
    assert "vLLM load check" not in md and "greedy token agreement (" not in md
    prof = _section(md, "Profile")
    assert "| prefill | 512 tokens | – | – | 30% | compute-bound | high |" in prof and "| prefill | 128 tokens |" not in prof
    assert f"profiled: **{md_escape(ORIGINAL)}**" in prof and "peaks: – GB/s, – GFLOP/s (None)" in prof
    assert "ready in None s; smoke completion of None: None" in _section(md, "Serve")
    bench_md = _section(md, "Bench")
    assert "| concurrency 8 | 1.5 | 96 | 650 | 845 | 1,040 | 78 | 1 | 1.45 | 0 |" in bench_md
    assert "|  | 0.328 | 21 | – | – | – | 46 | 1 | 6.61 | 0 |" in bench_md  # the level whose label is 5
    assert "note: a note" in bench_md and "not" not in bench_md.split("note: a note")[1].split("\n")[0]
    rows = {r.metric: r for r in compare(run, run).rows}
    assert rows["bench.original.concurrency 8.output_tok_s"].a is None and rows["eval.max_mean_kld"].a == 0.183


def test_tune_report_reads_trials_by_attribute():
    """tune.md's table: the mean-KLD gate's interval and the cost at the largest load meeting the SLO, from the
    trial's records; a gate or a bench summary of the wrong shape reads as "-"."""
    from infertool.tune.records import TuneDoc
    from infertool.tune.report import trial_rows

    kld = {"name": "max_mean_kld", "metric": "mean KLD", "threshold": 0.05, "estimate": 0.031, "lo": 0.028, "hi": 0.034,
           "status": "PASS", "n": 6000}
    trials = [{"id": "t1", "candidate": {"label": "GPTQ 4-bit"}, "serve": {"max_num_seqs": 8}, "status": "done",
               "accuracy": {"verdict": "PASS", "items": 24, "gates": ["max_mean_kld", {"name": 3}, kld], "mean_kld": 0.03},
               "capacity": {"max_load": 8, "at_max_load": {"cost": {"cost_per_hour": 0.5, "per_1m_output_tokens": 1.25}}}},
              {"id": "t2", "candidate": {"label": "AWQ 4-bit"}, "status": "done",
               "accuracy": {"verdict": "FAIL", "gates": [{**kld, "lo": None}], "mean_kld": 0.2},
               "capacity": {"max_load": 4, "at_max_load": {"cost": "cheap"}}}]
    rows = trial_rows(TuneDoc.from_dict({"recipe": "r", "winner": "t1", "trials": trials}))
    assert rows[1][:11] == ["t1", "GPTQ 4-bit", "max_num_seqs=8", "PASS", "0.031 [0.028, 0.034]", "24", "8", "-",
                            "1.25", "-", "done (winner)"]  # no throughput recorded: "-"
    assert rows[2][3:9] == ["FAIL", "0.2", "-", "4", "-", "-"]  # no interval: the mean KLD; a cost that is not a number


# ------------------------------------------------------------------------------------------ next steps
GATE_KLD = Gate.from_dict({"name": "max_mean_kld", "threshold": 0.05, "status": "FAIL", "estimate": 0.06, "lo": 0.055,
                           "hi": 0.065, "n": 1000})
Q4 = {"method": "gptq", "backend": "gptqmodel", "bits": 4, "group_size": 128, "desc_act": False,
      "calibration": {"samples": 256}}


def _gate(g: Gate, **changes) -> Gate:
    return Gate.from_dict({**g.to_dict(), **changes})


def test_next_steps_follow_the_failed_gate_and_the_quantization():
    near = next_steps("FAIL", [GATE_KLD], Q4, target_kind="gpu")
    # just beyond the gate: finer 4-bit settings first, 8-bit last; GPU 8-bit is weight-only bits 8
    assert near[0].startswith("a smaller group size: quantize.group_size: 64 (now 128")
    assert "quantize.desc_act: true" in near[1] and near[2].startswith("AWQ")
    assert near[-1].startswith("8-bit: quantize.bits: 8")
    assert not any("calibration" in s for s in near)  # 256 samples already
    far = next_steps("FAIL", [_gate(GATE_KLD, estimate=0.2, lo=0.18, hi=0.22)], {**Q4, "group_size": 32}, target_kind="cpu")
    assert far[0].startswith("8-bit: on a CPU that is W8A8 int8 through llm-compressor")
    assert not any("group size" in s for s in far)  # 32 is as small as it goes
    awq = next_steps("FAIL", [GATE_KLD], {"method": "awq", "bits": 4, "group_size": 64})
    assert any(s.startswith("GPTQ: quantize.method: gptq") for s in awq)
    eight = next_steps("FAIL", [GATE_KLD], {"method": "gptq", "backend": "llmcompressor", "scheme": "W8A8", "bits": 8},
                       target_kind="cpu")
    assert len(eight) == 1 and "8-bit already fails" in eight[0] and "serve.model: original" in eight[0]
    acc = next_steps("FAIL", [Gate.from_dict({"name": "max_flip_rate", "threshold": 0.1, "status": "FAIL", "estimate": 0.15})], Q4)
    assert acc[0].startswith("the failing gates are task accuracy (max_flip_rate)")
    top1 = next_steps("FAIL", [Gate.from_dict({"name": "min_top1", "threshold": 0.9, "status": "FAIL", "estimate": 0.7})], Q4)
    assert top1[0].startswith("8-bit")  # 30 % disagreement against 10 % allowed: far beyond
    assert next_steps("PASS", [], Q4) == [] and next_steps("FAIL", [GATE_KLD], None) == []
    here = next_steps("FAIL", [GATE_KLD], Q4, not_served_here="no int4 GEMM")
    assert here[0].startswith("this host cannot serve the 4-bit candidate (no int4 GEMM)") and here[1].startswith("8-bit")


def test_next_steps_when_inconclusive():
    g = Gate.from_dict({"name": "max_mean_kld", "threshold": 0.05, "status": "INCONCLUSIVE", "estimate": 0.052, "lo": 0.046,
                        "hi": 0.058, "n": 3000, "n_needed": 9000, "unit": "tokens"})
    steps = next_steps("INCONCLUSIVE", [g], Q4, eval_section={"max_items": 24})
    assert steps[0] == ("more eval items: about 9,000 tokens would decide max_mean_kld (now 3,000): eval.max_items: 72 "
                        "(now 24), or a larger suite if this one has fewer")
    assert steps[1].startswith("max_mean_kld: the estimate is already beyond the threshold") and "a smaller group size" in steps[1]
    on = next_steps("INCONCLUSIVE", [_gate(g, n_needed=None, estimate=0.05)], Q4, eval_section={})
    assert on == ["max_mean_kld: the estimate sits on its threshold (0.05): more items will not decide it; decide the "
                  "threshold itself (eval.accept.max_mean_kld)"]
    whole = next_steps("INCONCLUSIVE", [_gate(g, estimate=0.049)], Q4, eval_section={"max_items": None})
    assert whole == ["more eval items: about 9,000 tokens would decide max_mean_kld (now 3,000): a larger suite (every "
                     "item of this one is scored now)"]


def test_a_slower_candidate_is_not_shipped_for_speed():
    run = RunData.of({"recipe": {"quantize": {"method": "gptq"}}},
                     quantize={"size": {"weight_bytes_before": 100, "weight_bytes_after": 30}},
                     eval={"verdict": "PASS", "gates": []},
                     bench={**_bench_report(CANDIDATE, "c", [_level("concurrency", 8, 40.0, 900, 150, 1.0)]),
                            "original": _bench_report(ORIGINAL, "o", [_level("concurrency", 8, 60.0, 700, 110, 1.0)])})
    s = summarize(run)
    assert s.decision.ship is None and s.decision.title == "passes, but saves memory only"
    assert "serves only 0.67x the output tokens/s" in s.decision.text and "0.30x the weight bytes" in s.decision.text
    assert speed(BenchReport.from_dict({"levels": []})).status == "not measured"
    no_q = summarize(RunData.of({"recipe": {}}, bench=_bench_report(ORIGINAL, "o", [])))
    assert no_q.decision.title == "no quantization to decide" and no_q.names.candidate is None


# ------------------------------------------------------------------------------------------ run's bench stage
def _recipe(tmp_path, **sections):
    from tests.test_pipeline import recipe

    return recipe(tmp_path, **sections)


def _fake_bench(monkeypatch):
    """The bench's measuring of one server configuration (``bench.core.sweep_report``), faked: each call noted."""
    from infertool.bench import core as bench_run

    calls = []

    def fake(plan, ctx):
        res, who = plan.res, plan.options.serve_model or plan.res.served
        calls.append({"label": who.label, "path": who.path, "arm": plan.options.arm,
                      "experiments": plan.options.experiments, "bench": res.recipe.bench.model_dump(),
                      "serve": res.serve_for(who)[0].model_dump()})
        tok = 96.0 if who.role == "candidate" else 61.0
        return bench_run.BenchReport(url="http://127.0.0.1:1/v1", model=who.name, endpoint="completions",
                                     settings=_bench_report("x", "x", [])["settings"],
                                     levels=[_level("concurrency", 1, tok / 4, 200, 50, 1.0), _level("concurrency", 8, tok, 700, 90, 1.0)],
                                     label=who.label)

    monkeypatch.setattr(bench_run, "sweep_report", fake)
    return calls


def _ctx(tmp_path, r, quantized: dict | None):
    from infertool.stages import StageContext, StageOutput
    from infertool.summaries import QuantizeSummary
    from tests.test_models import LLAMA_CFG, make_fake_model

    upstream = {}
    if quantized is not None:
        qdir = tmp_path / "stage-quantize"
        make_fake_model(qdir / "model", {**LLAMA_CFG, "quantization_config": {"quant_method": "gptq", "bits": 4}},
                        {"w": ("I32", [8])}, {"I32": 4})
        if quantized:
            (qdir / "model" / "infertool-manifest.json").write_text(json.dumps(quantized))
        upstream["quantize"] = StageOutput(qdir, QuantizeSummary())
    work = tmp_path / "work"
    work.mkdir()
    return StageContext(r, tmp_path, work, upstream, None)


def _bench_stage(ctx):
    from infertool import stages

    return stages.get("bench").run(ctx)


def test_run_bench_stage_measures_the_candidate_and_the_original(tmp_path, monkeypatch):
    calls = _fake_bench(monkeypatch)
    r = _recipe(tmp_path, quantize={"method": "gptq", "group_size": 64}, serve={}, bench={"concurrency": [1, 8], "cost_per_hour": 0.5})
    ctx = _ctx(tmp_path, r, {})
    summary = _bench_stage(ctx)
    cand, orig = calls
    assert cand["arm"] == "candidate" and cand["experiments"] is True and cand["label"].startswith("GPTQ 4-bit g64 (gptqmodel) of ")
    assert orig["arm"] == "original" and orig["experiments"] is False and orig["path"] == str(tmp_path / "m")
    assert orig["label"] == str(tmp_path / "m")  # the base's label: its source
    assert cand["bench"] == orig["bench"]  # the same traffic and SLO
    assert {k: v for k, v in cand["serve"].items() if k != "dtype"} == {k: v for k, v in orig["serve"].items() if k != "dtype"}
    doc = json.loads((ctx.work / "bench.json").read_text())
    assert doc["label"] == cand["label"] and doc["original"]["label"] == orig["label"]
    assert doc["served"] == {"label": cand["label"], "origin": "candidate"}
    row = doc["comparison"]["rows"][1]
    assert row["level"] == "concurrency 8" and row["figures"]["output_token_throughput"]["ratio"] == pytest.approx(96 / 61)
    assert row["figures"]["cost_per_1m_output_tokens"]["ratio"] == pytest.approx(61 / 96)
    assert (ctx.work / "latency_throughput.png").is_file()
    assert summary.comparison["rows"] and summary.original


def test_run_bench_stage_fallback_and_no_quantize(tmp_path, monkeypatch):
    calls = _fake_bench(monkeypatch)
    r = _recipe(tmp_path, quantize={"method": "gptq", "group_size": 64}, bench={})
    ctx = _ctx(tmp_path, r, {"verify": {"loaded": True, "generated": False, "reason": "no cpu_gemm_wna16 on AVX2"}})
    _bench_stage(ctx)
    assert [c["arm"] for c in calls] == ["sweep"] and calls[0]["path"] == str(tmp_path / "m")  # the original, once
    doc = json.loads((ctx.work / "bench.json").read_text())
    assert "original" not in doc and doc["served"]["origin"] == "original"
    assert doc["comparison"]["nothing_to_compare"].startswith(
        "vLLM on this host loads the candidate but cannot run it (no cpu_gemm_wna16 on AVX2)")
    calls.clear()
    plain = _recipe(tmp_path / "p", bench={})
    ctx = _ctx(tmp_path / "p", plain, None)
    _bench_stage(ctx)
    doc = json.loads((ctx.work / "bench.json").read_text())
    assert len(calls) == 1 and "comparison" not in doc and "original" not in doc


def test_bench_key_changes_with_what_is_measured(tmp_path):
    inputs = {"model": {"identity": "m"}, "prompts": {"builtin": "x"}}
    host = {"accelerator": "cpu", "cpu_isa": "avx512"}

    from infertool import stages

    def key(**sections):
        r = _recipe(tmp_path, bench={}, **sections)
        chosen = [stages.get(n) for n in pipeline.selected_stages(r, None)]
        return stages.keys(r, chosen, inputs, host)["bench"]

    q = {"method": "gptq", "group_size": 64}
    with_q, without_q = key(quantize=q), key()
    assert with_q != without_q
    assert key(quantize=q, serve={"model": "original"}) != key(quantize=q, serve={"model": "quantized"})
    assert key(quantize=q, model={"source": str(tmp_path / "m"), "dtype": "float16"}) != with_q  # the original is served too
    assert key(quantize=q) == with_q  # and stable
    assert stages.get("bench").key({}, {}, {}, {}) != stages.get("serve").key({}, {}, {}, {})


def test_run_dry_run_shows_the_original_launch(tmp_path, monkeypatch):
    monkeypatch.setenv("INFERTOOL_HOME", str(tmp_path / "home"))
    r = _recipe(tmp_path, quantize={"method": "gptq", "group_size": 64}, serve={}, bench={})
    plan = pipeline.plan_pipeline(r, out_dir=tmp_path / "runs")
    assert list(plan.launches) == ["serve", "bench: the sweep", "bench: the original"]
    orig = plan.launches["bench: the original"]
    assert orig["model"] == str(tmp_path / "m") and orig["model_role"] == "base"
    assert plan.launches["bench: the sweep"]["model_role"] == "candidate"
    plain = pipeline.plan_pipeline(_recipe(tmp_path, serve={}, bench={}), out_dir=tmp_path / "runs")
    assert "bench: the original" not in plain.launches


def test_a_failing_original_arm_is_named(tmp_path, monkeypatch):
    from infertool.bench import core as bench_run
    from infertool.errors import RuntimeFailure

    calls = _fake_bench(monkeypatch)
    fake = bench_run.sweep_report

    def flaky(plan, ctx):
        if plan.options.arm == "original":
            raise RuntimeFailure("vLLM exited: out of memory")
        return fake(plan, ctx)

    monkeypatch.setattr(bench_run, "sweep_report", flaky)
    r = _recipe(tmp_path, quantize={"method": "gptq", "group_size": 64}, bench={})
    with pytest.raises(RuntimeFailure) as ei:
        _bench_stage(_ctx(tmp_path, r, {}))
    assert ei.value.message == f"measuring the original ({tmp_path / 'm'}) beside the candidate: vLLM exited: out of memory"
    assert [c["arm"] for c in calls] == ["candidate"]


def test_run_directory_svg_and_names_cannot_script_the_page(tmp_path):
    """A kld_histogram.svg that carries a script and event handlers, and a manifest whose recipe_name is a
    script: report.html embeds the figure only as an <img> data: URI (an SVG shown as an image runs no script
    and loads nothing), and escapes every name."""
    import base64

    run = make_run_dir(tmp_path / "runs", recipe_name="<script>alert('name')</script>")
    svg = next((run / "eval").glob("*.svg"))
    evil = ('<svg xmlns="http://www.w3.org/2000/svg" onload="alert(1)"><script>alert(2)</script>'
            '<a href="javascript:alert(3)"><rect width="9" height="9"/></a>'
            '<foreignObject><iframe src="javascript:alert(4)"></iframe></foreignObject></svg>')
    svg.write_text(evil)
    page = Path(write_report(run).files["report.html"]).read_text()
    for live in ("<script", "onload=", "javascript:", "<foreignObject", "<iframe", "<svg"):
        assert live not in page, live
    assert "&lt;script&gt;alert(&#x27;name&#x27;)&lt;/script&gt;" in page
    b64 = base64.b64encode(evil.encode()).decode()
    assert f'src="data:image/svg+xml;base64,{b64}"' in page  # the figure, whole, as an image
