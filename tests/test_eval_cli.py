"""`infertool eval` through the real CLI (subprocesses), suites, lm-eval export, and the openai engine
against a tiny local stub server (stdlib http.server on a free port): fast, no managed environments."""

from __future__ import annotations

import json
import threading
from http.server import ThreadingHTTPServer
from pathlib import Path

import pytest
import yaml

from conftest import run_cli
from infertool.data import suites
from infertool.evaluate import synth
from tests.fakes import JSONHandler

ROOT = Path(__file__).resolve().parents[1]


# ------------------------------------------------------------------------------------ stub server


class _Stub(JSONHandler):
    """An OpenAI-compatible stub. Token i of a prompt is the id it was given; model 'noisy' shifts the
    log-probabilities of odd ids; mode 'nologprobs' answers completions without prompt log-probabilities
    (like llama.cpp's server did in issue #27174)."""

    mode = "ok"

    def do_GET(self):
        if self.path == "/v1/models":
            return self._send({"data": [{"id": "a"}, {"id": "noisy"}]})
        self._send({"error": "not found"}, 404)

    def do_POST(self):
        req = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if self.path == "/tokenize":
            return self._send({"tokens": [ord(ch) % 500 for ch in req["prompt"]]})
        if self.path != "/v1/completions":
            return self._send({"error": "not found"}, 404)
        prompt = req["prompt"]
        if not req.get("echo"):
            return self._send({"choices": [{"text": " 42\nmore", "logprobs": None}]})
        if self.mode == "nologprobs":
            return self._send({"choices": [{"text": "x", "logprobs": None}], "usage": {"prompt_tokens": 3}})
        ids = prompt if isinstance(prompt, list) else [ord(ch) % 500 for ch in prompt]
        noisy = req["model"] == "noisy"
        toks, lps, tops, offs = [], [], [], []
        for pos, t in enumerate(ids):
            p = -1.0 - (t % 7) / 10 - (0.3 if noisy and t % 2 else 0.0)
            toks.append(str(t))
            offs.append(pos)
            lps.append(None if pos == 0 else p)
            alt = "alt" if not (noisy and t % 3 == 0) else "alt2"
            tops.append(None if pos == 0 else {str(t): p, alt: -2.5})
        toks.append("gen")
        lps.append(-0.1)
        tops.append({"gen": -0.1})
        offs.append(len(ids))
        self._send({"choices": [{"text": "gen", "logprobs": {"tokens": toks, "token_logprobs": lps,
                                                            "top_logprobs": tops, "text_offset": offs}}],
                    "usage": {"prompt_tokens": len(ids)}})


@pytest.fixture
def stub_server():
    servers = []

    def start(mode: str = "ok") -> str:
        handler = type("Handler", (_Stub,), {"mode": mode})
        srv = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        threading.Thread(target=srv.serve_forever, daemon=True).start()
        servers.append(srv)
        return f"http://127.0.0.1:{srv.server_address[1]}/v1"

    yield start
    for srv in servers:
        srv.shutdown()
        srv.server_close()


@pytest.fixture
def recipe(tmp_path) -> Path:
    p = tmp_path / "r.yaml"
    p.write_text("name: evaltest\nmodel:\n  source: bundled:smollm2-135m\neval:\n  seq_len: 64\n  batch_size: 4\n")
    return p


# ------------------------------------------------------------------------------------------ tests


def test_builtin_suites_load_and_synthetic_files_match_the_generator():
    names = {s.name for s in suites.list_builtin()}
    assert {"builtin-corpus", "synthetic-mc", "synthetic-gen"} <= names
    for name, content in synth.generate_files().items():
        assert (ROOT / "evals" / name).read_text(encoding="utf-8") == content, f"evals/{name} is stale: regenerate it"
    mc = suites.load_suite("synthetic-mc")
    ids = [it["id"] for t in mc.tasks for it in t.items]
    assert len(ids) == len(set(ids)) == 200
    corpus = suites.load_suite("builtin-corpus").tasks[0]
    assert corpus.meta["python_version"] and corpus.meta["chars"] > 100_000


def test_bad_suites_are_usage_errors(tmp_path):
    with pytest.raises(Exception) as e:
        suites.load_suite("synthetic-mcc")
    assert "did you mean 'synthetic-mc'" in e.value.hint
    bad = tmp_path / "bad.yaml"
    (tmp_path / "d.jsonl").write_text('{"id": "1", "question": "q", "choices": ["a", "b"], "answer": 5}\n')
    bad.write_text(yaml.safe_dump({"name": "bad", "tasks": [{"name": "t", "type": "multiple_choice", "data": "d.jsonl"}]}))
    with pytest.raises(Exception) as e:
        suites.load_suite(str(bad))
    assert "answer must be an index" in e.value.message


def test_generation_matching():
    assert suites.generation_correct(" 18, 51, 59 ", "18, 51, 59", "exact")
    assert not suites.generation_correct("18, 51, 59, 60", "18, 51, 59", "exact")
    assert suites.generation_correct("the answer is 42.", "42", "contains")
    assert suites.generation_correct("x = 42", r"\b42\b", "regex")


def test_eval_suites_command_lists_them():
    r = run_cli("eval", "suites", "--json")
    assert r.returncode == 0, r.stderr
    names = [s["name"] for s in json.loads(r.stdout)["suites"]]
    assert "builtin-corpus" in names and "synthetic-gen" in names


def test_export_lm_eval_writes_tasks_with_json_datasets(tmp_path):
    r = run_cli("eval", "export-lm-eval", "synthetic-mc", str(tmp_path / "lm"), "--json")
    assert r.returncode == 0, r.stderr
    res = json.loads(r.stdout)
    assert res["group"] == "infertool_synthetic_mc" and len(res["tasks"]) == 4
    cfg = yaml.safe_load((tmp_path / "lm" / "infertool_synthetic_mc_arithmetic.yaml").read_text())
    assert cfg["dataset_path"] == "json" and cfg["output_type"] == "multiple_choice"
    data = Path(cfg["dataset_kwargs"]["data_files"]["test"])
    rows = [json.loads(x) for x in data.read_text().splitlines()]
    assert len(rows) == 50 and {"id", "question", "choices", "answer"} <= set(rows[0])
    r = run_cli("eval", "export-lm-eval", "synthetic-gen", str(tmp_path / "lm2"))
    assert r.returncode == 0, r.stderr
    cfg = yaml.safe_load((tmp_path / "lm2" / "infertool_synthetic_gen_copying.yaml").read_text())
    assert cfg["output_type"] == "generate_until" and cfg["generation_kwargs"]["until"] == ["\n"]


def test_missing_candidate_is_a_usage_error(tmp_path):
    p = tmp_path / "r.yaml"
    p.write_text(f"name: x\nmodel:\n  source: {tmp_path}\n")
    (tmp_path / "config.json").write_text("{}")
    r = run_cli("eval", str(p))
    assert r.returncode == 2
    assert "no candidate model" in r.stderr and "--candidate" in r.stderr
    r = run_cli("eval", str(p), "--candidate", str(tmp_path / "nope"), "--json")
    assert r.returncode == 2 and json.loads(r.stdout)["ok"] is False


def test_openai_engine_without_prompt_logprobs_fails_loudly(stub_server, recipe, tmp_path):
    url = stub_server("nologprobs")
    r = run_cli("eval", str(recipe), "--engine", "openai", "--url", url, "--base", "a", "--candidate", "a",
                "--suite", "synthetic-mc", "--max-items", "3", "--out", str(tmp_path / "run"))
    assert r.returncode == 3, r.stdout + r.stderr
    assert "returned no prompt log-probabilities" in r.stderr and "chance" in r.stderr
    assert "verdict" not in r.stdout  # nothing was scored


def test_openai_engine_self_check_and_a_worse_model(stub_server, recipe, tmp_path):
    url = stub_server("ok")
    r = run_cli("eval", str(recipe), "--engine", "openai", "--url", url, "--base", "a", "--candidate", "a",
                "--max-items", "3", "--out", str(tmp_path / "self"), "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    t = doc["tasks"]["pydoc-topics"]
    assert doc["verdict"] == "PASS" and t["kld"]["mean"] == 0.0 and t["top1_agree"] == 1.0 and t["ppl_ratio"] == 1.0
    assert t["kld_kind"] == "top-20" and t["topk_covered_mass"]["mean"] > 0.3
    assert any("lower bound" in n for n in doc["notes"])
    assert (tmp_path / "self" / "items.jsonl").is_file()
    import xml.etree.ElementTree as ET

    svg = ET.parse(tmp_path / "self" / "kld_histogram.svg").getroot()  # well-formed XML
    bars = [e for e in svg.iter("{http://www.w3.org/2000/svg}rect")][1:]
    assert len(bars) == 30 and any("<1e-06: 189" in "".join(b.itertext()) for b in bars)  # all 189 tokens: KLD 0
    assert t["tokens"] == 3 * 63

    r = run_cli("eval", str(recipe), "--engine", "openai", "--url", url, "--base", "a", "--candidate", "noisy",
                "--max-items", "3", "--out", str(tmp_path / "noisy"), "--json")
    assert r.returncode == 1, r.stderr
    doc = json.loads(r.stdout)
    t = doc["tasks"]["pydoc-topics"]
    assert doc["verdict"] == "FAIL" and t["kld"]["mean"] > 0.001 and t["ppl_ratio"] > 1.0
    gates = {g["name"]: g for g in doc["gates"]}
    assert gates["max_ppl_ratio"]["status"] == "FAIL"

    # multiple choice and generation through the same server (token ids from /tokenize)
    r = run_cli("eval", str(recipe), "--engine", "openai", "--url", url, "--base", "a", "--candidate", "a",
                "--suite", "synthetic-gen", "--max-items", "2", "--out", str(tmp_path / "gen"), "--json",
                "--allow-inconclusive")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["tasks"]["copying"]["output_agreement"] == 1.0
    recs = [json.loads(x) for x in (tmp_path / "gen" / "items.jsonl").read_text().splitlines()]
    assert recs[0]["out_b"] == " 42" and len(recs) == 8
    r = run_cli("eval", str(recipe), "--engine", "openai", "--url", url, "--base", "a", "--candidate", "noisy",
                "--suite", "synthetic-mc", "--max-items", "4", "--out", str(tmp_path / "mc"), "--json")
    assert r.returncode in (0, 1), r.stderr
    doc = json.loads(r.stdout)
    assert doc["tasks"]["arithmetic"]["items"] == 4 and doc["pooled"]["items"]["n"] == 16


def test_human_output_marks_gates(stub_server, recipe, tmp_path):
    url = stub_server("ok")
    r = run_cli("eval", str(recipe), "--engine", "openai", "--url", url, "--base", "a", "--candidate", "noisy",
                "--max-items", "2", "--out", str(tmp_path / "h"))
    assert r.returncode == 1
    assert "gates" in r.stdout and "FAIL" in r.stdout and "verdict: FAIL" in r.stdout
    assert "KLD mean" in r.stdout and "same top-1" in r.stdout


def test_default_candidate_is_where_quantize_writes(tmp_path):
    p = tmp_path / "r.yaml"
    (tmp_path / "config.json").write_text("{}")
    p.write_text(f"name: qs\nmodel:\n  source: {tmp_path}\nquantize:\n  method: gptq\n  group_size: 64\n")
    r = run_cli("eval", str(p))
    assert r.returncode == 2 and "out/qs-gptq" in r.stderr and "infertool quantize" in r.stderr


def test_vllm_without_int4_kernels_is_named(tmp_path):
    """A server that dies naming the missing int4 kernel: the one launcher says the host cannot run it."""
    import sys

    from infertool.procs import free_port
    from infertool.serve.command import LaunchSpec
    from infertool.serve.launcher import HostCannotRun, Server

    crash = ("import sys; print(\"AttributeError: '_OpNamespace' '_C' object has no attribute 'cpu_gemm_wna16'\"); "
             "sys.exit(1)")
    port = free_port()
    spec = LaunchSpec([sys.executable, "-c", crash], {}, "127.0.0.1", port, "out/q", "q", None, False, 30)
    with Server(spec, tmp_path / "vllm.log") as server:
        with pytest.raises(HostCannotRun) as e:
            server.wait_ready()
    assert "cpu_gemm_wna16" in e.value.message and "AVX-512" in e.value.hint


# ------------------------------------------------------------------------ the contract: plan -> run -> result


def _recipe(data: dict):
    from infertool.recipe import validate_recipe_data

    return validate_recipe_data(data, source="test")


@pytest.fixture
def models(tmp_path) -> dict[str, Path]:
    from fakes import layout_model

    return {name: layout_model(tmp_path / name, "smollm2-135m", shards=1) for name in ("orig", "other", "cand", "entry")}


def test_plan_of_each_engine_as_a_dry_run(models, tmp_path):
    """One plan for every engine: the resolution's models (hf, vllm), served names (openai); the vllm launches;
    a dry run takes no port, converts nothing and runs no held-out check."""
    from infertool import evaluate
    from infertool.errors import UsageError
    from infertool.evaluate import EvalOptions
    from infertool.evaluate.verdict import PRESETS
    from infertool.resolve import resolve

    recipe = _recipe({"name": "p", "model": {"source": str(models["orig"])}, "eval": {"seq_len": 64},
                      "quantize": {"method": "gptq", "bits": 4, "group_size": 64, "output": str(models["cand"])}})
    res = resolve(recipe)
    hf = evaluate.plan(res, EvalOptions(dry_run=True))
    assert (hf.engine, hf.suite, hf.seq_len, hf.topk) == ("hf", "builtin-corpus", 64, 20)
    assert hf.resolution is res and hf.base_ref is res.base and hf.candidate_ref is res.candidate
    assert hf.base == str(models["orig"].resolve()) and hf.candidate == str(models["cand"].absolute())
    assert (hf.base_label, hf.candidate_label) == (str(models["orig"]), res.candidate.label)
    assert hf.launches is None and hf.held_out is None and hf.api_key is None
    d = hf.to_dict()
    assert d["dry_run"] is True and d["launches"] == {} and d["settings"]["thresholds"] == PRESETS["standard"]
    assert d["resolution"]["candidate"]["path"] == hf.candidate and d["settings"]["topk"] is None

    vllm = evaluate.plan(res, EvalOptions(engine="vllm", preset="strict", max_items=3, dry_run=True))
    assert list(vllm.launches) == ["candidate", "base"] and vllm.max_items == 3
    assert vllm.launches["candidate"].model is res.candidate and vllm.launches["base"].model is res.base
    argv = vllm.launches["candidate"].spec.argv
    assert argv[argv.index("--model") + 1] == hf.candidate and "--max-logprobs" not in argv  # top-20 is vLLM's default
    assert vllm.to_dict()["settings"]["thresholds"] == PRESETS["strict"]

    short = _recipe({"name": "p", "model": {"source": str(models["orig"])}, "eval": {"seq_len": 64},
                     "serve": {"max_model_len": 32}, "quantize": {"method": "gptq", "output": str(models["cand"])}})
    with pytest.raises(UsageError, match="shorter than eval.seq_len 64"):
        evaluate.plan(resolve(short), EvalOptions(engine="vllm", dry_run=True))

    url = "http://127.0.0.1:9/v1"
    oa = evaluate.plan(res, EvalOptions(engine="openai", url=url, base_name="a", candidate_name="b", dry_run=True))
    assert (oa.base, oa.candidate, oa.url, oa.base_ref, oa.launches) == ("a", "b", url, None, None)
    assert oa.to_dict()["base"] == {"model": "a", "label": "a", "source": "a"}
    with pytest.raises(UsageError, match="served model names of both models"):
        evaluate.plan(res, EvalOptions(engine="openai", url=url, base_name="a"))
    with pytest.raises(UsageError, match="eval.url: engine: openai needs url") as e:
        evaluate.plan(res, EvalOptions(engine="openai", base_name="a", candidate_name="b"))
    assert "--url" in e.value.hint
    with pytest.raises(UsageError, match="eval.engine"):
        evaluate.plan(res, EvalOptions(engine="tgi"))


def test_plan_models_come_from_the_one_resolution(models, tmp_path):
    """--candidate / --base (and eval.base / eval.candidate) are Overrides of resolve(): the plan uses the
    resolution it is given when that resolved them, else resolves again with them; nothing patches a ModelRef."""
    from infertool import evaluate
    from infertool.evaluate import EvalOptions
    from infertool.resolve import resolve

    data = {"name": "p", "model": {"source": str(models["orig"])},
            "quantize": {"method": "gptq", "bits": 4, "group_size": 64, "output": str(models["cand"])}}
    recipe = _recipe(data)
    opts = EvalOptions(candidate=str(models["other"]))
    ov = evaluate.overrides(recipe, opts)
    assert (ov.base, ov.candidate) == (None, str(models["other"]))
    res = resolve(recipe, ov)
    p = evaluate.plan(res, opts)
    assert p.resolution is res and p.candidate_ref is res.candidate  # resolved once
    assert p.candidate == str(models["other"].absolute()) and p.candidate_label == str(models["other"])
    assert p.candidate_ref.quantization["bits"] == 4  # the recipe's quantization, the given directory
    assert p.held_out is None  # a given model: its calibration is not the recipe's
    again = evaluate.plan(resolve(recipe), opts)  # a resolution made without the override: made again with it
    assert again.resolution is not res and again.candidate == p.candidate and (again.base_label, again.candidate_label) == (p.base_label, p.candidate_label)
    # the recipe's own candidate, to run: the held-out check of its calibration text against the suite
    own = evaluate.plan(resolve(recipe), EvalOptions())
    assert own.held_out is not None and own.held_out.checked and own.held_out.calibration == "builtin"
    # `run` resolves its quantize entry as the candidate; eval.base names another original: the entry stays
    with_base = _recipe({**data, "eval": {"base": str(models["other"])}})
    res = resolve(with_base, candidate_path=models["entry"])
    p = evaluate.plan(res, EvalOptions(dry_run=True))
    assert p.base == str(models["other"].resolve()) and p.base_label == str(models["other"])
    assert p.candidate == str(models["entry"].absolute()) and p.candidate_ref.quantization == res.candidate.quantization
    # the openai engine's models are names on a server, not Overrides
    assert evaluate.overrides(recipe, EvalOptions(engine="openai", base_name="a", candidate_name="b")) == \
        evaluate.overrides(recipe, EvalOptions(engine="openai"))


def test_plan_sends_the_key_only_to_urls_the_user_gave(tmp_path, monkeypatch, capsys):
    from infertool import evaluate
    from infertool.evaluate import EvalOptions
    from infertool.resolve import resolve

    secret = "s3cret-eval-plan"
    monkeypatch.setenv("EVAL_PLAN_KEY", secret)
    monkeypatch.setenv("INFERTOOL_KEY_URLS", "")
    url = "http://127.0.0.1:9/v1"
    res = resolve(_recipe({"name": "k", "model": {"source": "bundled:smollm2-135m"}, "serve": {"api_key_env": "EVAL_PLAN_KEY"},
                           "eval": {"engine": "openai", "url": url, "base": "a", "candidate": "b"}}))
    assert evaluate.plan(res, EvalOptions()).api_key is None  # the URL comes from the recipe alone
    assert "not sending the key in EVAL_PLAN_KEY" in capsys.readouterr().err
    given = EvalOptions(key_urls=("http://127.0.0.1:9",))
    p = evaluate.plan(res, given)
    assert p.api_key == secret
    assert secret not in json.dumps(p.to_dict()) + repr(p) and p.to_dict()["sends_api_key"] is True
    # every server must be one the user gave: a candidate server they did not name gets no key
    assert evaluate.plan(res, EvalOptions(candidate_url="http://127.0.0.2:9/v1", key_urls=given.key_urls)).api_key is None
    assert evaluate.plan(res, EvalOptions(dry_run=True, key_urls=given.key_urls)).api_key is None  # a dry run decides none


def test_run_returns_what_results_json_holds(stub_server, tmp_path):
    """evaluate.run(plan, ctx): files into ctx.out_dir, progress to ctx.on_event, and a typed EvalResult that is
    what results.json says (EvalResult.from_dict reads it back, and writes the same document again)."""
    from infertool import evaluate
    from infertool.capability import RunContext
    from infertool.evaluate import EvalOptions, EvalResult
    from infertool.evaluate.result import ChoiceResult, PerplexityResult
    from infertool.resolve import resolve

    url = stub_server("ok")
    res = resolve(_recipe({"name": "r", "model": {"source": "bundled:smollm2-135m"}, "eval": {"seq_len": 64}}))
    events: list[dict] = []
    plan = evaluate.plan(res, EvalOptions(engine="openai", url=url, base_name="a", candidate_name="noisy", max_items=2))
    result = evaluate.run(plan, RunContext(out_dir=tmp_path / "run", on_event=events.append))
    assert any(e["event"] == "progress" for e in events)
    saved = json.loads((tmp_path / "run" / "results.json").read_text())
    assert EvalResult.from_dict(saved) == result and EvalResult.from_dict(saved).to_dict() == saved
    t = result.tasks["pydoc-topics"]
    assert isinstance(t, PerplexityResult) and t.tokens == 2 * 63 and t.kld_kind == "top-20"
    assert t.mean_kld == saved["tasks"]["pydoc-topics"]["kld"]["mean"] > 0 and t.topk_covered_mass.mean > 0.3
    assert result.verdict == "FAIL" and not result.ok and not result.accepted(allow_inconclusive=True)
    gate = result.gate("max_ppl_ratio")
    assert gate.status == "FAIL" and gate.lo > 1.05 and gate.unit == "tokens"
    assert result.pooled.tokens.tokens == 126 and result.pooled.items is None and "items" not in saved["pooled"]
    assert result.base.label == "a" and result.base.extra["url"].endswith("/v1") and result.confidence == 0.95
    assert result.files.results == str(tmp_path / "run" / "results.json") and result.run_dir == str(tmp_path / "run")
    summary = result.summary().to_dict()
    assert summary["verdict"] == "FAIL" and summary["suite"] == "builtin-corpus" and summary["engine"] == "openai"
    assert [g["name"] for g in summary["gates"]] == [g.name for g in result.gates]

    plan = evaluate.plan(res, EvalOptions(engine="openai", url=url, base_name="a", candidate_name="a", max_items=3,
                                          suite="synthetic-mc"))
    mc = evaluate.run(plan, RunContext(out_dir=tmp_path / "mc"))
    t = mc.tasks["arithmetic"]
    assert isinstance(t, ChoiceResult) and t.items == 3 and t.acc.flip_rate == 0.0 and t.same_pick == 1.0
    assert mc.pooled.items.n == 12 and mc.pooled.tokens is None and mc.gate("max_mean_kld").status == "n/a"
    assert EvalResult.from_dict(json.loads((tmp_path / "mc" / "results.json").read_text())) == mc
    with pytest.raises(Exception, match="dry run"):
        evaluate.run(evaluate.plan(res, EvalOptions(engine="openai", url=url, base_name="a", candidate_name="a",
                                                    dry_run=True)))


def test_eval_result_reads_an_older_or_crafted_file_tolerantly():
    from infertool.evaluate import EvalResult
    from infertool.evaluate.result import ChoiceResult, Pooled, TaskResult

    doc = {"verdict": "INCONCLUSIVE", "reason": "?", "from_a_later_version": [1],
           "gates": [{"name": "max_mean_kld", "metric": "mean KLD", "threshold": 0.05, "estimate": "0.01", "status": "PASS"}],
           "tasks": {"mc": {"type": "multiple_choice", "items": 4, "acc": {"n": 4, "acc_base": 0.5, "acc_base_ci": [0.15, None]}},
                     "odd": {"type": "ranking", "items": 2}},
           "settings": {"accept": {"confidence": 0.99, "allow_inconclusive": "yes"}}}
    r = EvalResult.from_dict(doc)
    assert r.verdict == "INCONCLUSIVE" and r.gates[0].estimate is None and r.gates[0].lo is None  # malformed: not measured
    assert isinstance(r.tasks["mc"], ChoiceResult) and r.tasks["mc"].acc.acc_base == 0.5
    assert r.tasks["mc"].acc.acc_base_ci == [0.15, None]  # an unmeasured bound keeps its place
    assert type(r.tasks["odd"]) is TaskResult and r.tasks["odd"].extra == {"items": 2}
    assert r.confidence == 0.99 and r.settings.accept.allow_inconclusive is False  # "yes" is not a bool
    assert not r.accepted() and r.accepted(allow_inconclusive=True)
    assert r.to_dict()["from_a_later_version"] == [1] and r.held_out is None and r.suite.name == ""
    assert EvalResult.from_dict("not a document").verdict is None and EvalResult.from_dict(None).gates == []
    assert Pooled.from_dict({"items": {"n": 3}}).to_dict() == {"items": Pooled.from_dict({"items": {"n": 3}}).items.to_dict()}


def test_export_lm_eval_gives_chat_items_their_prompt_and_skips_what_it_cannot_express(tmp_path):
    """A chat item of one user message is exported with that message as its prompt (not an empty one); a task
    with a multi-turn or system item, or matched by a regex, has no lm-eval form: skipped, and said why."""
    d = tmp_path / "s"
    d.mkdir()
    (d / "s.yaml").write_text(yaml.safe_dump({"name": "mine", "tasks": [
        {"name": "qa", "type": "generate", "data": "qa.jsonl", "chat": True, "match": "exact", "max_tokens": 8},
        {"name": "multi", "type": "generate", "data": "multi.jsonl", "chat": True, "max_tokens": 8},
        {"name": "rx", "type": "generate", "data": "rx.jsonl", "match": "regex", "max_tokens": 8}]}))
    (d / "qa.jsonl").write_text(json.dumps({"id": "q1", "messages": [{"role": "user", "content": "Capital of Peru?"}],
                                            "target": "Lima"}) + "\n"
                                + json.dumps({"id": "q2", "prompt": "2 + 2 =", "target": "4"}) + "\n")
    (d / "multi.jsonl").write_text(json.dumps({"id": "m1", "messages": [
        {"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi?"}], "target": "Hi"}) + "\n")
    (d / "rx.jsonl").write_text(json.dumps({"id": "r1", "prompt": "Say a number", "target": "[0-9]+"}) + "\n")
    r = run_cli("eval", "export-lm-eval", str(d / "s.yaml"), str(tmp_path / "lm"), "--json")
    assert r.returncode == 0, r.stderr
    res = json.loads(r.stdout)
    assert res["tasks"] == ["infertool_mine_qa"] and set(res["skipped"]) == {"multi", "rx"}
    assert "one prompt per document" in res["skipped"]["multi"] and "regex" in res["skipped"]["rx"]
    rows = [json.loads(x) for x in (tmp_path / "lm" / "infertool_mine_qa.jsonl").read_text().splitlines()]
    assert [(x["id"], x["prompt"]) for x in rows] == [("q1", "Capital of Peru?"), ("q2", "2 + 2 =")]
    assert not (tmp_path / "lm" / "infertool_mine_multi.yaml").exists()
    r = run_cli("eval", "export-lm-eval", str(d / "s.yaml"), str(tmp_path / "lm2"))
    assert r.returncode == 0 and "not exported: task multi" in " ".join(r.stderr.split())
    # nothing expressible: exit 2, nothing written
    (d / "s.yaml").write_text(yaml.safe_dump({"name": "none", "tasks": [
        {"name": "rx", "type": "generate", "data": "rx.jsonl", "match": "regex", "max_tokens": 8}]}))
    r = run_cli("eval", "export-lm-eval", str(d / "s.yaml"), str(tmp_path / "lm3"))
    assert r.returncode == 2 and "no task of suite none has an lm-eval form" in " ".join(r.stderr.split())
    assert not (tmp_path / "lm3").exists()
