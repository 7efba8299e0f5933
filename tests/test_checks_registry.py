"""THE check registry through every entry point: each registered check, crafted to fire (a tiny Llama-shaped model
directory with sparse safetensors data, --set overrides), run by validate, plan, every --dry-run, --emit k8s and
quantize --check. An error finding exits 2 everywhere with the same lines on stderr and the same findings under
"checks" in the --json error document; a warning is said the same way and leaves the exit code as it was. The
matrix is built from the registry and ENTRY_POINTS, so a new check or a new entry point is covered (or fails
here until it gets a crafted case). The CLI runs in process (conftest.cli_in_process): no Python start per case."""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path

import pytest

from conftest import cli_in_process
from fakes import write_safetensors
from infertool import checks

HIDDEN, INTER, HEADS, KV, LAYERS, VOCAB, POSITIONS = 256, 512, 4, 2, 2, 256, 32768

# every entry point that runs the checks: its purpose -> its command line (RECIPE stands for the recipe file)
ENTRY_POINTS = {
    "validate": ["validate", "RECIPE"],
    "plan": ["plan", "RECIPE"],
    "run": ["run", "RECIPE", "--dry-run"],
    "serve": ["serve", "RECIPE", "--dry-run"],
    "emit": ["serve", "RECIPE", "--emit", "k8s"],
    "eval": ["eval", "RECIPE", "--dry-run"],
    "bench": ["bench", "RECIPE", "--dry-run"],
    "tune": ["tune", "RECIPE", "--dry-run"],
    "quantize": ["quantize", "RECIPE", "--check"],
}
# the entry points whose own --json document carries the findings (run and serve, whose output other parts of the
# issue reshape, say warnings on stderr only; every error document carries them)
JSON_CHECKS = {"validate", "plan", "eval", "bench", "tune", "quantize"}

# each check -> the overrides that make it fire on the crafted model, and the level it fires at
CASES = {
    "position_limit": (["serve.max_model_len=65536"], "error"),  # the model's limit is 32,768 positions
    "tensor_parallel": (["serve.tensor_parallel_size=3"], "error"),  # 3 does not divide 4 heads
    "pipeline_parallel": (["serve.pipeline_parallel_size=3"], "error"),  # 3 stages over 2 layers
    "kv_fit": (["serve.max_model_len=16384", "serve.cpu.kv_cache_space_gib=0.01"], "error"),  # 10 MiB: < 11k tokens
    "reserved_cpus": (["serve.cpu.reserved_cpus=1024"], "error"),  # every core of this host kept from vLLM
    "code_loading": (["serve.allow_code=[--middleware]", "serve.extra_args=[--middleware=plug.mw]"], "warn"),
    "engine_settings": (["serve.swap_space=4"], "warn"),  # V1 has no swap space
    # suffix decoding needs arctic-inference, and an empty INFERTOOL_HOME has no serve environment to hold it
    "speculative_method": (["serve.speculative={method: suffix, num_speculative_tokens: 8}"], "error"),
    "group_size": (["quantize.group_size=512"], "error"),  # 512 does not divide in_features 256
    "quantized_tp": (["quantize.group_size=256", "serve.tensor_parallel_size=2"], "error"),  # 256/2 = 128-wide shards
    "vllm_support": (["quantize.sym=false"], "warn"),  # vLLM's GPTQ kernels load symmetric checkpoints only
    "config_vs_weights": ([], "error"),  # models.consistency monkeypatched: it finds a problem
    "lm_eval_code": (["eval.lm_eval={tasks: [t], include_path: TASKS}"], "error"),  # a !function, no trust_code
    "suite_tools": (["eval.suite=served-formats"], "error"),  # json / tool_call tasks on the hf engine
    "input_files": (["bench.trace=/dev/null"], "error"),  # a device, not a trace: refused before it is opened
    "serve_env": ([], "warn"),  # an empty INFERTOOL_HOME: no serve environment (a dry run only warns)
}
CONSISTENCY_PROBLEM = "config.json says 80 layers; the safetensors headers hold 2 (crafted)"


def write_model(dest: Path) -> Path:
    """A Llama-shaped directory: config.json and one safetensors file with a real header and sparse data."""
    dest.mkdir(parents=True)
    hd = HIDDEN // HEADS
    tensors = {"model.embed_tokens.weight": [VOCAB, HIDDEN], "model.norm.weight": [HIDDEN]}
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        tensors.update({p + "self_attn.q_proj.weight": [HIDDEN, HIDDEN], p + "self_attn.k_proj.weight": [KV * hd, HIDDEN],
                        p + "self_attn.v_proj.weight": [KV * hd, HIDDEN], p + "self_attn.o_proj.weight": [HIDDEN, HIDDEN],
                        p + "mlp.gate_proj.weight": [INTER, HIDDEN], p + "mlp.up_proj.weight": [INTER, HIDDEN],
                        p + "mlp.down_proj.weight": [HIDDEN, INTER], p + "input_layernorm.weight": [HIDDEN],
                        p + "post_attention_layernorm.weight": [HIDDEN]})
    write_safetensors(dest / "model.safetensors", tensors)
    (dest / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": HIDDEN, "intermediate_size": INTER,
        "num_attention_heads": HEADS, "num_key_value_heads": KV, "num_hidden_layers": LAYERS, "vocab_size": VOCAB,
        "max_position_embeddings": POSITIONS, "tie_word_embeddings": True, "torch_dtype": "bfloat16"}))
    return dest


RECIPE = """name: checks
model: {{source: {model}, dtype: bfloat16}}
quantize:
  method: gptq
  backend: gptqmodel
  bits: 4
  group_size: 64
  output: {out}
  calibration: {{source: builtin, samples: 8, seq_len: 64, seed: 0}}
eval: {{suite: builtin-corpus, engine: hf, max_items: 4}}
serve: {{max_model_len: 1024, enforce_eager: true, cpu: {{kv_cache_space_gib: 1}}}}
bench:
  endpoint: completions
  requests: 4
  prompt: {{source: builtin, len: 64}}
  output_len: 16
  slo: {{ttft_ms: 3000, tpot_ms: 250}}
  cost_per_hour: 0.5
tune:
  candidates: [none, {{bits: 4, group_size: 64}}]
  serve_grid: {{max_num_seqs: [4]}}
  objective: cost
  max_trials: 2
"""


@pytest.fixture(scope="module")
def recipe(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("checks")
    model = write_model(root / "model")
    path = root / "recipe.yaml"
    path.write_text(RECIPE.format(model=model, out=root / "quantized"))
    (root / "tasks").mkdir()  # lm_eval_code's case: a task folder whose YAML names code
    (root / "tasks" / "t.yaml").write_text("task: t\nprocess_docs: !function helper.docs\n")
    return path


def _placed(recipe: Path, sets: list[str]) -> list[str]:
    """The overrides with TASKS standing for the recipe's task folder."""
    return [s.replace("TASKS", str(recipe.parent / "tasks")) for s in sets]


@pytest.fixture
def home(tmp_path, monkeypatch) -> Path:
    """An empty INFERTOOL_HOME (no serve environment), this host's CPU as the target (on a GPU host too)."""
    monkeypatch.setenv("INFERTOOL_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("INFERTOOL_ACCELERATOR", "cpu")
    return tmp_path / "home"


def _argv(purpose: str, recipe: Path, sets: list[str]) -> list[str]:
    argv = [str(recipe) if a == "RECIPE" else a for a in ENTRY_POINTS[purpose]]
    return [*argv, *[x for s in _placed(recipe, sets) for x in ("--set", s)], "--json"]


def _expected(recipe: Path, sets: list[str], purpose: str) -> checks.CheckReport:
    from infertool.recipe import load_recipe
    from infertool.resolve import resolve

    return checks.run_checks(resolve(load_recipe(str(recipe), _placed(recipe, sets))), purpose=purpose)


_baseline: dict[str, int] = {}


def _baseline_exit(purpose: str, recipe: Path) -> int:
    """The entry point's exit code on the recipe as it is (no check fires an error there)."""
    if purpose not in _baseline:
        r = cli_in_process(*_argv(purpose, recipe, []))
        assert "Traceback" not in r.stderr, r.stderr
        _baseline[purpose] = r.returncode
    return _baseline[purpose]


def test_the_matrix_covers_the_registry_and_every_entry_point():
    assert set(CASES) == set(checks.names()), "a registered check without a crafted case (or a case for none)"
    assert set(ENTRY_POINTS) == set(checks.PURPOSES) - {"launch"}, "an entry point the matrix does not drive"


def test_the_recipe_is_clean(recipe, home):
    """Nothing fires an error on the crafted recipe as it is: each case below changes one thing."""
    for purpose in ENTRY_POINTS:
        assert _expected(recipe, [], purpose).errors == []
        assert _baseline_exit(purpose, recipe) == 0, purpose


@pytest.mark.parametrize("purpose", list(ENTRY_POINTS))
@pytest.mark.parametrize("name", list(CASES))
def test_every_check_through_every_entry_point(name, purpose, recipe, home, monkeypatch):
    sets, level = CASES[name]
    if name == "config_vs_weights":  # the other engineer's models.consistency, stood in for: it finds a problem
        mod = types.ModuleType("infertool.models.consistency")
        mod.config_vs_weights = lambda model_dir: [CONSISTENCY_PROBLEM]
        monkeypatch.setitem(sys.modules, "infertool.models.consistency", mod)
    report = _expected(recipe, sets, purpose)
    mine = [f for f in report.findings if f.check == name]
    r = cli_in_process(*_argv(purpose, recipe, sets))
    assert "Traceback" not in r.stderr, r.stderr
    if name in report.skipped:  # not run by this entry point (the serve environment in validate): said as data
        assert report.skipped[name].startswith("skipped: ") and not mine
        assert f": {name}: " not in r.stderr and r.returncode == _baseline_exit(purpose, recipe)
        return
    assert mine and {f.level for f in mine} == {level}, (report.findings, report.skipped)
    for f in mine:  # the same lines on every entry point's stderr
        assert f.line() in r.stderr, (f.line(), r.stderr)
    if level == "error":
        assert r.returncode == 2, r.stderr
        doc = json.loads(r.stdout)
        assert doc["ok"] is False and doc["error"] == "ChecksFailed" and doc["exit_code"] == 2
        assert [f.to_dict() for f in report.errors] == [c for c in doc["checks"] if c["level"] == "error"]
    else:  # a warning is said; the exit code is the entry point's own; the --json document lists it under "checks"
        assert r.returncode == _baseline_exit(purpose, recipe), r.stderr
        if purpose in JSON_CHECKS:
            assert all(f.to_dict() in json.loads(r.stdout)["checks"] for f in mine)


def test_a_check_that_needs_a_model_not_here_is_skipped_with_why(tmp_path, home):
    """The group size, the quantized layout and vLLM's support read the base model's headers: a model that is not on
    this machine is reported skipped (validate says so), not silently passed."""
    path = tmp_path / "r.yaml"
    path.write_text(RECIPE.format(model=tmp_path / "absent", out=tmp_path / "q"))
    report = _expected(path, [], "validate")
    for name in ("group_size", "quantized_tp", "vllm_support"):
        assert report.skipped[name].startswith("skipped: ") and "not on this machine" in report.skipped[name]
    r = cli_in_process("validate", str(path), "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["checks_skipped"]["group_size"] == report.skipped["group_size"]


def test_config_vs_weights_is_skipped_until_its_module_exists(recipe, home, monkeypatch):
    monkeypatch.setitem(sys.modules, "infertool.models.consistency", None)  # import raises ImportError
    report = _expected(recipe, [], "validate")
    assert report.skipped["config_vs_weights"].startswith("skipped: not available")


def test_serve_env_is_an_error_for_a_real_launch(recipe, home):
    """A dry run starts nothing: a missing serve environment is a warning there; for a launch it is an error."""
    (finding,) = [f for f in _expected(recipe, [], "launch").findings if f.check == "serve_env"]
    assert finding.level == "error" and "not set up" in finding.message and "env setup serve" in finding.hint
    (dry,) = [f for f in _expected(recipe, [], "run").findings if f.check == "serve_env"]
    assert dry.level == "warn" and "a real launch refuses to start (exit 3)" in dry.message


def test_the_issues_cases_by_subprocess(tmp_path):
    """The issue's own commands, once through a real CLI process: validate refuses the position limit (exit 2),
    and --emit k8s refuses a TP that serve --dry-run refuses, with the same line."""
    from conftest import run_cli

    r = run_cli("validate", "quickstart", "--set", "serve.max_model_len=200000")
    assert r.returncode == 2
    assert ("error: position_limit: serve.max_model_len: max_model_len 200,000 exceeds the model's position limit "
            "(max_position_embeddings 8,192") in r.stderr
    line = ("error: tensor_parallel: serve.tensor_parallel_size: tensor_parallel_size 3 does not divide the model's "
            "64 attention heads")
    emit = run_cli("serve", "llama3.3-70b-w4a16-tp4", "--emit", "k8s", "--set", "serve.tensor_parallel_size=3")
    dry = run_cli("serve", "llama3.3-70b-w4a16-tp4", "--dry-run", "--set", "serve.tensor_parallel_size=3")
    assert emit.returncode == dry.returncode == 2 and line in emit.stderr and line in dry.stderr
    assert "kind: Deployment" not in emit.stdout
