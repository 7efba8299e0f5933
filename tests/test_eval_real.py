"""`infertool eval` for real: the truncated bundled model against itself and against a damaged copy,
on the hf engine (quant env, full-vocabulary KLD) and the vllm engine (two real vLLM servers)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import yaml

from conftest import ROOT, run_cli

pytestmark = pytest.mark.slow

# Round-to-nearest fake quantization (symmetric, per group of 64) of every decoder projection, saved as
# bf16: a deliberately damaged copy (3 bits) that needs no quantizer library.
RTN_SCRIPT = r'''
import shutil, sys
from pathlib import Path
import torch
from safetensors.torch import load_file, save_file
src, dst, bits, group = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
dst.mkdir(parents=True, exist_ok=True)
for f in src.iterdir():
    if f.is_file() and f.suffix != ".safetensors" and f.name != "infertool-model.json":
        shutil.copy(f, dst / f.name)
for f in src.glob("*.safetensors"):
    out = {}
    for k, w in load_file(str(f)).items():
        if ".layers." in k and k.endswith("proj.weight"):
            W = w.float().reshape(w.shape[0], -1, group)
            qmax = 2 ** (bits - 1) - 1
            scale = W.abs().amax(-1, keepdim=True).clamp_min(1e-8) / qmax
            w = ((W / scale).round().clamp(-qmax - 1, qmax) * scale).reshape(w.shape).to(w.dtype)
        out[k] = w.contiguous()
    save_file(out, str(dst / f.name), metadata={"format": "pt"})
'''


def make_rtn_copy(quant_python: Path, src: Path, dst: Path, bits: int = 3, group: int = 64) -> Path:
    script = dst.parent / "rtn_copy.py"
    script.write_text(RTN_SCRIPT)
    r = subprocess.run([str(quant_python), str(script), str(src), str(dst), str(bits), str(group)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return dst


@pytest.fixture(scope="module")
def tiny_rtn(quant_python, tiny_model, tmp_path_factory) -> Path:
    return make_rtn_copy(quant_python, tiny_model, tmp_path_factory.mktemp("rtn") / "tiny-rtn3")


@pytest.fixture(scope="module")
def mixed_suite(tmp_path_factory) -> Path:
    """Perplexity + multiple choice + generation in one small suite (the built-in data files)."""
    d = tmp_path_factory.mktemp("suite")
    evals = ROOT / "evals"
    p = d / "mixed.yaml"
    p.write_text(yaml.safe_dump({"name": "mixed", "tasks": [
        {"name": "corpus", "type": "perplexity", "source": "builtin:pydoc_topics:eval", "max_windows": 3},
        {"name": "mc", "type": "multiple_choice", "data": str(evals / "synthetic-mc.arithmetic.jsonl")},
        {"name": "gen", "type": "generate", "data": str(evals / "synthetic-gen.copying.jsonl"), "max_tokens": 8},
    ]}))
    return p


@pytest.fixture
def recipe(tmp_path, tiny_model) -> Path:
    p = tmp_path / "r.yaml"
    # the vllm engine serves both models as the recipe does: eager mode keeps the CPU start-up short
    p.write_text(f"name: evalreal\nmodel:\n  source: {tiny_model}\neval:\n  seq_len: 128\n  batch_size: 4\n"
                 "serve: {enforce_eager: true, max_model_len: 512, cpu: {kv_cache_space_gib: 1}}\n")
    return p


def test_hf_self_check_kld_zero_full_agreement(recipe, tiny_model, mixed_suite, tmp_path):
    r = run_cli("eval", str(recipe), "--candidate", str(tiny_model), "--suite", str(mixed_suite),
                "--max-items", "4", "--out", str(tmp_path / "self"), "--json")
    doc = json.loads(r.stdout)
    corpus = doc["tasks"]["corpus"]
    assert corpus["tokens"] == 3 * 127 and corpus["kld_kind"] == "full"
    assert corpus["kld"]["mean"] == pytest.approx(0.0, abs=1e-9) and corpus["kld"]["max"] < 1e-6
    assert corpus["top1_agree"] == 1.0 and corpus["ppl_ratio"] == pytest.approx(1.0, abs=1e-9)
    assert doc["tasks"]["mc"]["acc"]["flip_rate"] == 0.0 and doc["tasks"]["mc"]["same_pick"] == 1.0
    assert doc["tasks"]["gen"]["output_agreement"] == 1.0
    gates = {g["name"]: g for g in doc["gates"]}
    for name in ("max_mean_kld", "min_top1", "max_ppl_ratio", "max_acc_drop"):
        assert gates[name]["status"] == "PASS", gates[name]
    # 0 flips in 8 items cannot show a flip rate below 10 %: INCONCLUSIVE, with the N that decides it
    assert gates["max_flip_rate"]["status"] == "INCONCLUSIVE" and gates["max_flip_rate"]["n_needed"] == 35
    assert doc["verdict"] == "INCONCLUSIVE" and "35" in doc["reason"]
    assert r.returncode == 1  # INCONCLUSIVE exits 1 unless allowed
    assert doc["timing"]["base_tokens_per_s"] > 0
    recs = [json.loads(x) for x in (tmp_path / "self" / "items.jsonl").read_text().splitlines()]
    assert len(recs) == 3 + 4 + 4 and all("id" in x and "task" in x for x in recs)
    assert (tmp_path / "self" / "kld_histogram.svg").read_text().startswith("<svg")


def test_hf_damaged_copy_fails(recipe, tiny_rtn, tmp_path):
    r = run_cli("eval", str(recipe), "--candidate", str(tiny_rtn), "--max-items", "3", "--out", str(tmp_path / "rtn"), "--json")
    assert r.returncode == 1, r.stderr
    doc = json.loads(r.stdout)
    t = doc["tasks"]["pydoc-topics"]
    assert doc["verdict"] == "FAIL"
    assert t["kld"]["mean"] > 0.05 and t["top1_agree"] < 0.95
    assert t["kld"]["p99"] >= t["kld"]["p90"] >= t["kld"]["median"] >= 0
    assert doc["candidate"]["loader"].startswith("transformers")
    # the human rendering of the same results (the JSON was written to the run dir)
    saved = json.loads((tmp_path / "rtn" / "results.json").read_text())
    assert saved["tasks"]["pydoc-topics"]["kld"]["mean"] == t["kld"]["mean"]


def _live_processes_with(text: str) -> list[int]:
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                cmd = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                continue
            if text in cmd and "vllm" in cmd:
                pids.append(int(entry))
    return pids


def test_vllm_engine_topk_kld_and_servers_stopped(recipe, tiny_model, tiny_rtn, mixed_suite, serve_python, tmp_path):
    r = run_cli("eval", str(recipe), "--engine", "vllm", "--candidate", str(tiny_rtn), "--suite", str(mixed_suite),
                "--max-items", "3", "--out", str(tmp_path / "vllm"), "--json", timeout=900)
    assert r.returncode in (0, 1), r.stderr[-3000:]
    doc = json.loads(r.stdout)
    corpus = doc["tasks"]["corpus"]
    assert doc["engine"] == "vllm" and corpus["kld_kind"] == "top-20"
    assert corpus["tokens"] == 3 * 127
    assert corpus["kld"]["mean"] > 0.05 and corpus["top1_agree"] < 0.95
    assert 0.3 < corpus["topk_covered_mass"]["mean"] <= 1.0
    assert doc["verdict"] == "FAIL"
    assert doc["tasks"]["mc"]["items"] == 3 and len(doc["tasks"]["gen"]) > 0
    assert (tmp_path / "vllm" / "logs" / "vllm-base.log").is_file()
    assert not _live_processes_with(str(tiny_rtn)) and not _live_processes_with(str(tiny_model))
