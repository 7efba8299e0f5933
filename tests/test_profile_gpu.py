"""`gpu`-marked: the real NVML sampler, the hf profile engine and --nsys on a CUDA host (skipped elsewhere).

Run them with `scripts/gpu-check.sh` on a GPU machine; with INFERTOOL_RECORD_DIR set they also write what they
read (NVML samples, profile.json, the `nsys stats` CSVs) there, to be kept as fixtures under
tests/fixtures/recorded/ (test_profile.py replays every recording found there).

They need torch with CUDA and nvidia-ml-py; they run in-process (INFERTOOL_IN_PROCESS=1) on a model made here
from a config with random weights (timing does not depend on the values), so no model has to travel.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu


def _record(name: str, data) -> None:
    where = os.environ.get("INFERTOOL_RECORD_DIR")
    if not where:
        return
    path = Path(where) / name
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(data, (str, bytes)):
        path.write_text(data if isinstance(data, str) else data.decode())
    else:
        path.write_text(json.dumps(data, indent=1, default=str))


@pytest.fixture(scope="module")
def gpu_model(tmp_path_factory) -> Path:
    """A ~0.5B-parameter Llama (random weights, bf16): big enough that batch-1 decode reads weights for longer
    than the kernels take to launch on a fast GPU."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    if not torch.cuda.is_available():
        pytest.skip("torch sees no CUDA device")
    d = tmp_path_factory.mktemp("gpu-model")
    cfg = transformers.LlamaConfig(hidden_size=2048, intermediate_size=5632, num_hidden_layers=8, num_attention_heads=16,
                                   num_key_value_heads=8, vocab_size=32000, max_position_embeddings=4096,
                                   tie_word_embeddings=False)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(cfg).to(torch.bfloat16)
    model.save_pretrained(d)
    return d


def _recipe(model: Path, **profile):
    from infertool.recipe import validate_recipe_data

    prof = {"batch": [1, 64], "prompt_len": [512, 2048], "decode_len": 16, "repeats": 3}
    prof.update(profile)
    return validate_recipe_data({"name": "gpu", "model": {"source": str(model), "dtype": "bfloat16"}, "profile": prof})


def _profile(recipe, out_dir: Path, **options):
    """The profile capability on the recipe's model: plan, then run into ``out_dir``."""
    from infertool import profile
    from infertool.capability import RunContext
    from infertool.resolve import resolve

    return profile.run(profile.plan(resolve(recipe), profile.ProfileOptions(**options)), RunContext(out_dir=out_dir))


def test_nvml_sampler_reads_this_gpu():
    import torch

    from infertool.profile import nvml

    s = nvml.NvmlSampler(interval_s=0.05).start()
    assert s.available, s.reason
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    for _ in range(200):
        a = (a @ a).clamp_(-1, 1)
    torch.cuda.synchronize()
    samples = [x.to_dict() for x in s._samples]
    out = s.stop()
    _record("nvml_samples.json", {"device": out.device, "samples": samples, "gpm": out.gpm.to_dict()})
    assert out.samples >= 3 and out.power_w.max > 50 and out.memory_used_bytes.max > 2**30
    assert out.sm_clock_mhz.max > 500
    if torch.cuda.get_device_capability()[0] >= 9:  # GPM: Hopper and newer
        assert out.gpm.available, out.gpm
        assert 0 <= out.gpm.sm_util_pct <= 100


def test_profile_hf_engine_on_this_gpu(gpu_model, tmp_path):
    res = _profile(_recipe(gpu_model), tmp_path / "out", engine="hf", remeasure=True)
    d = res.to_dict()
    _record("profile_hf.json", d)
    assert res.peaks.device == "cuda" and res.peaks.bandwidth > 5e11 and res.peaks.flops > 5e13
    by = {(p["phase"], p["batch"], p["tokens"]): p for p in d["points"]}
    prefill = by[("prefill", 1, 2048)]
    assert prefill["verdict"] == "compute-bound", prefill
    decode1 = next(p for p in d["points"] if p["phase"] == "decode" and p["batch"] == 1)
    # eager transformers decode at batch 1 may be launch-bound on a fast GPU; it is never compute-bound
    assert decode1["verdict"] in ("memory-bound", "overhead-bound") and decode1["mbu"] > decode1["mfu"], decode1
    assert res.nvml.available and res.nvml.power_w.max > 50
    assert (tmp_path / "out" / "roofline.png").stat().st_size > 10_000


@pytest.mark.skipif(shutil.which("nsys") is None, reason="Nsight Systems (nsys) is not on PATH")
def test_nsys_classifies_the_measured_kernels(gpu_model, tmp_path):
    res = _profile(_recipe(gpu_model, batch=[1, 16], prompt_len=[1024], decode_len=8, repeats=1), tmp_path / "out",
                   engine="hf", nsys=True)
    ns = res.nsys
    assert ns is not None
    for name, path in ns.csv.items():
        _record(f"nsys_{name}.csv", Path(path).read_text())
    assert ns.kernel_time_ns > 0 and ns.class_share.get("gemm", 0) > 0.3, ns.class_share
    assert 0 < ns.kernel_busy_fraction <= 1.05
    assert {"prefill 1024", "decode b1", "decode b16"} <= set(ns.ranges)
