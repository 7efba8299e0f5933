"""Roofline math on hand-computed numbers (docs/reference/profiling.md)."""

from __future__ import annotations


import pytest

from infertool.models.known import KNOWN_ARCHS, match_known
from infertool.perf import hardware, roofline
from infertool.perf.roofline import Arch


def test_kv_bytes_per_token_reference_values():
    # Llama-2-70B: 80 layers, 8 KV heads, d 128, bf16 -> 320 KiB per token; 0.3125 GiB for 1,024 tokens
    assert roofline.kv_bytes_per_token(80, 8, 128, 2) == 327_680
    assert roofline.kv_bytes_per_token(80, 8, 128, 2) * 1024 / 2**30 == 0.3125
    # SmolLM2-135M: 30 layers, 3 KV heads, d 64, bf16
    assert roofline.kv_bytes_per_token(30, 3, 64, 2) == 23_040
    assert roofline.kv_bytes_per_token(30, 3, 64, 1) == 11_520  # fp8 halves it


def test_quantized_bytes_per_weight():
    assert roofline.quantized_bytes_per_weight(4, 128) == pytest.approx((4 + 16 / 128 + 4 / 128) / 8)
    assert roofline.quantized_bytes_per_weight(4, 64) == pytest.approx(0.5390625)
    assert roofline.quantized_bytes_per_weight(8, None) == 1.0


def test_parameter_counts_match_published_models():
    llama8b = KNOWN_ARCHS["llama-3.1-8b"][0]
    assert llama8b.total_params == 8_030_261_248  # the published count
    smol = KNOWN_ARCHS["smollm2-135m"][0]
    assert smol.total_params == 134_515_008  # = the stored parameters of the converted bundled model
    mixtral = KNOWN_ARCHS["mixtral-8x7b"][0]
    assert mixtral.total_params / 1e9 == pytest.approx(46.70, abs=0.01)
    assert mixtral.linear_params_active / 1e9 == pytest.approx(12.75, abs=0.01)  # 2 of 8 experts


def test_decode_and_prefill_on_a_toy_model():
    # 1 layer, hidden 2, 1 head of dim 2, 1 KV head, intermediate 2, vocab 4
    a = Arch(layers=1, hidden=2, heads=1, kv_heads=1, head_dim=2, intermediate=2, vocab=4)
    # attention q,k,v,o: 4 x (2x2) = 16; gated MLP 3 x 2 x 2 = 12; lm_head 4 x 2 = 8
    assert a.linear_params_active == 16 + 12 + 8
    kv = roofline.kv_bytes_per_token(1, 1, 2, 2)  # 2 * 1 * 1 * 2 * 2 = 8
    assert kv == 8
    d = roofline.decode_step(a, weight_bytes_read=100, batch=3, context=10, kv_tok=kv)
    # FLOPs: 2*36*3 + 4*1*1*2*30 = 216 + 240
    assert d.flops == 456
    assert d.kv_read_bytes == 8 * 30 and d.kv_write_bytes == 8 * 3
    # activations: 3*2*2*1*4 residual + 3*4*4 fp32 logits
    assert d.activation_bytes == 48 + 48
    assert d.bytes == 100 + 240 + 24 + 96
    p = roofline.prefill(a, weight_bytes=100, batch=2, prompt_len=5, kv_tok=kv)
    # 2*36*10 + 2*1*1*2*2*25
    assert p.flops == 720 + 200
    assert p.kv_write_bytes == 80


def test_ridge_bound_time_and_crossover():
    assert roofline.ridge(989e12, 3.35e12) == pytest.approx(295.2, abs=0.1)
    cost = roofline.PhaseCost(flops=2e12, bytes=1e9, weight_bytes=1e9, kv_read_bytes=0, kv_write_bytes=0, activation_bytes=0)
    assert roofline.bound_time(cost, 1e15, 1e12) == pytest.approx(2e-3)  # compute: 2 ms > memory 1 ms
    a = Arch(layers=1, hidden=2, heads=1, kv_heads=1, head_dim=2, intermediate=2, vocab=4)
    # no KV and no context: B = R*W / (2N) = 10 * 720 / 72 = 100
    assert roofline.decode_crossover_batch(a, 720, context=0, kv_tok=0, ridge_ai=10) == pytest.approx(100)
    # KV reads growing with context can keep decode memory-bound at any batch
    assert roofline.decode_crossover_batch(a, 720, context=1000, kv_tok=1000, ridge_ai=10) is None


def test_allreduce_and_experts():
    assert roofline.allreduce_step_seconds(4096, 32, 1, 2, tp=1, link_bw_bytes_s=450e9, latency_s=5e-6) == 0
    t = roofline.allreduce_step_seconds(4096, 32, 1, 2, tp=2, link_bw_bytes_s=450e9, latency_s=5e-6)
    assert t == pytest.approx(64 * (8192 / 450e9 + 5e-6))
    assert roofline.expected_experts_touched(8, 2, 1) == pytest.approx(2)
    assert roofline.expected_experts_touched(8, 2, 1000) == pytest.approx(8)
    assert 2 < roofline.expected_experts_touched(8, 2, 4) < 8


def test_gpu_table_and_aliases():
    assert hardware.find_gpu("H100 SXM").key == "H100-SXM"
    assert hardware.find_gpu("h100-sxm").bandwidth_tbs == 3.35
    assert hardware.find_gpu("L4").memory_gib == pytest.approx(22.49, abs=0.01)
    for gpu in hardware.GPUS.values():
        assert gpu.source and gpu.link in hardware.LINKS
    from infertool.errors import UsageError

    with pytest.raises(UsageError):
        hardware.find_gpu("V100-PCIE-7")
    with pytest.raises(UsageError, match="H100-PCIe, H100-SXM, H100-NVL"):  # ambiguous: refused with the choices
        hardware.find_gpu("H100")


@pytest.mark.parametrize("path, key", [
    ("/models/Llama-3.1-8B-Instruct", "llama-3.1-8b"),
    ("/models/Llama-3.3-70B-Instruct-w4a16", "llama-3.3-70b"),
    ("Qwen2.5-7B-Instruct-AWQ", "qwen2.5-7b"),
    ("bundled:smollm2-135m", "smollm2-135m"),
    ("/models/something-else", None),
])
def test_known_architecture_matching(path, key):
    assert match_known(path) == key
