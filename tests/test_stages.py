"""The one Stage type and registry: graph order, refused registrations, the key computed from a stage's
declarations (it changes when, and only when, a declared section / input / host fact / dependency / format /
option changes), the graphs `run` and `tune` select from it, the stage cache, the typed summaries, and the
recipe's run.stages checked against the registry."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from infertool import stages
from infertool.data.fingerprint import digest
from infertool.errors import RecipeError, UsageError
from infertool.stages import Stage, StageContext, cached_stage, stage_key
from infertool.registry import Registry, RegistryError
from infertool.stages.registry import check_stage
from infertool.summaries import EvalStageSummary, ModelSummary, RunManifest, StageRecord, StageSummary


def body(ctx: StageContext) -> dict:
    return {}


# ------------------------------------------------------------------------------------------- registry
def test_registry_keeps_graph_order_and_refuses_a_second_name():
    reg: Registry[Stage] = Registry("stage", check=check_stage, name_of=lambda s: s.name)
    reg.register("a", Stage("a", body))
    reg.register("b", Stage("b", body, depends=("a",), graphs=("run", "tune")))
    reg.register("c", Stage("c", body, depends=("b",), graphs=("tune",)))
    assert reg.names() == ["a", "b", "c"] and [s.name for s in reg.values()] == ["a", "b", "c"]
    with pytest.raises(RegistryError, match="'a' is already registered"):
        reg.register("a", Stage("a", body))
    with pytest.raises(RegistryError, match="depends on 'z', not registered before it"):
        reg.register("d", Stage("d", body, depends=("z",)))
    with pytest.raises(RegistryError, match="listed as 'e' is named 'f'"):
        reg.register("e", Stage("f", body))
    assert reg.names() == ["a", "b", "c"]  # nothing half-registered
    with pytest.raises(UsageError) as e:
        reg.get("nope")
    assert e.value.hint == "known stages: a, b, c"


def test_the_built_in_stages_are_registered_once_in_graph_order():
    assert stages.names() == ["model", "quantize", "eval", "profile", "serve", "bench"]
    assert stages.names("tune") == ["quantize", "reference", "screen", "capacity", "served"]
    with pytest.raises(RegistryError, match="frozen"):
        stages.REGISTRY.register("eval", Stage("eval", body))  # nothing joins after start-up
    order = stages.REGISTRY.names()
    for name in order:  # every dependency is registered before the stage that needs it
        assert all(order.index(d) < order.index(name) for d in stages.get(name).depends)


# ------------------------------------------------------------------------------------------- keys
TOY = Stage("toy", body, sections=("quantize",), inputs=("calibration",), host=True, depends=("model",))
RECIPE = {"quantize": {"bits": 4}, "eval": {"max_items": 3}}
INPUTS = {"calibration": {"sha256": "c1"}, "suite": {"sha256": "s1"}}
HOST = {"accelerator": "cpu", "cpu_isa": "avx2", "cpu_bf16": False, "cpu_fp16": False, "cores": 8}
UP = {"model": "m1", "other": "o1"}


def toy_key(stage=TOY, recipe=RECIPE, inputs=INPUTS, host=HOST, up=UP, **kw) -> str:
    return stage_key(stage, recipe, up, inputs, host, **kw)


def test_the_key_is_the_hash_of_the_declared_values():
    host = {"accelerator": "cpu", "cpu_isa": "avx2", "cpu_bf16": False, "cpu_fp16": False}
    expected = digest({"stage": "toy", "v": 2, "sections": {"quantize": {"bits": 4}}, "upstream": {"model": "m1"},
                       "extra": {"calibration": {"sha256": "c1"}, "host": host}})
    assert toy_key() == expected


def test_the_key_changes_when_and_only_when_a_declaration_changes():
    k = toy_key()
    # what the stage does not declare: the same key
    assert toy_key(recipe={**RECIPE, "eval": {"max_items": 99}}) == k
    assert toy_key(inputs={**INPUTS, "suite": {"sha256": "s2"}}) == k
    assert toy_key(up={**UP, "other": "o2"}) == k
    assert toy_key(host={**HOST, "cores": 64}) == k
    assert toy_key(options=None) == k
    # what it declares: a new key each
    changed = [toy_key(recipe={**RECIPE, "quantize": {"bits": 8}}),
               toy_key(inputs={**INPUTS, "calibration": {"sha256": "c2"}}),
               toy_key(up={**UP, "model": "m2"}), toy_key(host={**HOST, "cpu_isa": "avx512"}),
               toy_key(stage=replace(TOY, format=2)), toy_key(parts={"trial": "t1"})]
    assert len({k, *changed}) == len(changed) + 1
    # host facts enter only the key of a stage that declares them
    plain = replace(TOY, host=False)
    assert toy_key(stage=plain, host={**HOST, "cpu_isa": "avx512"}) == toy_key(stage=plain)


def test_a_non_default_option_enters_the_key():
    from infertool.stages.builtin import QuantizeStageOptions

    q = stages.get("quantize")
    rd = {"quantize": {"bits": 4}}
    plain = q.key(rd, {"model": "m"}, INPUTS, HOST)
    assert q.key(rd, {"model": "m"}, INPUTS, HOST, options=QuantizeStageOptions()) == plain
    noverify = q.key(rd, {"model": "m"}, INPUTS, HOST, options=QuantizeStageOptions(verify=False))
    assert noverify != plain
    assert noverify == digest({"stage": "quantize", "v": 2, "sections": {"quantize": {"bits": 4}},
                               "upstream": {"model": "m"},
                               "extra": {"calibration": {"sha256": "c1"}, "options": {"verify": False}}})


def small_recipe(tmp_path, **sections):
    from tests.test_pipeline import recipe

    return recipe(tmp_path, **sections)


def test_run_keys_follow_the_declarations_through_the_graph(tmp_path):
    """A changed quantize section re-keys quantize and every stage downstream of it (eval, serve, bench), not
    model or profile; bench's key says what it measures."""
    q = {"method": "gptq", "group_size": 64}
    inputs = {"model": {"identity": "m"}, "calibration": {"sha256": "c"}, "suite": {"sha256": "s"}}

    def keys(**over):
        r = small_recipe(tmp_path, quantize=over.pop("quantize", q), eval={}, profile={}, serve={}, bench={})
        chosen = stages.select(r)
        assert [s.name for s in chosen] == stages.names()
        return stages.keys(r, chosen, inputs, HOST)

    a, b = keys(), keys(quantize={**q, "group_size": 32})
    assert {n for n in a if a[n] != b[n]} == {"quantize", "eval", "serve", "bench"}
    assert keys() == a  # stable
    # the keys run's entries have always had (a cache written before the registry is reused): by hand
    from infertool.recipe import recipe_to_dict

    r = small_recipe(tmp_path, quantize=q, eval={}, profile={}, serve={}, bench={})
    rd = recipe_to_dict(r)
    model = digest({"stage": "model", "v": 2, "sections": {"model": rd["model"]}, "upstream": {},
                    "extra": {"model": {"identity": "m"}}})
    quantize = digest({"stage": "quantize", "v": 2, "sections": {"quantize": rd["quantize"]}, "upstream": {"model": model},
                       "extra": {"calibration": {"sha256": "c"}}})
    assert (a["model"], a["quantize"]) == (model, quantize)
    # a dependency the recipe does not ask for is not in the key: eval without a quantize section
    plain = small_recipe(tmp_path, eval={})
    ev = stages.keys(plain, stages.select(plain), inputs, HOST)["eval"]
    prd = recipe_to_dict(plain)
    assert ev == digest({"stage": "eval", "v": 2, "sections": {s: prd[s] for s in ("eval", "serve", "target")},
                         "upstream": {"model": stages.keys(plain, stages.select(plain), inputs, HOST)["model"]},
                         "extra": {"suite": {"sha256": "s"}, "host": {k: HOST[k] for k in stages.HOST_FACTS}}})
    bench = stages.get("bench")
    r = small_recipe(tmp_path, quantize=q, bench={})
    assert bench.key_parts(r, None) == {"measures": ["candidate", "original"]}
    assert bench.key_parts(small_recipe(tmp_path, bench={}), None) == {"measures": ["served"]}


# ------------------------------------------------------------------------------------------- graphs
def test_selection_brings_dependencies_and_leaves_out_what_the_recipe_does_not_ask_for(tmp_path):
    r = small_recipe(tmp_path, eval={}, serve={})  # no quantize section
    assert [s.name for s in stages.select(r)] == ["model", "eval", "serve"]
    assert [s.name for s in stages.select(r, ["serve"])] == ["model", "serve"]  # eval not asked for here
    with pytest.raises(UsageError, match="unknown stage"):
        stages.select(r, ["screen"])  # a tune stage is not one of run's
    with pytest.raises(UsageError, match="unknown stage"):
        stages.select(r, ["nope"])


def test_tune_trial_graphs_come_from_the_same_registry(tmp_path):
    quantized = small_recipe(tmp_path, quantize={"method": "gptq", "group_size": 64})
    original = small_recipe(tmp_path)
    graph = lambda r, wanted: [s.name for s in stages.select(r, wanted, "tune", asked_only=True)]  # noqa: E731
    assert graph(quantized, ["screen", "capacity"]) == ["model", "quantize", "reference", "screen", "capacity"]
    assert graph(original, ["screen", "capacity"]) == ["capacity"]  # the original is not screened: it is the reference
    assert graph(original, ["served"]) == ["reference", "served"]
    assert stages.get("model").graphs == ("run",)  # a dependency of tune's quantize: in its key, not run by tune
    # device and server needs from the declarations: quantize on the device, every tune stage serves
    assert [n for n in stages.names("tune") if stages.get(n).uses_device(quantized)] == ["quantize"]
    assert [n for n in stages.names("tune") if stages.get(n).uses_servers(quantized)] == ["reference", "screen",
                                                                                          "capacity", "served"]


# ------------------------------------------------------------------------------------------- cache
def test_cache_returns_where_it_wrote_and_reads_back_typed(tmp_path):
    cache = tmp_path / "c"
    seen = []

    def fn(work: Path):
        seen.append(work)
        (work / "x.txt").write_text("x")
        return {"verdict": "FAIL", "reason": "mean KLD above 0.05"}

    st = cached_stage(cache, "eval", "k1", fn, summary_type=EvalStageSummary)
    assert st.status == "done" and st.work == seen[0] and not st.work.exists() and (st.entry / "x.txt").is_file()
    assert isinstance(st.summary, EvalStageSummary) and st.summary.verdict_failed
    again = cached_stage(cache, "eval", "k1", fn, summary_type=EvalStageSummary)
    assert again.status == "reused" and again.work is None and len(seen) == 1
    assert again.summary == st.summary
    written = json.loads((st.entry / "stage.json").read_text())
    assert set(written) == {"stage", "key", "summary", "seconds", "completed"}
    assert "servers" not in written["summary"]  # an optional field left out, as the plain dicts had it


def test_a_failed_stage_keeps_its_logs_and_the_error_points_to_them(tmp_path, monkeypatch):
    """The work directory of a failed stage is removed (nothing half-written), but its logs are kept under
    <cache>/failed/ (the vLLM log of an engine that crashed says why) and the error points there; the newest
    FAILED_KEPT are kept; a stage without logs leaves nothing."""
    from infertool.errors import BackendError
    from infertool.stages import cache as cache_mod

    cache = tmp_path / "c"

    def crash(work: Path):
        (work / "vllm.log").write_text("EngineCore failed: RuntimeError: no kernel for float32 W8A8\n")
        (work / "logs").mkdir()
        (work / "logs" / "lm_eval.log").write_text("lm-eval\n")
        (work / "model.safetensors").write_bytes(b"0" * 1024)  # not a log: not kept
        raise BackendError("http://127.0.0.1:1/v1/completions answered HTTP 500: EngineCore encountered an issue")

    with pytest.raises(BackendError) as err:
        cached_stage(cache, "screen", "k1", crash)
    (kept,) = (cache / "failed").iterdir()
    assert kept.name.startswith("screen-k1.") and err.value.log_path == str(kept / "vllm.log")
    assert "no kernel for float32" in (kept / "vllm.log").read_text() and (kept / "logs" / "lm_eval.log").is_file()
    assert not (kept / "model.safetensors").exists() and not list(cache.glob(".screen-k1.*.tmp"))

    def own_log(work: Path):
        (work / "vllm.log").write_text("x\n")
        raise BackendError("failed", log_path=str(work / "vllm.log"))

    monkeypatch.setattr(cache_mod, "FAILED_KEPT", 2)
    for _ in range(3):
        with pytest.raises(BackendError) as err:
            cached_stage(cache, "capacity", "k2", own_log)
        assert Path(err.value.log_path).is_file() and Path(err.value.log_path).parent.parent == cache / "failed"
    assert len(list((cache / "failed").iterdir())) == 2  # the newest two

    def no_log(work: Path):
        raise ValueError("boom")

    with pytest.raises(ValueError, match="boom"):
        cached_stage(tmp_path / "c2", "eval", "k3", no_log)
    assert not (tmp_path / "c2" / "failed").exists()

    def interrupted(work: Path):
        (work / "vllm.log").write_text("x\n")
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):  # a Ctrl-C is no failure: nothing is kept
        cached_stage(tmp_path / "c3", "eval", "k4", interrupted)
    assert sorted(p.name for p in (tmp_path / "c3").iterdir()) == []


# ------------------------------------------------------------------------------------------- records
def test_summaries_and_manifest_records_keep_the_file_layout():
    s = ModelSummary(path="/m", source="bundled:x", label="x", layers=2, weight_bytes=1000, hidden=64, kv_heads=2)
    assert list(s.to_dict()) == ["path", "source", "label", "layers", "weight_bytes", "hidden", "kv_heads"]
    s.servers = [{"key": "k", "reused": True}]
    assert list(s.to_dict())[-1] == "servers"  # appended last, as run's stages always wrote it
    # read back tolerantly: an unknown key kept aside, a malformed value "not measured"
    back = ModelSummary.from_dict({**s.to_dict(), "weight_bytes": "lots", "new_field": 1})
    assert back.weight_bytes is None and back.extra == {"new_field": 1} and back.to_dict()["new_field"] == 1
    rec = StageRecord(status="reused", key="k", dir="/e", seconds=1.5, completed="t", summary=s)
    assert rec.to_dict() == {"status": "reused", "key": "k", "dir": "/e", "seconds": 1.5, "completed": "t",
                             "summary": s.to_dict()}
    assert StageRecord().to_dict() == {"status": "pending"}
    m = RunManifest(recipe_name="r", stages={"model": rec})
    again = RunManifest.from_dict(json.loads(json.dumps(m.to_dict())))
    assert again.stages["model"].summary_as(ModelSummary).weight_bytes == 1000
    assert "servers" not in m.to_dict() and "resolution" not in m.to_dict()
    assert not StageSummary().verdict_failed and EvalStageSummary(verdict="INCONCLUSIVE").verdict_failed
    assert not EvalStageSummary(verdict="PASS").verdict_failed and not EvalStageSummary().verdict_failed


def test_a_stage_returning_a_plain_dict_reads_as_its_summary_type():
    st = stages.get("eval")
    got = st.summarize({"verdict": "PASS", "mine": 1})
    assert isinstance(got, EvalStageSummary) and got.verdict == "PASS" and got.extra == {"mine": 1}
    assert st.summarize(StageSummary(servers=[{"k": 1}])).servers == [{"k": 1}]


# ------------------------------------------------------------------------------------- run.stages
def _recipe_file(tmp_path, stages_list) -> Path:
    from tests.fakes import layout_model

    model = tmp_path / "m"
    if not model.exists():
        layout_model(model, "smollm2-135m", shards=1)
    p = tmp_path / "r.yaml"
    p.write_text(yaml.safe_dump({"name": "r", "model": {"source": str(model)}, "run": {"stages": stages_list}}))
    return p


def test_run_stages_are_checked_against_the_registry(tmp_path):
    from infertool.cli import app
    from infertool.recipe import load_recipe

    runner = CliRunner()
    bad = _recipe_file(tmp_path, ["model", "evl", "serve", "screen"])
    r = runner.invoke(app, ["validate", str(bad), "--json"])
    assert r.exit_code == 2, r.output  # as every recipe error
    err = json.loads(r.stdout)
    assert err["error"] == "RecipeError"
    assert [(i["path"], i["message"]) for i in err["issues"]] == [
        ("run.stages[1]", "unknown stage 'evl' (stages: model, quantize, eval, profile, serve, bench)"),
        ("run.stages[3]", "unknown stage 'screen' (stages: model, quantize, eval, profile, serve, bench)")]
    r = runner.invoke(app, ["run", str(bad), "--dry-run", "--out", str(tmp_path / "runs")])
    assert r.exit_code == 2 and "run.stages[1]: unknown stage 'evl'" in r.stderr
    with pytest.raises(RecipeError):  # the pipeline itself refuses it too (an API caller)
        from infertool.pipeline import plan_pipeline

        plan_pipeline(load_recipe(str(bad)), out_dir=tmp_path / "runs")
    good = _recipe_file(tmp_path, ["model", "serve"])
    r = runner.invoke(app, ["validate", str(good)])
    assert r.exit_code == 0, r.output
    from infertool.pipeline import selected_stages

    assert selected_stages(load_recipe(str(good)), None) == ["model", "serve"]


def test_the_phases_inputs_key_the_stages_that_run_them(tmp_path):
    """The decode prompt file and the lm-eval task folder are read by content: an edited prompt or task file
    changes the key of every stage that runs the as-served phases (eval; tune's reference, screen, served)."""
    from types import SimpleNamespace

    from infertool.evaluate.decode import builtin_path
    from infertool.data.suites import phase_fingerprints
    from infertool.data.fingerprint import file_sha256

    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"id": "a", "prompt": "hi"}\n')
    tasks = tmp_path / "tasks"
    (tasks / "data").mkdir(parents=True)
    (tasks / "t.yaml").write_text("task: t\n")
    (tasks / "data" / "d.jsonl").write_text('{"q": 1}\n')
    ev = SimpleNamespace(decode=SimpleNamespace(enabled=True, prompts=str(prompts)),
                         lm_eval=SimpleNamespace(include_path=str(tasks)))
    a = phase_fingerprints(ev)
    assert a["decode"]["sha256"] == file_sha256(prompts) and a["lm_eval"]["files"]
    prompts.write_text('{"id": "a", "prompt": "hello"}\n')
    (tasks / "data" / "d.jsonl").write_text('{"q": 2}\n')
    b = phase_fingerprints(ev)
    assert a["decode"] != b["decode"] and a["lm_eval"] != b["lm_eval"]
    assert phase_fingerprints(SimpleNamespace(decode=SimpleNamespace(enabled=True, prompts="builtin"), lm_eval=None)) \
        == {"decode": {"prompts": "builtin", "sha256": file_sha256(builtin_path())}}
    assert phase_fingerprints(SimpleNamespace(decode=SimpleNamespace(enabled=False, prompts="x"), lm_eval=None)) == {}
    assert phase_fingerprints(None) == {}
    assert all("phases" in stages.get(n).inputs for n in ("eval", "reference", "screen", "served"))
    r = small_recipe(tmp_path, eval={})
    base = {"model": {"identity": "m"}, "suite": {"sha256": "s"}}
    key = lambda phases: stages.keys(r, stages.select(r), {**base, "phases": phases}, HOST)["eval"]  # noqa: E731
    assert key(a) != key(b) and key(a) == key(a)
