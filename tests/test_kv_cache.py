"""Issue 41 item 3: the KV-cache dtype as a decision. Where vLLM 0.32's CPU engine refuses an FP8 KV cache (no
AVX-512 / AMX, a head size not a multiple of 32) is said before any server starts (the launch lint, the recipe check,
plan); plan puts auto and FP8 side by side (bytes per token, KV tokens, concurrency at the recipe's sequence length);
tune screens an FP8 trial as served against the original at the model's KV precision, and drops FP8 trials the
host refuses at plan time with the reason. Both CPU-feature paths through INFERTOOL_CPU_FLAGS; the real-host tests
read /proc/cpuinfo."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from conftest import cli_in_process, run_cli
from infertool.plan import PlanOptions, plan
from infertool.recipe import validate_recipe_data
from infertool.serve.lint import lint_kv_cache_dtype
from infertool.tune import space
from tests.test_models import LLAMA_CFG, make_fake_model
from tests.test_tune import smol, tune_recipe  # noqa: F401  (smol: the fixture)

AVX2 = "avx2 fma"  # this project's machines
AVX512 = "avx2 fma avx512f"  # AVX-512 without bf16 matrix instructions: vLLM runs float32 either way
AMX = "avx2 fma amx_tile"
CPU_REFUSAL = "vLLM's CPU engine needs AVX-512 or AMX for an FP8 KV cache; this CPU has AVX2"


def _model(tmp_path: Path, hidden: int = 576) -> Path:
    """A 2-layer Llama-shaped directory (9 heads, 3 KV heads: head size hidden / 9) with a real safetensors header."""
    d = tmp_path / f"m{hidden}"
    make_fake_model(d, {**LLAMA_CFG, "hidden_size": hidden}, {"model.embed_tokens.weight": ("BF16", [49152, hidden])},
                    {"BF16": 2})
    return d


def _recipe(model: Path, **serve) -> dict:
    return {"name": "kv", "model": {"source": str(model)},
            "serve": {"max_model_len": 2048, "cpu": {"kv_cache_space_gib": 1}, **serve}}


def _plan(data: dict, gpu: str | None = None):
    from infertool.resolve import resolve

    return plan(resolve(validate_recipe_data(data), gpu=gpu), PlanOptions())


# ------------------------------------------------------------------------------------------ the lint
@pytest.mark.parametrize("dtype", ["fp8", "fp8_e4m3", "fp8_e5m2"])
def test_the_lint_refuses_fp8_kv_on_a_cpu_without_avx512_or_amx(dtype, monkeypatch):
    monkeypatch.setenv("INFERTOOL_CPU_FLAGS", AVX2)
    [issue] = lint_kv_cache_dtype(dtype, 64)
    assert issue.level == "error" and issue.field == "serve.kv_cache_dtype" and CPU_REFUSAL in issue.message
    assert "FP8 KV cache on CPU requires x86 with AVX-512 or AMX." in issue.message  # vLLM's own words, quoted
    assert issue.hint and "kv_cache_dtype auto" in issue.hint
    for flags in (AVX512, AMX):  # the other path: either instruction set stores it
        monkeypatch.setenv("INFERTOOL_CPU_FLAGS", flags)
        assert lint_kv_cache_dtype(dtype, 64) == []
    assert lint_kv_cache_dtype(dtype, 64, flags={"sse4_2"})[0].message.endswith(
        "this CPU has neither: vLLM refuses to start (\"FP8 KV cache on CPU requires x86 with AVX-512 or AMX.\")")
    assert lint_kv_cache_dtype(dtype, 64, flags=set()) == []  # flags unknown (not Linux, not x86): no claim


def test_the_lint_refuses_fp8_kv_on_a_head_size_not_a_multiple_of_32():
    [issue] = lint_kv_cache_dtype("fp8", 80, flags=set(AVX512.split()))
    assert "head size that is a multiple of 32" in issue.message and "this model's is 80" in issue.message
    assert len(lint_kv_cache_dtype("fp8", 80, flags=set(AVX2.split()))) == 2  # both reasons, each said
    for dtype in ("auto", "bfloat16", "float16"):  # what is not FP8 is never refused here
        assert lint_kv_cache_dtype(dtype, 80, flags=set(AVX2.split())) == []


def test_every_cpu_launch_lints_the_kv_cache_dtype(tmp_path, monkeypatch):
    """`infertool serve`'s launch (and its dry run) carries the error: the launcher refuses to start on it."""
    from infertool.resolve import resolve
    from infertool.serve import prepare

    monkeypatch.setenv("INFERTOOL_CPU_FLAGS", AVX2)
    launch = prepare(resolve(validate_recipe_data(_recipe(_model(tmp_path), kv_cache_dtype="fp8"))),
                     python="/nonexistent/python", dry_run=True)
    assert [i.field for i in launch.errors] == ["serve.kv_cache_dtype"] and CPU_REFUSAL in launch.errors[0].message
    monkeypatch.setenv("INFERTOOL_CPU_FLAGS", AVX512)
    launch = prepare(resolve(validate_recipe_data(_recipe(_model(tmp_path), kv_cache_dtype="fp8"))),
                     python="/nonexistent/python", dry_run=True)
    assert launch.errors == [] and "--kv-cache-dtype" in launch.spec.argv


# ------------------------------------------------------------------------------------------ plan
def test_plan_puts_auto_and_fp8_side_by_side_on_an_avx2_cpu(tmp_path, monkeypatch):
    monkeypatch.setenv("INFERTOOL_CPU_FLAGS", AVX2)
    p = _plan(_recipe(_model(tmp_path)))
    auto, fp8 = p.kv_dtypes.rows
    # float32 on this CPU (no bf16 instructions): 2 x 2 layers x 3 KV heads x 64 x 4 B = 3,072 B; FP8 768 B
    assert (auto.dtype, auto.bytes_per_token, auto.configured, auto.refused) == ("auto (float32)", 3072, True, None)
    assert auto.kv_tokens == p.capacity.kv_tokens == 349_440  # what vLLM logged for it here (docs/kv-cache.md)
    assert (fp8.dtype, fp8.bytes_per_token, fp8.kv_tokens) == ("fp8", 768, 1_398_016)
    assert p.kv_dtypes.gain == pytest.approx(4.0, abs=0.01) and fp8.refused is not None and CPU_REFUSAL in fp8.refused
    assert p.kv_dtypes.seq_len == 2048 and p.kv_dtypes.seq_len_from == "max_model_len"
    assert auto.concurrency == pytest.approx(349_440 / 2048) and auto.sequences == 170 and fp8.sequences == 256
    assert p.fits  # auto is served: the refused FP8 row is information, not a reason


def test_plan_of_a_recipe_that_serves_fp8_where_the_engine_refuses_it(tmp_path, monkeypatch):
    monkeypatch.setenv("INFERTOOL_CPU_FLAGS", AVX2)
    data = _recipe(_model(tmp_path), kv_cache_dtype="fp8")
    data["bench"] = {"prompt": {"len": 448}, "output_len": 64}
    p = _plan(data)
    assert not p.fits and any(CPU_REFUSAL in r for r in p.reasons)
    assert [r.configured for r in p.kv_dtypes.rows] == [False, True]
    assert p.kv_dtypes.seq_len == 512 and p.kv_dtypes.seq_len_from == "bench.prompt.len + bench.output_len"
    assert p.kv_dtypes.rows[1].concurrency == pytest.approx(1_398_016 / 512)
    monkeypatch.setenv("INFERTOOL_CPU_FLAGS", AVX512)  # the other path: it runs, and holds 4x the tokens
    p = _plan(data)
    assert p.fits and p.kv_dtypes.rows[1].refused is None and p.kv_dtypes.gain == pytest.approx(4.0, abs=0.01)
    monkeypatch.setenv("INFERTOOL_CPU_FLAGS", "avx2 avx512f avx512_bf16")  # bf16 served: FP8 halves it
    assert _plan(data).kv_dtypes.gain == pytest.approx(2.0, abs=0.01)
    p = _plan(_recipe(_model(tmp_path, hidden=720), kv_cache_dtype="fp8"))  # head size 80
    assert not p.fits and any("multiple of 32" in r for r in p.reasons)


def test_plan_on_a_gpu_target_from_the_gpu_table(monkeypatch):
    """The built-in FP8-KV recipe (Llama 3.1 8B, target H100-SXM) from any machine: the gain, no CPU refusal; an
    Ampere GPU says which attention backend stores FP8 there."""
    from infertool.recipe import load_recipe
    from infertool.resolve import resolve

    monkeypatch.setenv("INFERTOOL_CPU_FLAGS", AVX2)  # this host's CPU is not what a GPU target is checked against
    p = plan(resolve(load_recipe("llama3.1-8b-128k-fp8kv")), PlanOptions())
    auto, fp8 = p.kv_dtypes.rows
    assert auto.dtype == "auto (bfloat16)" and auto.bytes_per_token == 131_072 and fp8.bytes_per_token == 65_536
    assert fp8.configured and fp8.refused is None and p.kv_dtypes.gain == pytest.approx(2.0, abs=0.01)
    assert fp8.kv_tokens == p.capacity.kv_tokens and p.kv_dtypes.seq_len == 32768 + 256
    # 32k-token requests: auto holds 13 at once, FP8 the recipe's max_num_seqs 16 (28 by its tokens alone)
    assert auto.sequences == auto.kv_tokens // (32768 + 256) == 13 and fp8.concurrency > 27
    assert fp8.sequences == p.capacity.max_num_seqs == 16 and p.kv_dtypes.notes == []
    a100 = plan(resolve(load_recipe("llama3.1-8b-128k-fp8kv"), gpu="A100-80GB-SXM"), PlanOptions())
    assert any("FlashInfer" in n and "Ampere" in n for n in a100.kv_dtypes.notes)


def test_plan_cli_refuses_fp8_here_with_exit_2_and_shows_the_rows(tmp_path):
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump(_recipe(_model(tmp_path), kv_cache_dtype="fp8")))
    r = cli_in_process("plan", str(path), env={"INFERTOOL_CPU_FLAGS": AVX2})
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "kv_cache_dtype: serve.kv_cache_dtype: " + CPU_REFUSAL in " ".join(r.stderr.split())
    assert "hint: use kv_cache_dtype auto" in r.stderr
    r = cli_in_process("plan", str(path), "--set", "serve.kv_cache_dtype=auto", "--json", env={"INFERTOOL_CPU_FLAGS": AVX2})
    assert r.returncode == 0, r.stderr
    rows = json.loads(r.stdout)["kv_dtypes"]["rows"]
    assert [(x["dtype"], x["kv_tokens"], "refused" in x) for x in rows] == [("auto (float32)", 349_440, False),
                                                                              ("fp8", 1_398_016, True)]
    r = cli_in_process("plan", str(path), env={"INFERTOOL_CPU_FLAGS": AVX512})
    assert r.returncode == 0 and "FP8 holds 4.00x the tokens of auto" in " ".join(r.stdout.split())


# ------------------------------------------------------------------------------------------ tune
def _tune_data(model: Path, tmp_path: Path, kv: str = "auto") -> dict:
    data = tune_recipe(model, tmp_path, candidates=["none", {"backend": "llmcompressor", "scheme": "W8A8", "bits": 8}],
                       serve_grid={"max_num_seqs": [4], "kv_cache_dtype": ["auto", "fp8"]})
    data["serve"]["kv_cache_dtype"] = kv
    return data


def test_an_fp8_trial_is_screened_as_served_and_pruned_where_the_host_refuses_it(smol, tmp_path, monkeypatch):
    from infertool.tune.core import predicted
    from infertool.tune.stages import screen_wanted

    monkeypatch.setenv("INFERTOOL_CPU_FLAGS", AVX512)
    r = validate_recipe_data(_tune_data(smol, tmp_path))
    trials = {(t.candidate.label.split()[0], t.serve["kv_cache_dtype"]): predicted(t) for t in space.trials(r)}
    fp8 = trials[("original", "fp8")]
    assert fp8.scoring == {"kv_cache_dtype": "fp8"} and fp8.own_screening and screen_wanted(fp8)
    assert "every attention read" in (fp8.screening().why or "")
    assert fp8.recipe.serve.speculative is None  # never the lossless (speculation's) check: an accuracy screening
    assert not trials[("original", "auto")].own_screening  # auto IS the reference
    assert all(t.prediction.fits for t in trials.values())
    monkeypatch.setenv("INFERTOOL_CPU_FLAGS", AVX2)
    trials = {(t.candidate.label.split()[0], t.serve["kv_cache_dtype"]): predicted(t) for t in space.trials(r)}
    for (_, kv), t in trials.items():
        assert t.prediction.fits is (kv == "auto")
        if kv == "fp8":
            assert any(CPU_REFUSAL in why for why in t.prediction.reasons)


def test_the_reference_keeps_the_model_kv_precision_when_the_recipe_serves_fp8(smol, tmp_path, monkeypatch):
    """A recipe that serves FP8 itself: the reference is the original at auto, so every FP8 trial (the original's
    too) is screened against it; a quantized candidate's FP8 trials share its screening at the recipe's settings."""
    monkeypatch.setenv("INFERTOOL_CPU_FLAGS", AVX512)
    r = validate_recipe_data(_tune_data(smol, tmp_path, kv="fp8"))
    assert space.reference_recipe(r).serve.kv_cache_dtype == "auto" and space.reference_recipe(r).quantize is None
    by = {(t.candidate.label.split()[0], t.serve["kv_cache_dtype"]): t for t in space.trials(r)}
    assert by[("original", "fp8")].scoring == {"kv_cache_dtype": "fp8"}
    assert by[("original", "auto")].scoring == {}  # the original at auto IS the reference
    assert by[("W8A8", "auto")].scoring == {"kv_cache_dtype": "auto"}  # not the W8A8 screening's fp8
    assert by[("W8A8", "fp8")].scoring == {}  # shares W8A8's screening: the recipe's fp8, against the auto reference
    from infertool.tune.context import Context

    ctx = Context(r, tmp_path / "tune", exhaustive=False, on_event=None, on_trial=None)
    assert ctx.reference_recipe.serve.kv_cache_dtype == "auto" and ctx.reference_res.serve_section.kv_cache_dtype == "auto"
    # no kv_cache_dtype axis: the recipe's own fp8 still makes the original's trial screened on its own
    data = _tune_data(smol, tmp_path, kv="fp8")
    data["tune"]["serve_grid"] = {"max_num_seqs": [4]}
    [orig, _] = space.trials(validate_recipe_data(data))
    assert orig.candidate.original and orig.scoring == {"kv_cache_dtype": "fp8"}


def test_a_tune_with_the_fake_vllm_serves_fp8_only_where_the_cpu_stores_it(smol, tmp_path, monkeypatch):
    """The tune end to end with vLLM stood in below the one launcher (tests/test_tune_servers.py's FakeVllm): with
    AVX-512 the FP8 trials' screenings serve --kv-cache-dtype fp8 against a reference without it; on an AVX2 CPU
    no server is ever started with it, and tune.json says why each FP8 trial was dropped."""
    from infertool.tune.run import run_tune
    from tests.test_tune_classes import classed_recipe
    from tests.test_tune_servers import W8, FakeVllm, ServedStand

    data = classed_recipe(smol, tmp_path, classes=None)
    data["tune"]["serve_grid"] = {"max_num_seqs": [4], "kv_cache_dtype": ["auto", "fp8"]}
    loads = {("original", "none"): (4, 8.0), (W8, "none"): (4, 4.0)}
    monkeypatch.setenv("INFERTOOL_CPU_FLAGS", AVX512)
    stand = ServedStand(monkeypatch, smol, verdicts={W8: "PASS"}, loads=loads, served={})
    result = run_tune(validate_recipe_data(data))
    doc = json.loads((Path(result.tune_dir) / "tune.json").read_text())
    fp8_starts = [" ".join(a) for a in FakeVllm.starts if "--kv-cache-dtype" in a]
    assert fp8_starts and all("--kv-cache-dtype fp8" in a for a in fp8_starts)
    ref = next(s for s in doc["servers"] if s["purpose"] == "tune: reference")
    ref_argv = Path(ref["log"]).read_text()  # the fake's log: the command line it was started with
    assert "fake infertool serve" in ref_argv and "--kv-cache-dtype" not in ref_argv and "screen:original" in stand.calls
    screens = [u for s in doc["servers"] for u in s["used_by"] if u.startswith("screen ")]
    assert any("kv_cache_dtype=fp8" in u for u in screens) and not any("lossless" in u for s in doc["servers"]
                                                                        for u in s["used_by"])

    FakeVllm.starts.clear()
    monkeypatch.setenv("INFERTOOL_CPU_FLAGS", AVX2)
    (tmp_path / "avx2").mkdir()
    data2 = classed_recipe(smol, tmp_path / "avx2", classes=None)
    data2["tune"]["serve_grid"] = data["tune"]["serve_grid"]
    ServedStand(monkeypatch, smol, verdicts={W8: "PASS"}, loads=loads, served={})
    result = run_tune(validate_recipe_data(data2))
    doc = json.loads((Path(result.tune_dir) / "tune.json").read_text())
    assert FakeVllm.starts and not [a for a in FakeVllm.starts if "--kv-cache-dtype" in a]
    dropped = [t for t in doc["trials"] if t["serve"].get("kv_cache_dtype") == "fp8"]
    assert len(dropped) == 2 and all(t["status"] == "pruned" and CPU_REFUSAL in " ".join(t["prediction"]["reasons"])
                                     for t in dropped)
    assert result.winner is not None and result.winner.serve["kv_cache_dtype"] == "auto"


# ------------------------------------------------------------------------------------------ the real host
def _host_stores_fp8_kv() -> bool:
    """What vLLM's CPU engine asks (torch.cpu: avx512f / amx_tile), from this host's /proc/cpuinfo: never
    INFERTOOL_CPU_FLAGS (these tests are about the real engine on the real CPU)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    flags = next((line.split(":", 1)[1].split() for line in text.splitlines() if line.startswith("flags")), [])
    return "avx512f" in flags or "amx_tile" in flags


@pytest.mark.skipif(_host_stores_fp8_kv(), reason="this CPU has AVX-512 or AMX: vLLM stores an FP8 KV cache here")
def test_serve_refuses_fp8_here_before_any_vllm_starts(tmp_path):
    """`infertool serve` (a real launch, not a dry run) of an FP8-KV recipe on this AVX2 host: exit 2 with the
    refusal and its hint; no vLLM process was started (nothing listens on its port, no process names it)."""
    from infertool.procs import free_port, port_free

    port = free_port()
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump(_recipe(_model(tmp_path), kv_cache_dtype="fp8", port=port)))
    env = {k: v for k, v in os.environ.items() if k != "INFERTOOL_CPU_FLAGS"}  # the real host's flags
    env["INFERTOOL_HOME"] = str(tmp_path / "home")
    r = subprocess.run([sys.executable, "-m", "infertool", "serve", str(path)], capture_output=True, text=True,
                       env=env, timeout=300, cwd=Path(__file__).resolve().parents[1])
    assert r.returncode == 2, r.stderr
    assert "Traceback" not in r.stderr and CPU_REFUSAL in " ".join(r.stderr.split())
    assert "kv_cache_dtype auto" in r.stderr
    assert port_free("127.0.0.1", port) and not (tmp_path / "home" / "serve").exists()
    ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    assert not [line for line in ps.splitlines() if "vllm" in line and f"--port {port}" in line]


@pytest.mark.slow
@pytest.mark.skipif(not _host_stores_fp8_kv(), reason="vLLM 0.32's CPU engine stores an FP8 KV cache only with "
                    "AVX-512 or AMX, which this CPU lacks (/proc/cpuinfo): test_serve_refuses_fp8_here_before_any_"
                    "vllm_starts covers this host")
def test_eval_as_served_with_an_fp8_kv_cache(tiny_model, serve_python, tmp_path):
    """The 2-layer model served with kv_cache_dtype fp8 and `infertool eval` (engine vllm) against the original at
    auto (eval.base_serve): the eval runs to its verdict and the candidate's server took --kv-cache-dtype fp8."""
    data = {"name": "kv-fp8", "model": {"source": str(tiny_model)},
            "quantize": {"method": "gptq", "bits": 4, "group_size": 64, "output": str(tmp_path / "q"),
                         "calibration": {"source": "builtin", "samples": 8, "seq_len": 64, "seed": 0}},
            "eval": {"engine": "vllm", "suite": "builtin-corpus", "max_items": 4,
                     "base_serve": {"kv_cache_dtype": "auto"}},
            "serve": {"max_model_len": 1024, "enforce_eager": True, "kv_cache_dtype": "fp8",
                      "cpu": {"kv_cache_space_gib": 1}}}
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump(data))
    assert run_cli("quantize", str(path)).returncode == 0
    r = run_cli("eval", str(path), "--out", str(tmp_path / "eval"), "--json", timeout=1800)
    assert r.returncode in (0, 1), r.stderr[-3000:]  # a verdict (PASS or FAIL), never an engine refusal
    logs = [p.read_text(errors="replace") for p in (tmp_path / "eval").rglob("*.log")]
    # vLLM's cache config says what it stores (vllm/config/cache.py): the candidate in fp8, the original at auto
    assert sum("Using fp8 data type to store kv cache" in text for text in logs) == 1, logs


def test_a_kv_cache_too_small_offers_fp8_only_where_the_engine_stores_it(tmp_path, monkeypatch):
    data = _recipe(_model(tmp_path), max_model_len=8192)
    data["serve"]["cpu"] = {"kv_cache_space_gib": 0.01}  # 10 MiB: 3,328 float32 tokens, fewer than 8,192
    monkeypatch.setenv("INFERTOOL_CPU_FLAGS", AVX2)
    [why] = _plan(data).reasons
    assert "vLLM would refuse to start" in why and "fp8" not in why
    monkeypatch.setenv("INFERTOOL_CPU_FLAGS", AVX512)
    [why] = _plan(data).reasons
    assert "use kv_cache_dtype fp8" in why
