"""This host's GPU facts (perf.host.HostFacts: model, count, memory) from a recorded nvidia-smi answer, and the
Target that resolve() and `infertool init` make of them by one rule (resolve.target_for). No GPU needed: a fake
nvidia-smi on PATH answers as the real one does."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from infertool.perf import host
from infertool.recipe import validate_recipe_data
from infertool.resolve import resolve, target_for
from tests.fakes import layout_model

# `nvidia-smi --query-gpu=name,memory.total --format=csv,noheader,nounits` on a 2 x H100 SXM host (MiB)
TWO_H100 = "NVIDIA H100 80GB HBM3, 81559\nNVIDIA H100 80GB HBM3, 81559\n"
MIB = 2**20


def fake_nvidia_smi(tmp_path: Path, monkeypatch, answer: str, *, free: str = "79000", rc: int = 0) -> Path:
    """An nvidia-smi on PATH that gives ``answer`` to the inventory query and ``free`` to the free-memory one
    (exit ``rc``), and logs every call; INFERTOOL_ACCELERATOR=cuda. Returns the log."""
    bin_dir = tmp_path / "smi-bin"
    bin_dir.mkdir(parents=True)
    (bin_dir / "answer").write_text(answer)
    log = tmp_path / "smi.log"
    script = bin_dir / "nvidia-smi"
    script.write_text(f"""#!/bin/sh
echo "$*" >> '{log}'
case "$1" in
  --query-gpu=name,memory.total) cat '{bin_dir / "answer"}' ;;
  --query-gpu=memory.free) echo '{free}' ;;
  *) echo "unexpected arguments: $*" >&2; exit 2 ;;
esac
exit {rc}
""")
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    monkeypatch.setenv("INFERTOOL_ACCELERATOR", "cuda")
    return log


@pytest.fixture(autouse=True)
def _isolated(tmp_path, monkeypatch):
    monkeypatch.setenv("INFERTOOL_CPU_FLAGS", "avx2 avx512f avx512bw")
    monkeypatch.setenv("INFERTOOL_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf"))


def test_gpu_facts_come_from_nvidia_smi_once(tmp_path, monkeypatch):
    log = fake_nvidia_smi(tmp_path, monkeypatch, TWO_H100)
    facts = host.host_facts()
    assert (facts.accelerator, facts.gpu_name, facts.gpu_count) == ("cuda", "NVIDIA H100 80GB HBM3", 2)
    assert facts.gpu_memory_bytes == 81559 * MIB == 85_520_809_984
    assert facts.to_dict()["gpu_name"] == "NVIDIA H100 80GB HBM3"  # recorded with the resolution, manifests
    assert host.host_facts() == facts and host.gpu_inventory().names == ("NVIDIA H100 80GB HBM3",) * 2
    assert log.read_text().splitlines() == ["--query-gpu=name,memory.total --format=csv,noheader,nounits"]  # once
    assert host.gpu_free_memory_bytes() == 79000 * MIB  # free memory changes: asked each time


def test_no_gpu_facts_when_infertool_runs_on_the_cpu(tmp_path, monkeypatch):
    log = fake_nvidia_smi(tmp_path, monkeypatch, TWO_H100)
    monkeypatch.setenv("INFERTOOL_ACCELERATOR", "cpu")
    facts = host.host_facts()
    assert (facts.accelerator, facts.gpu_name, facts.gpu_count, facts.gpu_memory_bytes) == ("cpu", None, 0, None)
    assert host.gpu_free_memory_bytes() is None and not log.exists()  # never asked


def test_unknown_memory_and_a_failing_nvidia_smi(tmp_path, monkeypatch):
    fake_nvidia_smi(tmp_path, monkeypatch, "NVIDIA L4, [N/A]\n", free="[N/A]")
    facts = host.host_facts()
    assert (facts.gpu_name, facts.gpu_count, facts.gpu_memory_bytes) == ("NVIDIA L4", 1, None)
    assert host.gpu_free_memory_bytes() is None
    broken = tmp_path / "broken"
    broken.mkdir()
    fake_nvidia_smi(broken, monkeypatch, "NVIDIA-SMI has failed because it couldn't communicate with the driver\n",
                    rc=9)
    facts = host.host_facts()
    assert (facts.accelerator, facts.gpu_name, facts.gpu_count) == ("cuda", None, 0)


def _recipe(model: Path, **sections) -> object:
    return validate_recipe_data({"name": "t", "model": {"source": str(model)}, **sections}, "test")


def test_resolve_plans_for_this_hosts_gpu(tmp_path, monkeypatch):
    """Without target.gpu, a GPU host's resolution is for its own GPU (the table's entry for the model
    nvidia-smi names), so `infertool plan` needs no --gpu there."""
    from infertool.plan import plan as make_plan

    model = layout_model(tmp_path / "m", "llama-3.1-8b", shards=1)
    fake_nvidia_smi(tmp_path, monkeypatch, TWO_H100)
    res = resolve(_recipe(model, serve={"tensor_parallel_size": 2, "max_model_len": 8192}))
    assert res.target.to_dict() == {"kind": "gpu", "gpu": "H100-SXM", "count": 2, "this_host": True,
                                    "source": "this host"}
    assert res.to_dict()["host"]["gpu_count"] == 2
    plan = make_plan(res)
    assert (plan.device.name, plan.device.count) == ("NVIDIA H100 SXM5 80GB", 2)
    # target.gpu still wins: plans describe the recipe's GPU on any host
    other = resolve(_recipe(model, target={"gpu": "L4"}))
    assert (other.target.gpu, other.target.source, other.target.this_host) == ("L4", "target.gpu", True)


def test_a_gpu_the_table_lacks_is_said_not_guessed(tmp_path, monkeypatch):
    from infertool.errors import UsageError
    from infertool.init import init_target
    from infertool.plan import plan as make_plan

    model = layout_model(tmp_path / "m", "llama-3.1-8b", shards=1)
    fake_nvidia_smi(tmp_path, monkeypatch, "Tesla V100-SXM2-16GB, 16160\n")
    res = resolve(_recipe(model))
    assert (res.target.kind, res.target.gpu, res.host.gpu_name) == ("gpu", None, "Tesla V100-SXM2-16GB")
    with pytest.raises(UsageError, match="needs to know which"):
        make_plan(res)
    with pytest.raises(UsageError, match="'Tesla V100-SXM2-16GB' is not in infertool's GPU table"):
        init_target()


@pytest.mark.parametrize("where", ["2 x H100 here", "--gpu L4", "this CPU"])
def test_init_and_resolve_make_the_same_target(where, tmp_path, monkeypatch):
    """init's Target for a tensor-parallel degree is the one resolve() makes of the recipe init writes."""
    from infertool.init import init_target

    model = layout_model(tmp_path / "m", "llama-3.1-8b", shards=1)
    gpu = "L4" if where == "--gpu L4" else None
    if where == "this CPU":
        monkeypatch.setenv("INFERTOOL_ACCELERATOR", "cpu")
        t, sections, tp = init_target(), {}, 1
    else:
        fake_nvidia_smi(tmp_path, monkeypatch, TWO_H100)
        t, tp = init_target(gpu=gpu), 2
        sections = {"target": {"gpu": gpu}} if gpu else {}
        sections["serve"] = {"tensor_parallel_size": tp}
    resolved = resolve(_recipe(model, **sections)).target
    mine = t.resolve_target(tp)
    assert (mine.kind, mine.gpu, mine.count, mine.this_host) == (resolved.kind, resolved.gpu, resolved.count,
                                                                 resolved.this_host)
    # where the choice came from: init's flag, the recipe's section it writes
    assert (mine.source, resolved.source) == (("--gpu", "target.gpu") if gpu else ("this host", "this host"))
    assert mine == target_for(t.host, gpu=t.target.gpu, cpu=t.kind == "cpu", count=tp, source=t.source)
    if where == "2 x H100 here":
        assert (t.gpu.key, t.max_gpus, mine.gpu) == ("H100-SXM", 2, "H100-SXM")


def test_only_resolve_constructs_a_target():
    """infertool.resolve.Target is made by resolve.target_for alone (init asks it; nothing patches one)."""
    pkg = Path(__file__).resolve().parents[1] / "infertool"
    bad = []
    for path in pkg.rglob("*.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        imported = {a.asname or a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)
                    and n.module in ("infertool.resolve", "infertool.resolve.refs") for a in n.names}
        if path == pkg / "resolve" / "refs.py":  # where Target is defined and made
            imported = {"Target"}
            maker = next(f for f in tree.body if isinstance(f, ast.FunctionDef) and f.name == "target_for")
            allowed = {getattr(n, "lineno", 0) for n in ast.walk(maker)}
        else:
            allowed = set()
        for n in ast.walk(tree):
            if (isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "Target"
                    and "Target" in imported and n.lineno not in allowed):
                bad.append(f"{path.relative_to(pkg.parent)}:{n.lineno}")
    assert not bad, bad
