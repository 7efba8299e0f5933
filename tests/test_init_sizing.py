"""Issue 23, init that fits the target: config.json against the safetensors headers (models.consistency), init's
--set / --method / --slo / --traffic, and the original's own server (eval.base_serve) as every command reads it.

Models are crafted directories (tests/fakes.layout_model: config.json and safetensors headers over sparse holes);
the CLI runs in process (conftest.cli_in_process): exit codes and messages are the point, nothing is served."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from infertool.init import InitOptions, init_target, make_recipe, parse_slo
from infertool.errors import UsageError
from infertool.models.consistency import config_vs_weights
from tests.conftest import cli_in_process
from tests.fakes import config_for, layout_model

GIB = 2**30


@pytest.fixture(autouse=True)
def _isolated(tmp_path, monkeypatch):
    """A CPU host with 64 GiB, an empty Hugging Face cache and an empty infertool home, whatever this machine is."""
    from infertool.perf import host

    monkeypatch.setenv("INFERTOOL_ACCELERATOR", "cpu")
    monkeypatch.setenv("INFERTOOL_CPU_FLAGS", "avx2 avx512f avx512bw")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf-cache"))
    monkeypatch.setenv("INFERTOOL_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(host, "_meminfo", lambda key: 64 * GIB if key in ("MemTotal", "MemAvailable") else None)
    monkeypatch.chdir(tmp_path)


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("models")
    return {"8b": layout_model(root / "Llama-3.1-8B-Instruct", "llama-3.1-8b"),
            "70b": layout_model(root / "Llama-3.3-70B-Instruct", "llama-3.3-70b")}


def _json(r) -> dict:
    return json.loads(r.stdout)


# ------------------------------------------------------------------------------------------- config vs weights
def test_config_vs_weights_agree_on_real_shapes(models):
    assert config_vs_weights(models["8b"]) == []
    assert config_vs_weights(models["70b"]) == []


def test_a_70b_config_over_8b_weights_is_said_with_figures(tmp_path):
    d = layout_model(tmp_path / "m", "llama-3.1-8b")
    (d / "config.json").write_text(json.dumps(config_for("llama-3.3-70b")))
    found = config_vs_weights(d)
    assert found[0] == ("config.json says 80 layers (num_hidden_layers), the weights hold 32 (model.layers.0 to "
                        "model.layers.31)")
    assert ("model.layers.0.mlp.down_proj.weight is [4096, 14336] in the weights, config.json implies [8192, 28672] "
            "(hidden_size 8192, intermediate_size 28672)") in found
    assert any(f.startswith("model.embed_tokens.weight is [128256, 4096]") for f in found)
    assert len([f for f in found if "self_attn.q_proj" in f]) == 1  # one finding per tensor role, not per layer


def test_missing_layers_and_packed_weights(tmp_path):
    d = layout_model(tmp_path / "gap", "smollm2-135m", shards=1)
    cfg = json.loads((d / "config.json").read_text())
    cfg["num_hidden_layers"] += 2  # the weights hold layers 0..29; the config says 32
    (d / "config.json").write_text(json.dumps(cfg))
    assert config_vs_weights(d) == [f"config.json says {cfg['num_hidden_layers']} layers (num_hidden_layers), the "
                                    f"weights hold {cfg['num_hidden_layers'] - 2} (model.layers.0 to model.layers."
                                    f"{cfg['num_hidden_layers'] - 3})"]
    # a packed int4 weight (I32 container) has no shape of its own: not compared; an unpacked one is
    import struct

    q = tmp_path / "packed"
    q.mkdir()
    (q / "config.json").write_text(json.dumps(config_for("smollm2-135m", num_hidden_layers=1)))
    h, i = 576, 1536  # SmolLM2-135M: hidden 576, intermediate 1536

    def write(dtype: str, width: int, shape: list[int]) -> None:
        n = shape[0] * shape[1] * width
        raw = json.dumps({"model.layers.0.mlp.down_proj.weight": {"dtype": dtype, "shape": shape,
                                                                   "data_offsets": [0, n]}}).encode()
        with open(q / "model.safetensors", "wb") as f:
            f.write(struct.pack("<Q", len(raw)) + raw)
            f.truncate(8 + len(raw) + n)

    write("I32", 4, [i // 8, h])  # GPTQ's packing: 8 int4 per int32, transposed
    assert config_vs_weights(q) == []
    write("BF16", 2, [i, h])  # unpacked and transposed: compared
    assert config_vs_weights(q) == ["model.layers.0.mlp.down_proj.weight is [1536, 576] in the weights, config.json "
                                    "implies [576, 1536] (hidden_size 576, intermediate_size 1536)"]


def test_init_refuses_a_config_that_does_not_describe_its_weights(tmp_path):
    d = layout_model(tmp_path / "mismatch", "llama-3.1-8b")
    (d / "config.json").write_text(json.dumps(config_for("llama-3.3-70b")))
    r = cli_in_process("init", str(d), "--gpu", "H100-SXM", "--out", "x.yaml")
    assert r.returncode == 2, r.stderr
    assert "config.json says 80 layers (num_hidden_layers), the weights hold 32" in r.stderr
    assert "[4096, 14336] in the weights" in r.stderr and "Traceback" not in r.stderr
    assert not Path("x.yaml").exists()
    # the same as a user runs it: a real process, its exit code and its message
    from tests.conftest import run_cli

    r = run_cli("init", str(d), "--gpu", "H100-SXM", "--out", str(tmp_path / "y.yaml"), "--json", timeout=120)
    assert r.returncode == 2 and not (tmp_path / "y.yaml").exists()
    err = json.loads(r.stdout)
    assert err["exit_code"] == 2 and "config.json says 80 layers (num_hidden_layers), the weights hold 32" in err["message"]


# ------------------------------------------------------------------------------------------- --set, --method, --slo, --traffic
def test_set_pins_what_the_fit_decides_from_and_the_rest_is_applied(models):
    r = cli_in_process("init", str(models["70b"]), "--gpu", "H100-SXM", "--json", "--out", "tp2.yaml",
                       "--set", "serve.tensor_parallel_size=2", "--set", "serve.max_model_len=16384",
                       "--set", "bench.requests=64")
    assert r.returncode == 0, r.stderr
    data = _json(r)
    s = data["recipe"]["serve"]
    assert s["tensor_parallel_size"] == 2 and s["max_model_len"] == 16384 and data["recipe"]["bench"]["requests"] == 64
    tp = [d for d in data["decisions"] if d["field"] == "serve.tensor_parallel_size"]
    assert "pinned by --set" in tp[0]["why"] and "(plan: TP 2: the quantized model" in tp[0]["why"]
    assert "TP 1:" not in tp[0]["why"]  # only the pinned degree is tried; the original is sized from it up
    assert "base_serve" not in data["recipe"]["eval"]  # the original starts on 2 as well: one setting
    assert yaml.safe_load(Path("tp2.yaml").read_text())["serve"]["tensor_parallel_size"] == 2


def test_a_bad_set_is_refused_with_its_field(models):
    r = cli_in_process("init", str(models["8b"]), "--gpu", "L4", "--out", "x.yaml", "--set", "serve.no_such=1")
    assert r.returncode == 2 and "serve.no_such" in r.stderr and not Path("x.yaml").exists()
    r = cli_in_process("init", str(models["8b"]), "--gpu", "L4", "--out", "x.yaml", "--set", "serve.max_num_seqs")
    assert r.returncode == 2 and "KEY=VALUE" in r.stderr
    r = cli_in_process("init", str(models["8b"]), "--gpu", "L4", "--out", "x.yaml", "--set",
                       "serve.tensor_parallel_size=three")
    assert r.returncode == 2 and "serve.tensor_parallel_size" in r.stderr and "Traceback" not in r.stderr
    r = cli_in_process("init", str(models["8b"]), "--gpu", "L4", "--out", "x.yaml", "--set",
                       "serve.tensor_parallel_size=3")  # vLLM would refuse it: said before anything is written
    assert r.returncode == 2 and "32 attention heads are not divisible by tensor_parallel_size 3" in r.stderr
    r = cli_in_process("init", str(models["8b"]), "--gpu", "L4", "--out", "x.yaml", "--set",
                       "eval.base_serve.tensor_parallel_size=3")
    assert r.returncode == 2 and "does not divide the model's 32 attention heads" in r.stderr and not Path("x.yaml").exists()


def test_method_is_what_the_backends_produce(models):
    recipe, decisions = make_recipe(str(models["8b"]), init_target(gpu="A100-80GB-SXM"),
                                    options=InitOptions(method="fp8"))
    assert recipe["quantize"] == {"method": "rtn", "scheme": "FP8_DYNAMIC"}
    note = [d for d in decisions if d.field == "quantize.method"][0]
    assert note.level == "warning" and "no FP8 tensor cores" in note.why
    recipe, _ = make_recipe(str(models["8b"]), init_target(gpu="H100-SXM"), options=InitOptions(method="awq"))
    assert recipe["quantize"]["method"] == "awq" and recipe["quantize"]["group_size"] == 128
    recipe, _ = make_recipe(str(models["8b"]), init_target(gpu="H100-SXM"), options=InitOptions(method="w8a8"))
    assert recipe["quantize"]["scheme"] == "W8A8" and recipe["name"].endswith("w8a8-h100")
    r = cli_in_process("init", str(models["8b"]), "--gpu", "L4", "--method", "nf4", "--out", "x.yaml")
    assert r.returncode == 2 and "gptq, w4a16, awq, w8a8, fp8" in r.stderr


def test_an_explicit_infeasible_slo_is_kept_and_the_batch_lowered(models):
    """L4, 8B 4-bit: the plan's decode step is 52.1 ms at batch 128; tpot_ms 30 is the user's: kept, said, exit 0."""
    r = cli_in_process("init", str(models["8b"]), "--gpu", "L4", "--method", "gptq", "--slo", "ttft_ms=800,tpot_ms=30",
                       "--json", "--out", "slo.yaml")
    assert r.returncode == 0, r.stderr
    data = _json(r)
    assert data["recipe"]["bench"]["slo"] == {"ttft_ms": 800.0, "tpot_ms": 30.0}
    warn = [d for d in data["decisions"] if d["field"] == "bench.slo" and d["level"] == "warning"]
    assert len(warn) == 1 and "52.1 ms at batch 128" in warn[0]["why"] and "(yours, kept)" in warn[0]["why"]
    seqs = data["recipe"]["serve"]["max_num_seqs"]
    assert 1 <= seqs < 128 and f"lowered to {seqs}" in warn[0]["why"]
    # no batch meets 1 ms: said, kept, exit code unchanged
    r = cli_in_process("init", str(models["8b"]), "--gpu", "L4", "--slo", "tpot_ms=1", "--json", "--out", "one.yaml")
    assert r.returncode == 0
    warn = [d for d in _json(r)["decisions"] if d["field"] == "bench.slo" and d["level"] == "warning"]
    assert "no batch meets it" in warn[0]["why"] and _json(r)["recipe"]["serve"]["max_num_seqs"] == 128


def test_slo_parsing():
    assert parse_slo("ttft_ms=500, tpot_ms=60") == {"ttft_ms": 500.0, "tpot_ms": 60.0}
    for bad in ("tpot=50", "tpot_ms=fast", "tpot_ms=-1", "ttft_ms=1e400"):
        with pytest.raises(UsageError, match="--slo"):
            parse_slo(bad)


def test_traffic_file_sizes_the_context(models, tmp_path):
    f = tmp_path / "prompts.jsonl"
    f.write_text("\n".join(json.dumps({"prompt": "x" * n}) for n in (400, 4000, 40000)) + "\n")  # 100..10,000 tokens
    r = cli_in_process("init", str(models["8b"]), "--gpu", "H100-SXM", "--traffic", str(f), "--json", "--out", "t.yaml")
    assert r.returncode == 0, r.stderr
    data = _json(r)
    b, s = data["recipe"]["bench"], data["recipe"]["serve"]
    assert b["prompt"]["source"] == str(f) and b["prompt"]["len"] == 3700  # the mean, for the KV sizing
    assert s["max_model_len"] == 11264  # the longest (10,000) + 256 output tokens, to 1,024
    why = [d for d in data["decisions"] if d["field"] == "bench.prompt"][0]["why"]
    assert "3 prompts, 3,700 tokens on average and 10,000 at most" in why
    r = cli_in_process("init", str(models["8b"]), "--gpu", "H100-SXM", "--traffic", str(tmp_path / "p.txt"))
    assert r.returncode == 2 and "not a .jsonl file" in r.stderr
    (tmp_path / "empty.jsonl").write_text("")
    r = cli_in_process("init", str(models["8b"]), "--gpu", "H100-SXM", "--traffic", str(tmp_path / "empty.jsonl"))
    assert r.returncode == 2 and "empty: a prompt file needs content" in r.stderr


# ------------------------------------------------------------------------------------------- eval.base_serve everywhere
def test_base_serve_in_plan_dry_runs_and_validation(models):
    r = cli_in_process("init", str(models["70b"]), "--gpu", "H100-SXM", "--out", "r.yaml")
    assert r.returncode == 0, r.stderr
    assert "plan of the original (the eval serves it with eval.base_serve: 2 GPU(s))" in r.stderr
    p = cli_in_process("plan", "r.yaml", "--json")
    tp = _json(p)["tensor_parallel"]
    assert tp["served"]["tensor_parallel_size"] == 1 and tp["base"]["tensor_parallel_size"] == 2
    assert tp["base"]["why"].startswith("eval.base_serve")
    p = cli_in_process("plan", "r.yaml")
    assert "the eval's original: tensor_parallel_size 2" in p.stdout
    e = cli_in_process("eval", "r.yaml", "--dry-run")
    assert e.returncode == 0, e.stderr
    text = e.stdout + e.stderr
    base_line = next(line for line in text.splitlines() if "--model " + str(models["70b"]) in line)
    cand_line = next(line for line in text.splitlines() if "api_server --model" in line and line != base_line)
    assert "--tensor-parallel-size 2" in base_line and "--tensor-parallel-size" not in cand_line
    bad = cli_in_process("validate", "r.yaml", "--set", "eval.base_serve.tensor_parallel_size=0")
    assert bad.returncode == 2 and "eval.base_serve.tensor_parallel_size" in bad.stderr
    bad = cli_in_process("validate", "r.yaml", "--set", "eval.base_serve.model=original")
    assert bad.returncode == 2 and "eval.base_serve.model" in bad.stderr
    bad = cli_in_process("validate", "r.yaml", "--set", "eval.base_serve.max_model_len=256")
    assert bad.returncode == 2 and "eval.seq_len" in bad.stderr


def test_serve_for_gives_the_original_its_own_settings(models):
    from infertool.recipe import load_recipe
    from infertool.resolve import resolve

    assert cli_in_process("init", str(models["70b"]), "--gpu", "H100-SXM", "--out", "r.yaml").returncode == 0
    res = resolve(load_recipe("r.yaml"))
    cand, why_c = res.serve_for(res.candidate)
    base, why_b = res.serve_for(res.base)
    assert cand.tensor_parallel_size == 1 and base.tensor_parallel_size == 2 and not why_c
    assert why_b == ["eval.base_serve: the original model is served with tensor_parallel_size 2 (the serve section "
                     "is sized for the quantized model)"]
    arm = res.serve_section.model_copy(update={"max_num_seqs": 8})  # a bench arm / tune trial's section
    assert res.serve_for(res.base, arm)[0].tensor_parallel_size == 2 and res.serve_for(res.base, arm)[0].max_num_seqs == 8


def test_the_report_says_both_parallel_setups():
    from infertool.report.sections import parallel_setup as _parallel_setup

    recipe = {"target": {"gpu": "H100-SXM"}, "serve": {"tensor_parallel_size": 1, "pipeline_parallel_size": 1},
              "eval": {"base_serve": {"tensor_parallel_size": 2, "pipeline_parallel_size": None}}}
    lines = _parallel_setup(recipe)
    assert lines[0].startswith("served (and deployed) with tensor_parallel_size 1 x pipeline_parallel_size 1")
    assert lines[1].startswith("the eval's original served with tensor_parallel_size 2 x pipeline_parallel_size 1")
    assert _parallel_setup({"serve": {"tensor_parallel_size": 1}}) == []  # a CPU recipe
    assert _parallel_setup(None) == [] and _parallel_setup({"target": {"gpu": "L4"}, "serve": "x"}) == []
