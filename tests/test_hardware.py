"""The GPU table (issue 23, deliverable 4): the parts, their labels and figures; aliases that resolve, ambiguous
ones refused with the choices (by find_gpu, --gpu and the recipe); a custom GPU spec wherever a table GPU goes."""

from __future__ import annotations

import json

import pytest

from infertool.errors import UsageError
from infertool.perf import hardware
from tests.conftest import cli_in_process

# Fixed by the brief: the Kubernetes manifests select nodes on these nvidia.com/gpu.product values.
PRODUCT_LABELS = {
    "H100-SXM": "NVIDIA-H100-80GB-HBM3", "H100-PCIe": "NVIDIA-H100-PCIe", "H100-NVL": "NVIDIA-H100-NVL",
    "H200-SXM": "NVIDIA-H200", "H200-NVL": "NVIDIA-H200-NVL", "A100-80GB-SXM": "NVIDIA-A100-SXM4-80GB",
    "A100-40GB-SXM": "NVIDIA-A100-SXM4-40GB", "A100-80GB-PCIe": "NVIDIA-A100-80GB-PCIe",
    "A100-40GB-PCIe": "NVIDIA-A100-PCIE-40GB", "L4": "NVIDIA-L4", "L40S": "NVIDIA-L40S", "L40": "NVIDIA-L40",
    "A10G": "NVIDIA-A10G", "B200": "NVIDIA-B200", "RTX4090": "NVIDIA-GeForce-RTX-4090", "MI300X": None,
    "RTX-A6000": "NVIDIA-RTX-A6000",
}


def test_the_table_has_every_part_with_its_figures():
    assert set(hardware.GPUS) == set(PRODUCT_LABELS)
    for key, g in hardware.GPUS.items():
        assert g.key == key and g.product_label == PRODUCT_LABELS[key]
        assert g.memory_gib > 10 and g.bandwidth_tbs > 0.1 and g.bf16_tflops > 10 and g.int8_tops > g.bf16_tflops
        assert g.link in hardware.LINKS and g.source and any(str(y) in g.source for y in range(2020, 2026))
        assert g.generation in ("ampere", "ada", "hopper", "blackwell", "cdna3")
        assert g.fp8 == (g.fp8_tflops is not None) == (g.generation != "ampere")  # A10G / A100: no FP8 tensor cores
        assert g.price_per_hour > 0 and "ASSUMPTION" in g.price_source and "not a quote" in g.price_source
        assert g.vendor == ("amd" if key == "MI300X" else "nvidia")
    h100, a100 = hardware.GPUS["H100-SXM"], hardware.GPUS["A100-40GB-PCIe"]
    assert (h100.bf16_tflops, h100.fp8_tflops, h100.bandwidth_tbs, h100.link) == (989, 1979, 3.35, "nvlink4")
    assert (a100.fp8_tflops, a100.memory_gib, a100.bandwidth_tbs) == (None, 40.0, 1.555)
    assert hardware.GPUS["B200"].link == "nvlink5" and hardware.GPUS["MI300X"].link == "infinity_fabric"
    assert hardware.GPUS["H100-SXM"].to_dict()["fp8"] is True


@pytest.mark.parametrize("name, key", [
    ("h100 sxm", "H100-SXM"), ("A100-SXM4-80GB", "A100-80GB-SXM"), ("a100-40gb-pcie", "A100-40GB-PCIe"),
    # nvidia-smi's names
    ("NVIDIA H100 80GB HBM3", "H100-SXM"), ("NVIDIA H100 PCIe", "H100-PCIe"), ("NVIDIA H100 NVL", "H100-NVL"),
    ("NVIDIA H200", "H200-SXM"), ("NVIDIA H200 NVL", "H200-NVL"), ("NVIDIA A100-SXM4-40GB", "A100-40GB-SXM"),
    ("NVIDIA A100 80GB PCIe", "A100-80GB-PCIe"), ("NVIDIA A100-PCIE-40GB", "A100-40GB-PCIe"), ("NVIDIA L4", "L4"),
    ("NVIDIA L40", "L40"), ("NVIDIA L40S", "L40S"), ("NVIDIA A10G", "A10G"), ("NVIDIA B200", "B200"),
    ("NVIDIA GeForce RTX 4090", "RTX4090"), ("AMD Instinct MI300X", "MI300X"),
])
def test_an_unambiguous_name_resolves(name, key):
    assert hardware.find_gpu(name).key == key
    assert hardware.match_device_name(name).key == key


def test_every_product_label_names_its_part():
    for g in hardware.GPUS.values():
        if g.product_label:
            assert hardware.find_gpu(g.product_label) is g


@pytest.mark.parametrize("name, choices", [
    ("A100", ["A100-40GB-PCIe", "A100-40GB-SXM", "A100-80GB-PCIe", "A100-80GB-SXM"]),
    ("H100", ["H100-PCIe", "H100-SXM", "H100-NVL"]), ("h200", ["H200-SXM", "H200-NVL"]),
    ("A100 80GB", ["A100-80GB-PCIe", "A100-80GB-SXM"]),
])
def test_an_ambiguous_name_is_refused_with_the_choices(name, choices):
    with pytest.raises(UsageError) as e:
        hardware.find_gpu(name)
    assert f"ambiguous GPU {name!r}: it may be {', '.join(choices)}" == e.value.message
    assert hardware.match_device_name("NVIDIA A100") is None  # a driver name that does not say which: not guessed


def test_ambiguous_gpu_on_the_command_line_and_in_the_recipe(tmp_path):
    r = cli_in_process("plan", "llama3.1-8b-w4a16-h100", "--gpu", "H100")
    assert r.returncode == 2 and "ambiguous GPU 'H100': it may be H100-PCIe, H100-SXM, H100-NVL" in r.stderr
    assert "Traceback" not in r.stderr
    r = cli_in_process("validate", "llama3.1-8b-w4a16-h100", "--set", "target.gpu=A100")
    assert r.returncode == 2 and "target.gpu" in r.stderr
    assert "A100-40GB-PCIe, A100-40GB-SXM, A100-80GB-PCIe, A100-80GB-SXM" in r.stderr


CUSTOM = """name: custom-gpu
model: {source: /models/Llama-3.1-8B-Instruct}
target:
  gpu: {name: Accel-64G, memory_gib: 64, bandwidth_tbs: 2.0, bf16_tflops: 400, fp8_tflops: 800, link: pcie5%s}
serve: {max_model_len: 8192}
"""


def test_a_custom_gpu_goes_wherever_a_table_gpu_goes(tmp_path):
    path = tmp_path / "custom.yaml"
    path.write_text(CUSTOM % "")
    r = cli_in_process("plan", str(path), "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert (doc["device"]["name"], doc["device"]["memory_gib"], doc["device"]["custom"]) == ("Accel-64G", 64.0, True)
    assert doc["device"]["bandwidth_tbs"] == 2.0 and doc["tensor_parallel"]["link"]["name"] == "PCIe Gen5 x16"
    target = doc["resolution"]["target"]
    assert (target["gpu"], target["device"]["generation"], target["device"]["product_label"]) == ("Accel-64G", "custom", None)
    r = cli_in_process("serve", str(path), "--dry-run")
    assert r.returncode == 0 and "1 x Accel-64G" in r.stderr + r.stdout
    r = cli_in_process("serve", str(path), "--emit", "k8s")
    assert r.returncode == 0 and "kind: Deployment" in r.stdout and "Target: 1 x Accel-64G" in r.stdout


@pytest.mark.parametrize("extra, path, words", [
    (", memory_gib: 9000", "target.gpu.memory_gib", "less than or equal to 4096"),
    (", link: nvlink9", "target.gpu.link", "'pcie4'"),
    (", price_per_hour: -1", "target.gpu.price_per_hour", "greater than or equal to 0"),
    (", cores: 3", "target.gpu.cores", ""),
])
def test_a_custom_gpu_is_checked_field_by_field(tmp_path, extra, path, words):
    text = (CUSTOM % "").replace(", link: pcie5", extra) if "link" in extra or "memory" in extra else CUSTOM % extra
    if "memory" in extra:
        text = text.replace("memory_gib: 64, ", "")
    (tmp_path / "r.yaml").write_text(text)
    r = cli_in_process("validate", str(tmp_path / "r.yaml"))
    assert r.returncode == 2 and path in r.stderr and words in r.stderr and "Traceback" not in r.stderr
    with pytest.raises(UsageError, match="out of range"):
        hardware.custom_gpu("x", 64, 2.0, float("nan"))
