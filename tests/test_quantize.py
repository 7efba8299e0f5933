"""Fast tests of `infertool quantize`: preflight on synthetic safetensors headers, calibration windows,
backend settings, token agreement, and the CLI's errors (real subprocesses, no backend environment)."""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path

import pytest

from conftest import run_cli
from infertool.errors import UsageError
from infertool.models.info import model_info
from infertool.data import calibration as cal
from infertool.backends import gptqmodel as gq
from infertool.backends import llmcompressor as llmc
from infertool.quantize.core import default_output
from infertool.backends.layers import linear_layers, matches_ignore, valid_group_sizes
from infertool.quantize.preflight import check_safetensors_files
from infertool.quantize.preflight import preflight as quantize_preflight
from infertool.backends.greedy import token_agreement
from infertool.quantize.verify import vllm_reason

HIDDEN, INTER, HEADS, KV, VOCAB = 576, 1536, 9, 3, 256


def write_fake_model(dest: Path, layers: int = 2, model_type: str = "llama", hidden: int = HIDDEN,
                     inter: int = INTER) -> Path:
    """A Llama-shaped HF directory whose safetensors file has a real header and sparse (zero) data."""
    dest.mkdir(parents=True, exist_ok=True)
    head_dim = hidden // HEADS
    tensors: dict[str, list[int]] = {"model.embed_tokens.weight": [VOCAB, hidden], "model.norm.weight": [hidden]}
    for i in range(layers):
        p = f"model.layers.{i}."
        tensors.update({
            p + "self_attn.q_proj.weight": [hidden, hidden],
            p + "self_attn.k_proj.weight": [KV * head_dim, hidden],
            p + "self_attn.v_proj.weight": [KV * head_dim, hidden],
            p + "self_attn.o_proj.weight": [hidden, hidden],
            p + "mlp.gate_proj.weight": [inter, hidden],
            p + "mlp.up_proj.weight": [inter, hidden],
            p + "mlp.down_proj.weight": [hidden, inter],
            p + "input_layernorm.weight": [hidden],
            p + "post_attention_layernorm.weight": [hidden],
        })
    header, offset = {}, 0
    for name, shape in tensors.items():
        n = 2
        for d in shape:
            n *= d
        header[name] = {"dtype": "BF16", "shape": shape, "data_offsets": [offset, offset + n]}
        offset += n
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    with open(dest / "model.safetensors", "wb") as f:
        f.write(struct.pack("<Q", len(raw)) + raw)
        f.truncate(8 + len(raw) + offset)
    (dest / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "model_type": model_type, "hidden_size": hidden,
        "intermediate_size": inter, "num_attention_heads": HEADS, "num_key_value_heads": KV,
        "num_hidden_layers": layers, "vocab_size": VOCAB, "tie_word_embeddings": True, "torch_dtype": "bfloat16",
    }))
    return dest


def q(**kw) -> dict:
    base = {"method": "gptq", "backend": "gptqmodel", "bits": 4, "group_size": 64, "sym": True,
            "calibration": {"source": "builtin", "samples": 8, "seq_len": 64, "seed": 0}, "ignore": []}
    base.update(kw)
    return base


@pytest.fixture
def fake_model(tmp_path) -> Path:
    return write_fake_model(tmp_path / "fake")


def preflight(model: Path, quant: dict, serve: dict | None = None, **kw):
    from pydantic import TypeAdapter

    from infertool.recipe import QuantizeSection

    return quantize_preflight(model_info(model), TypeAdapter(QuantizeSection).validate_python(quant), serve=serve,
                              output=None, has_cuda=False, memory=kw.pop("memory", ("cpu", 64 * 2**30)), **kw)


# ------------------------------------------------------------------------------------------ preflight
def test_linear_layers_from_headers(fake_model):
    linears = linear_layers([fake_model / "model.safetensors"])
    assert len(linears) == 14
    names = {l.name for l in linears}
    assert "model.layers.0.self_attn.q_proj" in names and "model.layers.1.mlp.down_proj" in names
    assert not any("embed" in n or "norm" in n for n in names)
    down = next(l for l in linears if l.name == "model.layers.0.mlp.down_proj")
    assert (down.in_features, down.out_features, down.layer) == (INTER, HIDDEN, 0)
    assert valid_group_sizes(linears) == [16, 32, 64, -1]  # gcd(576, 1536) = 192


def test_group_size_128_refused_with_layer_names_and_valid_sizes(fake_model):
    report = preflight(fake_model, q(group_size=128))
    assert not report.ok
    (check,) = report.errors
    assert check.name == "group_size"
    assert "in_features 576" in check.detail and "12 of 14" in check.detail
    assert "self_attn.q_proj (layers 0-1" in check.detail and "model.layers.0." in check.detail
    assert "valid group sizes for this model: 16, 32, 64" in check.detail
    assert "down_proj" not in check.detail.split("(e.g.")[0]  # 1536 is a multiple of 128


@pytest.mark.parametrize("group", [32, 64, -1])
def test_group_sizes_that_divide_pass(fake_model, group):
    report = preflight(fake_model, q(group_size=group))
    assert report.ok, report.errors
    assert report.quantized_linears == 14


def test_ignore_patterns(fake_model):
    assert matches_ignore("model.layers.0.mlp.down_proj", ["down_proj"])
    assert matches_ignore("model.layers.0.mlp.down_proj", ["*.mlp.*"])
    assert matches_ignore("model.layers.1.self_attn.q_proj", ["re:layers\\.1\\."])
    assert not matches_ignore("model.layers.0.mlp.down_proj", ["proj"])
    # ignoring every 576-wide layer leaves only down_proj (1536 = 12 x 128): g128 becomes valid
    report = preflight(fake_model, q(group_size=128, ignore=["*.self_attn.*", "*.gate_proj", "*.up_proj"]))
    assert report.ok and report.quantized_linears == 2


def test_tensor_parallel_checks(fake_model):
    bad = preflight(fake_model, q(), serve={"tensor_parallel_size": 2})
    (check,) = bad.errors
    assert check.name == "tensor_parallel" and "9 attention heads" in check.detail and "3 KV heads" in check.detail
    ok = preflight(fake_model, q(), serve={"tensor_parallel_size": 3})
    assert ok.ok, ok.errors  # 9/3 heads, 3/3 KV heads, 576/3 = 192 = 3 x 64 per row-parallel shard
    shard = preflight(fake_model, q(group_size=64), serve={"tensor_parallel_size": 9})
    (check,) = shard.errors  # heads 9/9 and KV 3 | 9 are fine; the quantized shapes are not
    assert "attention heads" not in check.detail
    assert "row-parallel" in check.detail and "mlp.down_proj" in check.detail  # 1536 / 9 is no integer
    assert "column-parallel" in check.detail and "self_attn.k_proj" in check.detail  # 192 / 9 neither


def test_architecture_and_memory_and_disk(tmp_path):
    odd = write_fake_model(tmp_path / "odd", model_type="made_up_lm")
    report = preflight(odd, q())
    assert [c.name for c in report.errors] == ["architecture"]
    assert "made_up_lm" in report.errors[0].detail and "llmcompressor" in report.errors[0].detail
    assert preflight(odd, q(backend="llmcompressor")).ok  # any *ForCausalLM
    small = preflight(tmp_path / "odd", q(backend="llmcompressor"), memory=("cpu", 10 * 2**20))
    assert [c.name for c in small.errors] == ["memory"] and "lower quantize.calibration.samples" in small.errors[0].detail


def test_output_estimate_is_smaller_for_fewer_bits(fake_model):
    r4, r8 = preflight(fake_model, q(bits=4)), preflight(fake_model, q(bits=8))
    assert r4.output_estimate_bytes < r8.output_estimate_bytes < r4.weight_bytes


def test_truncated_safetensors_detected(fake_model):
    f = fake_model / "model.safetensors"
    os.truncate(f, f.stat().st_size - 100)
    (problem,) = check_safetensors_files([f])
    assert "corrupt or truncated" in problem
    # the model's facts refuse it before any preflight: a tensor's data_offsets lie past the end of the file
    with pytest.raises(UsageError, match="past the end of the file's data .*corrupt or truncated"):
        preflight(fake_model, q())


def test_llmcompressor_plan():
    def cfg(d: dict) -> llmc.Cfg:
        return (llmc.LLMCompressorAWQ if d["method"] == "awq" else llmc.LLMCompressorGPTQ).model_validate(d)

    p = llmc.plan(cfg(q(backend="llmcompressor")), has_cuda=False)
    assert p.modifier == "GPTQModifier" and p.scheme == "W4A16" and p.runnable_here
    assert p.weights == {"num_bits": 4, "type": "int", "symmetric": True, "strategy": "group", "group_size": 64}
    fp8 = llmc.plan(cfg(q(backend="llmcompressor", scheme="FP8_DYNAMIC")), has_cuda=False)
    assert fp8.needs_gpu and not fp8.runnable_here
    with pytest.raises(Exception, match="needs a GPU"):
        llmc.refuse_on_host(fp8, "gptq")
    awq = llmc.plan(cfg({"method": "awq", "backend": "llmcompressor", "group_size": 64}), has_cuda=False)
    with pytest.raises(Exception, match="pin_memory needs an accelerator"):
        llmc.refuse_on_host(awq, "awq")
    assert llmc.plan(cfg({"method": "awq", "group_size": 64}), has_cuda=True).runnable_here


# ---------------------------------------------------------------------------------------- calibration
def test_select_windows_deterministic_and_non_overlapping():
    ids = list(range(10_000))
    a, overlap = cal.select_windows(ids, 8, 64, seed=0)
    b, _ = cal.select_windows(ids, 8, 64, seed=0)
    c, _ = cal.select_windows(ids, 8, 64, seed=1)
    assert a == b and a != c and not overlap
    assert all(len(w) == 64 for w in a)
    starts = sorted(w[0] for w in a)
    assert all(s % 64 == 0 for s in starts) and len(set(starts)) == 8  # distinct aligned pieces
    assert cal.windows_sha256(a) == cal.windows_sha256(b) != cal.windows_sha256(c)


def test_select_windows_overlap_fallback_and_too_short():
    windows, overlap = cal.select_windows(list(range(100)), 8, 64, seed=3)
    assert overlap and len(windows) == 8 and all(len(w) == 64 for w in windows)
    with pytest.raises(UsageError, match="fewer than seq_len 64"):
        cal.select_windows(list(range(10)), 1, 64, seed=0)


def test_calibration_sources(tmp_path):
    info = cal.check_source(cal.CalibrationRequest("builtin"))
    assert info.kind == "builtin" and info.characters > 100_000 and info.python_version
    assert cal.check_source(cal.CalibrationRequest("builtin")).text_sha256 == info.text_sha256
    txt = tmp_path / "c.txt"
    txt.write_text("hello world " * 100)
    assert cal.check_source(cal.CalibrationRequest(str(txt))).kind == "txt"
    jl = tmp_path / "c.jsonl"
    jl.write_text('{"text": "one"}\n\n{"text": "two"}\n')
    assert cal.check_source(cal.CalibrationRequest(str(jl))).documents == 2
    jl.write_text('{"text": "one"}\n{"body": "two"}\n')
    with pytest.raises(UsageError, match="line 2: expected an object with a string field 'text'"):
        cal.check_source(cal.CalibrationRequest(str(jl)))
    jl.write_text('{"text": "one"}\nnot json\n')
    with pytest.raises(UsageError, match="line 2: not valid JSON"):
        cal.check_source(cal.CalibrationRequest(str(jl)))
    with pytest.raises(UsageError, match=r"quantize.calibration.source: .*missing.txt: not found"):
        cal.check_source(cal.CalibrationRequest(str(tmp_path / "missing.txt")))
    (tmp_path / "rel.txt").write_text("text " * 50)
    assert cal.check_source(cal.CalibrationRequest("rel.txt"), base_dir=tmp_path).source == str(tmp_path / "rel.txt")


# -------------------------------------------------------------------------------- backends / verify
def test_gptqmodel_config_kwargs():
    spec = gq.build_spec(gq.GPTQModelGPTQ.model_validate(q(desc_act=True, damp_percent=0.05)), model=Path("/m"),
                         out_dir=Path("/o"),
                         offload_dir=Path("/x"), ignore_modules=["model.layers.0.mlp.down_proj"],
                         num_layers=2, base_dir=None)
    kw = gq.quantize_config_kwargs(spec)
    assert kw["bits"] == 4 and kw["group_size"] == 64 and kw["desc_act"] and kw["act_group_aware"] is False
    assert kw["damp_percent"] == 0.05 and kw["true_sequential"] is True
    (pattern,) = kw["dynamic"]
    assert pattern == r"-:^(?:model\.layers\.0\.mlp\.down_proj)$"
    awq = gq.quantize_config_kwargs(gq.build_spec(gq.GPTQModelAWQ.model_validate(
        {"method": "awq", "bits": 4, "group_size": 32, "zero_point": True, "format": "gemv", "calibration": {}}),
        model=Path("/m"), out_dir=Path("/o"), offload_dir=Path("/x"), ignore_modules=[], num_layers=2, base_dir=None))
    assert awq == {"bits": 4, "group_size": 32, "quant_method": "awq", "format": "gemv", "sym": False}


def test_layer_errors_parsing():
    rows = gq.layer_errors([{"process": "gptq", "layer": 1, "module": "mlp.up_proj", "feat: in, out": "576, 1536",
                             "loss": "0.0015", "samples": "512", "damp": "0.01000", "time": "0.3"}])
    assert rows == [{"layer": 1, "module": "mlp.up_proj", "process": "gptq", "features_in_out": "576, 1536",
                     "loss": 0.0015, "samples": 512, "damp": 0.01, "seconds": 0.3}]


def test_token_agreement_numbers():
    a = token_agreement([[1, 2, 3, 4], [5, 6]], [[1, 2, 9, 4], [5, 6]])
    assert a["agreement"] == 5 / 6 and a["identical"] == 1 and a["tokens"] == 6
    assert a["mean_first_divergence"] == (2 + 2) / 2
    short = token_agreement([[1, 2, 3]], [[1, 2]])
    assert short["agreement"] == 2 / 3 and short["identical"] == 0
    assert vllm_reason(RuntimeError("Engine failed\n\nAssertionError: shape mismatch")) == \
        "RuntimeError: AssertionError: shape mismatch"


def test_default_output():
    assert default_output("quickstart", "gptq") == Path("out/quickstart-gptq")


# ----------------------------------------------------------------------------------------------- CLI
def write_recipe(path: Path, model: Path | str, quantize: str) -> Path:
    path.write_text(f"name: t\nmodel:\n  source: {model}\nquantize:\n{quantize}")
    return path


GPTQ_SECTION = "  method: gptq\n  group_size: 64\n  calibration: {samples: 8, seq_len: 64}\n"


def leftovers(parent: Path, name: str) -> list[str]:
    return [p.name for p in parent.iterdir() if p.name == name or p.name.startswith(f".{name}.")] if parent.exists() else []


def test_cli_check_passes_and_writes_nothing(fake_model, tmp_path, tmp_home):
    recipe = write_recipe(tmp_path / "r.yaml", fake_model, GPTQ_SECTION)
    out = tmp_path / "q"
    r = run_cli("quantize", str(recipe), "--out", str(out), "--check", "--json")
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    assert data["ok"] and data["checked_only"] and data["output"] is None
    assert {c["name"] for c in data["preflight"]["checks"]} >= {"weights", "architecture", "group_size", "memory", "disk", "output"}
    assert not out.exists()
    # GPTQModel's worker computes the original's greedy tokens: the load check starts ONE vLLM server
    assert set(data["load_check"]) == {"quantized"} and data["load_check"]["quantized"]["model"] == str(out.absolute())


@pytest.mark.parametrize("serve, expected", [
    ("", None),  # auto: vLLM's CPU rule for the original (float32 without bf16 matrix instructions)
    ("serve: {dtype: bfloat16}\n", "bfloat16"),
    ("serve: {dtype: half}\n", "float16"),
    ("serve: {dtype: float32}\n", "float32"),
])
def test_reference_dtype_is_the_dtype_vllm_serves_the_original_in(fake_model, tmp_path, serve, expected):
    from infertool.quantize.core import reference_dtype
    from infertool.recipe import load_recipe
    from infertool.resolve import resolve

    recipe = write_recipe(tmp_path / "r.yaml", fake_model, GPTQ_SECTION)
    recipe.write_text(recipe.read_text() + serve)
    res = resolve(load_recipe(str(recipe)))
    got = reference_dtype(res, model_info(fake_model))
    if expected is None:
        settings, _ = res.serve_for(res.base)
        expected = settings.dtype if settings.dtype != "auto" else model_info(fake_model).dtype
    assert got == expected


def test_load_check_plans_the_original_only_without_a_reference(fake_model, tmp_path):
    from infertool.quantize.verify import plans, vllm_engine
    from infertool.recipe import load_recipe
    from infertool.resolve import resolve

    recipe = write_recipe(tmp_path / "r.yaml", fake_model, GPTQ_SECTION)
    res = resolve(load_recipe(str(recipe)), candidate_path=tmp_path / "q")
    both = plans(res, res.candidate, dry_run=True)
    one = plans(res, res.candidate, dry_run=True, original=False)
    assert set(both) == {"quantized", "original"} and set(one) == {"quantized"}
    assert one["quantized"].to_dict() == both["quantized"].to_dict()
    assert vllm_engine(one["quantized"]).startswith("vLLM ")


def test_load_check_launches_and_when_it_runs(fake_model, tmp_path, monkeypatch):
    """What `run --dry-run` shows of quantize's load check (``quantize.core.load_check_launches``): the quantized
    checkpoint alone where the backend's worker computes the original's reference tokens (GPTQModel), else the
    original too (llm-compressor); each launch without a port (the launcher picks it). Whether it runs
    (``load_check_runs``): a checkpoint, a recipe for this host, and --verify or the serve environment."""
    from infertool.envs import state as env_state
    from infertool.quantize.core import load_check_launches, load_check_runs
    from infertool.recipe import load_recipe
    from infertool.resolve import resolve

    def res(section: str, *extra: str):
        recipe = write_recipe(tmp_path / "r.yaml", fake_model, section)
        return resolve(load_recipe(str(recipe), list(extra)), candidate_path=tmp_path / "q")

    gptq = res(GPTQ_SECTION)
    launches = load_check_launches(gptq)
    assert list(launches) == ["quantized"] and launches["quantized"]["model"] == str(tmp_path / "q")
    assert launches["quantized"]["port"] is None and "auto" in launches["quantized"]["argv"]
    llmc = res(GPTQ_SECTION, "quantize.backend=llmcompressor")
    assert list(load_check_launches(llmc)) == ["quantized", "original"]
    ready = env_state.state("serve")
    ready.status = "ready"
    monkeypatch.setattr(env_state, "state", lambda name: ready)
    assert load_check_runs(gptq) and not load_check_runs(gptq, verify=False) and load_check_runs(gptq, verify=True)
    assert not load_check_runs(res("  method: bnb\n"))  # quantized when loaded: no checkpoint to check
    assert not load_check_runs(res(GPTQ_SECTION, "target.gpu=H100-SXM"))  # the recipe is for another host


def test_cli_group_size_128_refused(fake_model, tmp_path, tmp_home):
    recipe = write_recipe(tmp_path / "r.yaml", fake_model, GPTQ_SECTION)
    out = tmp_path / "q"
    r = run_cli("quantize", str(recipe), "--out", str(out), "--set", "quantize.group_size=128")
    assert r.returncode == 2
    assert "group_size 128 does not divide in_features 576" in r.stderr
    assert "model.layers.0.mlp.gate_proj" in r.stderr and "32, 64" in r.stderr
    assert "--set quantize.group_size=64" in r.stderr
    assert leftovers(tmp_path, "q") == [] and not (tmp_home / "logs").exists()  # no stage ran


@pytest.mark.parametrize(
    "quant, needle",
    [
        ("  method: gptq\n  grup_size: 64\n", "unknown field 'grup_size' (did you mean 'group_size'?)"),
        ("  method: sparsegpt\n", "unknown quantize method 'sparsegpt'"),
        ("  method: gptq\n  backend: auto-gptq\n", "end-of-life"),
        ("  method: bnb\n  calibration: {samples: 2}\n", "bnb quantizes on load"),
    ],
)
def test_cli_bad_recipes(fake_model, tmp_path, tmp_home, quant, needle):
    recipe = write_recipe(tmp_path / "r.yaml", fake_model, quant)
    r = run_cli("quantize", str(recipe), "--out", str(tmp_path / "q"))
    assert r.returncode == 2, r.stderr
    assert needle in r.stderr
    assert "Traceback" not in r.stderr and leftovers(tmp_path, "q") == []


def test_cli_missing_model_and_corrupt_weights(fake_model, tmp_path, tmp_home):
    recipe = write_recipe(tmp_path / "r.yaml", tmp_path / "nowhere", GPTQ_SECTION)
    r = run_cli("quantize", str(recipe), "--out", str(tmp_path / "q"), "--json")
    assert r.returncode == 2 and "model not found" in json.loads(r.stdout)["message"]
    f = fake_model / "model.safetensors"
    os.truncate(f, f.stat().st_size // 2)
    recipe = write_recipe(tmp_path / "r2.yaml", fake_model, GPTQ_SECTION)
    r = run_cli("quantize", str(recipe), "--out", str(tmp_path / "q"))
    assert r.returncode == 2 and "corrupt or truncated" in r.stderr
    f.write_bytes(b"\xff" * 4)  # not even a header
    r = run_cli("quantize", str(recipe), "--out", str(tmp_path / "q"))
    assert r.returncode == 2 and "not a safetensors file" in r.stderr
    assert leftovers(tmp_path, "q") == [] and "Traceback" not in r.stderr


def test_cli_existing_output_needs_force(fake_model, tmp_path, tmp_home):
    recipe = write_recipe(tmp_path / "r.yaml", fake_model, GPTQ_SECTION)
    out = tmp_path / "q"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    r = run_cli("quantize", str(recipe), "--out", str(out))
    assert r.returncode == 2 and "already exists" in r.stderr and "--force" in r.stderr
    assert (out / "keep.txt").read_text() == "mine"
    r = run_cli("quantize", str(recipe), "--out", str(fake_model / "sub"))
    assert r.returncode == 2 and "overlaps the source model" in r.stderr
    r = run_cli("quantize", str(recipe), "--out", str(out), "--force")  # --force replaces a model folder, not this
    assert r.returncode == 2 and "holds no config.json" in r.stderr, r.stderr
    assert (out / "keep.txt").read_text() == "mine" and "Traceback" not in r.stderr
    home = tmp_path / "home"
    (home / "sub").mkdir(parents=True)
    (home / "notes.txt").write_text("mine")
    r = run_cli("quantize", str(recipe), "--out", str(home), "--force", env={"HOME": str(home)})
    assert r.returncode == 2 and "the home folder" in r.stderr, r.stderr
    assert (home / "notes.txt").read_text() == "mine"


def test_cli_missing_backend_env_is_exit_3_and_leaves_nothing(fake_model, tmp_path, tmp_home):
    recipe = write_recipe(tmp_path / "r.yaml", fake_model,
                          "  method: gptq\n  backend: llmcompressor\n  group_size: 64\n  calibration: {samples: 8, seq_len: 64}\n")
    r = run_cli("quantize", str(recipe), "--out", str(tmp_path / "q"))
    assert r.returncode == 3, r.stderr
    assert "'llmcompressor' environment, which is not set up" in r.stderr and "infertool env setup llmcompressor" in r.stderr
    assert leftovers(tmp_path, "q") == []


def test_cli_llmcompressor_awq_on_cpu(fake_model, tmp_path, tmp_home):
    from infertool.perf.host import has_cuda

    if has_cuda():
        pytest.skip("a CUDA host runs llm-compressor's AWQ")
    recipe = write_recipe(tmp_path / "r.yaml", fake_model,
                          "  method: awq\n  backend: llmcompressor\n  group_size: 64\n  calibration: {samples: 8, seq_len: 64}\n")
    r = run_cli("quantize", str(recipe), "--out", str(tmp_path / "q"), "--check", "--json")
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    assert data["preflight"]["plan"]["llmcompressor"]["needs_gpu"] and any("pin_memory" in w for w in data["warnings"])
    assert set(data["load_check"]) == {"quantized", "original"}  # llm-compressor: the original served by vLLM too
    r = run_cli("quantize", str(recipe), "--out", str(tmp_path / "q"))
    assert r.returncode == 3 and "pin_memory needs an accelerator" in r.stderr and "backend: gptqmodel" in r.stderr
    assert leftovers(tmp_path, "q") == []


def test_cli_bnb_is_refused_everywhere_with_the_measured_reason(fake_model, tmp_path, tmp_home):
    """vLLM has no bitsandbytes method any more: a bnb candidate could never be served as tested. Refused before
    anything runs, for this CPU and for a GPU target alike; eval and serve say the same."""
    recipe = write_recipe(tmp_path / "r.yaml", fake_model, "  method: bnb\n  quant_type: nf4\n")
    out = tmp_path / "q"
    for extra in ([], ["--set", "target.gpu=L4"]):
        r = run_cli("quantize", str(recipe), "--out", str(out), *extra)
        assert r.returncode == 2 and "Unknown quantization method: bitsandbytes" in r.stderr and not out.exists()
    r = run_cli("eval", str(recipe))
    assert r.returncode == 2 and "no bitsandbytes quantization method" in r.stderr
    r = run_cli("serve", str(recipe), "--dry-run")  # the check registry (vllm_support) refuses it, on stderr
    assert r.returncode == 2 and "error: vllm_support: quantize.method:" in r.stderr
    assert "no bitsandbytes quantization method" in r.stderr


def test_cli_verify_without_serve_env_fails_before_quantizing(fake_model, tmp_path, tmp_home):
    recipe = write_recipe(tmp_path / "r.yaml", fake_model, GPTQ_SECTION)
    r = run_cli("quantize", str(recipe), "--out", str(tmp_path / "q"), "--verify")
    assert r.returncode == 3 and "--verify (the vLLM load check)" in r.stderr and "env setup serve" in r.stderr
    assert leftovers(tmp_path, "q") == [] and not (tmp_home / "logs").exists()


def test_load_check_greedy_sends_the_prompts_in_one_request_and_keeps_their_order():
    """vLLM decodes the prompts as one batch; its choices are matched to the prompts by index."""
    import threading
    from http.server import BaseHTTPRequestHandler, HTTPServer
    from types import SimpleNamespace

    from infertool.quantize.verify import greedy

    bodies = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802 - http.server's name
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            bodies.append(body)
            n = len(body["prompt"]) - (body.get("max_tokens") == 1)  # max_tokens 1: one choice missing
            choices = [{"index": i, "text": f"t{i}", "logprobs": {"tokens": [f"token_id:{i}", f"token_id:{10 + i}"]}}
                       for i in reversed(range(n))]
            data = json.dumps({"choices": choices}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args):
            pass

    server = HTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        srv = SimpleNamespace(url=f"http://127.0.0.1:{server.server_port}/v1", model="m", headers=lambda: {})
        ids, texts = greedy(srv, ["a", "b", "c"], 16)
        assert ids == [[0, 10], [1, 11], [2, 12]] and texts == ["t0", "t1", "t2"]
        assert len(bodies) == 1 and bodies[0]["prompt"] == ["a", "b", "c"] and bodies[0]["temperature"] == 0.0
        with pytest.raises(ValueError, match="2 completions for 3 prompts"):
            greedy(srv, ["a", "b", "c"], 1)
    finally:
        server.shutdown()
        server.server_close()
