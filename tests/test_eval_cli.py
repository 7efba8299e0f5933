"""`infertool eval` through the real CLI (subprocesses), suites, lm-eval export, and the openai engine
against a tiny local stub server (stdlib http.server on a free port): fast, no managed environments."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import yaml

from conftest import run_cli
from infertool.data import suites
from infertool.evaluate import synth

ROOT = Path(__file__).resolve().parents[1]


# ------------------------------------------------------------------------------------ stub server


class _Stub(BaseHTTPRequestHandler):
    """An OpenAI-compatible stub. Token i of a prompt is the id it was given; model 'noisy' shifts the
    log-probabilities of odd ids; mode 'nologprobs' answers completions without prompt log-probabilities
    (like llama.cpp's server did in issue #27174)."""

    mode = "ok"

    def log_message(self, *args):  # keep pytest output clean
        pass

    def _send(self, obj, code=200):
        body = json.dumps(obj).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

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
