"""LoRA adapters from the recipe (serve.lora): the record, vLLM's argv, the preflight, plan sizing, the
per-adapter phase. Fast: real files, no server (the real one is in test_lora_real.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from infertool.errors import UsageError
from infertool.recipe import ServeSection
from infertool.serve.command import build_launch


def _lora_serve(**lora) -> ServeSection:
    return ServeSection.model_validate({"served_model_name": "base", "lora": lora})


def test_lora_argv_names_every_adapter_with_absolute_paths(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    s = _lora_serve(adapters={"ad1": "adapters/one", "ad2": str(tmp_path / "two")}, max_lora_rank=32, max_loras=2,
                    max_cpu_loras=4)
    a = build_launch(s, "/models/x", "/py").argv
    i = a.index("--lora-modules")
    assert "--enable-lora" in a
    assert a[i + 1:i + 3] == [f"ad1={tmp_path / 'adapters/one'}", f"ad2={tmp_path / 'two'}"]  # recipe order kept
    assert a[a.index("--max-lora-rank") + 1] == "32"
    assert a[a.index("--max-loras") + 1] == "2"
    assert a[a.index("--max-cpu-loras") + 1] == "4"
    no_cpu = build_launch(_lora_serve(adapters={"a": "/x"}), "/models/x", "/py").argv
    assert "--max-cpu-loras" not in no_cpu and no_cpu[no_cpu.index("--max-lora-rank") + 1] == "16"
    assert "--enable-lora" not in build_launch(ServeSection(), "/models/x", "/py").argv


def test_lora_adapter_named_like_the_default_served_name_is_refused():
    s = ServeSection.model_validate({"lora": {"adapters": {"x": "/a"}}})
    with pytest.raises(UsageError, match="also the served model's name"):
        build_launch(s, "/models/x", "/py")


@pytest.mark.parametrize("lora, where, says", [
    ({"adapters": {}}, "lora.adapters", "at least 1"),
    ({"adapters": {"a": "/x"}, "max_lora_rank": 12}, "lora.max_lora_rank", "one of vLLM's choices"),
    ({"adapters": {"a": "/x"}, "max_loras": 3, "max_cpu_loras": 2}, "lora.max_cpu_loras", "at least max_loras"),
    ({"adapters": {"-bad": "/x"}}, "lora.adapters", "letters, digits"),
    ({"adapters": {"a": "/x"}, "rank": 8}, "lora.rank", "Extra inputs"),
])
def test_lora_recipe_refuses_bad_fields(lora, where, says):
    with pytest.raises(ValidationError) as e:
        ServeSection.model_validate({"lora": lora})
    text = str(e.value)
    assert where.split(".")[-1] in text and says in text


def test_lora_adapter_named_like_served_model_name_is_refused():
    with pytest.raises(ValidationError, match="is serve.served_model_name"):
        ServeSection.model_validate({"served_model_name": "a", "lora": {"adapters": {"a": "/x"}}})


# ------------------------------------------------------------------------------------------- preflight
def _model(tmp_path: Path, layers: int = 2, hidden: int = 64) -> Path:
    """A model folder with a Llama config (64 hidden, 4 heads of 16, 2 KV heads, 128 intermediate) and one
    tensor: what the preflight reads (config.json and the safetensors header)."""
    import json
    import struct

    d = tmp_path / f"model-{layers}-{hidden}"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "num_hidden_layers": layers,
        "hidden_size": hidden, "intermediate_size": 2 * hidden, "num_attention_heads": 4, "num_key_value_heads": 2,
        "head_dim": hidden // 4, "vocab_size": 100, "max_position_embeddings": 256, "torch_dtype": "bfloat16"}))
    head = json.dumps({"model.norm.weight": {"dtype": "F32", "shape": [hidden], "data_offsets": [0, 4 * hidden]}})
    head += " " * (-len(head) % 8)
    (d / "model.safetensors").write_bytes(struct.pack("<Q", len(head)) + head.encode() + bytes(4 * hidden))
    return d


def _info(model: Path):
    from infertool.models.info import model_info

    return model_info(model)


def _preflight_error(tmp_path, adapters: dict, model: Path, max_lora_rank: int = 16) -> str:
    from infertool.recipe import LoraSpec
    from infertool.serve.adapters import preflight

    with pytest.raises(UsageError) as e:
        preflight(LoraSpec(adapters=adapters, max_lora_rank=max_lora_rank), _info(model))
    assert e.value.exit_code == 2
    return e.value.message


def test_made_adapter_passes_the_preflight_with_its_facts(tmp_path):
    from infertool.recipe import LoraSpec
    from infertool.serve.adapters import preflight
    from infertool.serve.lora_maker import make_adapter

    model = _model(tmp_path)
    make_adapter(model, tmp_path / "a", rank=8, targets=("q_proj", "k_proj", "down_proj"))
    [facts] = preflight(LoraSpec(adapters={"a": str(tmp_path / "a")}), _info(model))
    # q: 8x64 + 64x8, k: 8x64 + 32x8, down: 8x128 + 64x8 floats per layer, 2 layers, 4 bytes
    assert (facts.rank, facts.layers, facts.tensors) == (8, 2, 12)
    assert facts.bytes == 2 * 4 * (8 * 64 + 64 * 8 + 8 * 64 + 32 * 8 + 8 * 128 + 64 * 8)
    assert facts.target_modules == ["q_proj", "k_proj", "down_proj"] and facts.dtype == "F32"


def test_preflight_rank_above_the_maximum_says_what_to_raise_it_to(tmp_path):
    from infertool.serve.lora_maker import make_adapter

    model = _model(tmp_path)
    make_adapter(model, tmp_path / "big", rank=64)
    msg = _preflight_error(tmp_path, {"big": str(tmp_path / "big")}, model)
    assert "adapter 'big'" in msg and "rank 64; serve.lora.max_lora_rank is 16: raise it to 64" in msg


def test_preflight_adapter_of_another_base_names_each_tensor_and_both_shapes(tmp_path):
    from infertool.serve.lora_maker import make_adapter

    other = _model(tmp_path, layers=3, hidden=96)  # another base: wider, one more layer
    make_adapter(other, tmp_path / "other", rank=8)
    msg = _preflight_error(tmp_path, {"other": str(tmp_path / "other")}, _model(tmp_path))
    assert ("tensor base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight: shape [8, 96], the model's "
            "q_proj needs [8, 64]") in msg
    assert "v_proj.lora_B.weight: shape [48, 8], the model's v_proj needs [32, 8]" in msg
    assert "... and 2 more tensors that do not fit (8 of 12)" in msg and "4 of 12 tensors are for layer 2" in msg
    deeper = _model(tmp_path, layers=3)  # the same shapes, one more layer
    make_adapter(deeper, tmp_path / "deeper", rank=8)
    msg = _preflight_error(tmp_path, {"deeper": str(tmp_path / "deeper")}, tmp_path / "model-2-64")
    assert "4 of 12 tensors are for layer 2, but the model has 2 layers (0-1)" in msg
    assert "layers.1." not in msg and msg.startswith("1 problem(s)")


def test_preflight_lists_every_problem_of_every_adapter(tmp_path):
    import json

    from infertool.serve.lora_maker import make_adapter

    model = _model(tmp_path)
    (tmp_path / "empty").mkdir()
    make_adapter(model, tmp_path / "ia3")
    cfg = json.loads((tmp_path / "ia3" / "adapter_config.json").read_text())
    (tmp_path / "ia3" / "adapter_config.json").write_text(json.dumps({**cfg, "peft_type": "IA3"}))
    msg = _preflight_error(tmp_path, {"gone": str(tmp_path / "nowhere"), "empty": str(tmp_path / "empty"),
                                      "ia3": str(tmp_path / "ia3")}, model)
    assert "adapter 'gone'" in msg and "does not exist" in msg
    assert "serve.lora.adapters.empty" in msg and "adapter_config.json is missing" in msg
    assert "adapter_model.safetensors is missing" in msg
    assert "peft_type 'IA3': vLLM serves LoRA adapters" in msg
    assert msg.startswith("4 problem(s)")


def test_preflight_refuses_modules_vllm_does_not_serve_lora_on(tmp_path):
    import json
    import struct

    model = _model(tmp_path)
    d = tmp_path / "norm"
    d.mkdir()
    (d / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": 4, "target_modules": ["lm_head"]}))
    names = ["base_model.model.lm_head.lora_A.weight", "base_model.model.model.layers.0.mlp.act_fn.lora_A.weight"]
    head = json.dumps({n: {"dtype": "F32", "shape": [4, 64], "data_offsets": [i * 1024, (i + 1) * 1024]}
                       for i, n in enumerate(names)})
    (d / "adapter_model.safetensors").write_bytes(struct.pack("<Q", len(head)) + head.encode() + bytes(2048))
    msg = _preflight_error(tmp_path, {"norm": str(d)}, model)
    assert "lm_head.lora_A.weight: not a LoRA weight of a decoder layer's projection" in msg
    assert "module act_fn is not one vLLM serves LoRA on" in msg


def test_launch_refuses_a_bad_adapter_before_any_server_and_the_dry_run_lists_it(tmp_path, monkeypatch):
    """`serve --dry-run` shows the problem as a lint error; the launch itself (prepare) raises exit 2."""
    import yaml

    from infertool.serve.lora_maker import make_adapter

    model = _model(tmp_path)
    make_adapter(model, tmp_path / "big", rank=32)
    recipe = tmp_path / "r.yaml"
    recipe.write_text(yaml.safe_dump({"name": "lora", "model": {"source": str(model)},
                                      "serve": {"lora": {"adapters": {"big": str(tmp_path / "big")}}}}))
    from conftest import run_cli

    r = run_cli("serve", str(recipe), "--dry-run", "--json")
    assert "rank 32; serve.lora.max_lora_rank is 16: raise it to 32" in r.stdout + r.stderr
    assert "--enable-lora" in r.stdout


# ------------------------------------------------------------------------------------------- plan
def test_plan_sizes_the_slots_by_hand(tmp_path):
    from infertool.perf.roofline import Arch
    from infertool.plan.adapters import plan_adapters, slot_bytes
    from infertool.recipe import LoraSpec
    from infertool.serve.lora_maker import make_adapter

    arch = Arch(layers=2, hidden=8, heads=2, kv_heads=1, head_dim=4, intermediate=16, vocab=32)
    # per layer (in + out): q 8+8, k 8+4, v 8+4, o 8+8, gate 8+16, up 8+16, down 16+8 = 128; x 2 layers x rank 16 x 2 B
    assert slot_bytes(arch, 16, 2) == 128 * 2 * 16 * 2 == 8192
    model = _model(tmp_path)
    make_adapter(model, tmp_path / "a", rank=4)  # q (4x64 + 64x4) and v (4x64 + 32x4), 2 layers, F32
    lora = LoraSpec(adapters={"a": str(tmp_path / "a"), "b": str(tmp_path / "none")}, max_loras=2, max_cpu_loras=3)
    p = plan_adapters(lora, arch, 2)
    assert p is not None and (p.slot_bytes, p.slots_bytes) == (8192, 16384)
    size = 2 * 4 * (4 * 64 + 64 * 4 + 4 * 64 + 32 * 4)
    assert p.adapters[0].bytes == size and p.adapters[0].rank == 4 and p.host_cache_bytes == 3 * size
    assert p.adapters[1].bytes is None and "does not exist" in (p.adapters[1].problem or "")
    assert any("2 x rank 16" in line and "estimate" in line for line in p.lines)
    assert plan_adapters(None, arch, 2) is None


def test_plan_shows_the_adapters(tmp_path):
    import json

    import yaml

    from conftest import run_cli
    from infertool.serve.lora_maker import make_adapter

    model = _model(tmp_path)
    make_adapter(model, tmp_path / "a", rank=8)
    recipe = tmp_path / "r.yaml"
    recipe.write_text(yaml.safe_dump({"name": "lora", "model": {"source": str(model)},
                                      "serve": {"lora": {"adapters": {"a": str(tmp_path / "a")}, "max_loras": 2}}}))
    r = run_cli("plan", str(recipe), "--json")
    block = json.loads(r.stdout)["adapters"]
    # 2 layers x (q 64+64, k 64+32, v 64+32, o 64+64, gate/up 64+128 each, down 128+64) x rank 16 x the served
    # dtype's bytes (bf16: 2; float32 on a CPU without bf16 instructions: 4)
    assert block["dtype_bytes"] in (2, 4)
    assert block["slot_bytes"] == 2 * (128 + 96 + 96 + 128 + 192 * 3) * 16 * block["dtype_bytes"]
    assert block["slots_bytes"] == 2 * block["slot_bytes"] and block["adapters"][0]["rank"] == 8


# ------------------------------------------------------------------------------------------- launch key
def test_launch_key_changes_with_the_adapters_content(tmp_path):
    from infertool.serve.lora_maker import make_adapter
    from infertool.serve.pool import launch_key

    model = _model(tmp_path)
    make_adapter(model, tmp_path / "a", seed=1)
    s = _lora_serve(adapters={"a": str(tmp_path / "a")})
    first = launch_key(build_launch(s, str(model), "/py"))
    assert launch_key(build_launch(s, str(model), "/py")) == first
    make_adapter(model, tmp_path / "a", seed=2)  # the same folder, other weights
    assert launch_key(build_launch(s, str(model), "/py")) != first


# ------------------------------------------------------------------------------------------- the phase
def _window(lp: list[float], top: list[dict[str, float]]) -> dict:
    return {"id": "w0000", "lp": lp, "top": top, "tokens": ["a", "b", "c"], "n_bytes": 2}


def _raw(top: list[dict[str, float]], outs: list[str]) -> dict:
    """collect's raw output for a suite of one perplexity task (one window of 2 scored tokens) and one generate task."""
    return {"tasks": {"ppl": {"type": "perplexity", "seq_len": 3, "corpus_tokens": 3,
                              "items": [_window([max(t.values()) for t in top], top)]},
                      "gen": {"type": "generate", "items": [{"id": f"g{i}", "out": o} for i, o in enumerate(outs)]}},
            "stats": {"tokens": 3, "gen_tokens": 0, "seconds": 1.0}}


def test_adapters_phase_pairs_each_adapter_and_finds_the_worst(tmp_path):
    """Recorded raws: adapter `same` answers alike on both servers, `drift` moves on the quantized one; the plain
    model on the reference differs from both adapters (their effect)."""
    import math

    from infertool.data.suites import Suite, SuiteTask
    from infertool.evaluate.adapters import AdaptersPhase, adapter_rows
    from infertool.evaluate.core import estimates, summarize
    from infertool.evaluate.result import Pooled

    suite = Suite("s", "", tmp_path, [SuiteTask("ppl", "perplexity", text="abc"),
                                      SuiteTask("gen", "generate", items=[{"id": "g0", "target": "yes"},
                                                                          {"id": "g1", "target": "no"}])])
    lp = math.log
    a = [{"x": lp(0.9), "y": lp(0.1)}, {"x": lp(0.6), "y": lp(0.4)}]
    b = [{"x": lp(0.5), "y": lp(0.5)}, {"x": lp(0.3), "y": lp(0.7)}]  # drifted: the second token's top-1 flips
    plain = [{"x": lp(0.2), "y": lp(0.8)}, {"x": lp(0.6), "y": lp(0.4)}]
    phase = AdaptersPhase(["same", "drift"], [], suite, summarize, k=2, workers=1)
    ref = {"adapters": {"same": _raw(a, ["yes", "no"]), "drift": _raw(a, ["yes", "no"])},
           "plain": _raw(plain, ["yes", "maybe"])}
    cand = {"adapters": {"same": _raw(a, ["yes", "no"]), "drift": _raw(b, ["yes", "oops"])}, "plain": None}
    block = phase.compare(ref, cand, confidence=0.95, first="candidate")
    same, drift = block.adapters
    assert same.kld == pytest.approx(0.0, abs=1e-12) and same.top1 == 1.0 and same.items.b == 0
    # KL(a || b) per token: 0.9 ln(0.9/0.5) + 0.1 ln(0.1/0.5); 0.6 ln(0.6/0.3) + 0.4 ln(0.4/0.7)
    want = (0.9 * lp(0.9 / 0.5) + 0.1 * lp(0.1 / 0.5) + 0.6 * lp(0.6 / 0.3) + 0.4 * lp(0.4 / 0.7)) / 2
    assert drift.kld == pytest.approx(want, rel=1e-9) and drift.top1 == 0.5
    assert (drift.items.n, drift.items.b, drift.items.c) == (2, 1, 0)  # "no" right on the original only
    assert block.worst == "drift" and block.first == "candidate"
    assert same.effect.changed == 0.5 and same.effect.items == 2 and same.effect.kld > 0.1
    pool = Pooled(adapters=block)
    est = estimates(Pooled.from_dict(pool.to_dict()), 0.95)["max_adapter_kld"]
    assert est.value == pytest.approx(want) and est.n == 2
    rows = adapter_rows(block)
    assert rows[1][0] == "drift (worst)" and rows[0][6] == "50% of 2"
