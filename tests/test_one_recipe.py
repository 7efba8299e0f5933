"""One recipe, one truth: for every shipped recipe, plan, quantize, eval, serve (dry run), --emit k8s, bench and
run resolve the same served model and launch vLLM with the same serve settings.

Each recipe's model.source is replaced by a directory shaped like its model (config, tokenizer, safetensors
headers; the weights are a sparse hole), so that every command can read it here, fast, without the managed
environments. Everything else is the shipped recipe.
"""

from __future__ import annotations

import json
import shlex

import pytest
import yaml
from typer.testing import CliRunner

from infertool.catalog import list_builtin
from infertool.cli import app
from infertool.models.known import match_known
from tests.fakes import layout_model

RECIPES = [r.name for r in list_builtin()]
# flags that are the launch's own business, not a serve setting: where it listens, which directory, its name
OWN = {"--host", "--port", "--model", "--served-model-name"}


def invoke(*args: str) -> str:
    r = CliRunner().invoke(app, list(args))
    assert r.exit_code in (0, 1), f"{args}: exit {r.exit_code}\n{r.output}"
    return r.stdout


def settings_of(argv: list[str], drop: tuple[str, ...] = ()) -> list[str]:
    """The serve settings in a vLLM command line: every flag and value except the launch's own."""
    args = argv[argv.index("vllm.entrypoints.openai.api_server") + 1:] if "vllm.entrypoints.openai.api_server" in argv else argv
    out, skip = [], False
    for i, a in enumerate(args):
        if skip:
            skip = False
            continue
        if a in OWN or a in drop:
            skip = i + 1 < len(args) and not args[i + 1].startswith("--")
            continue
        out.append(a)
    return out


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("layouts")
    made = {}
    for name in RECIPES:
        data = yaml.safe_load(open(next(r.path for r in list_builtin() if r.name == name)))
        key = match_known(data["model"]["source"])
        assert key, f"{name}: no known architecture for {data['model']['source']}"
        if key not in made:
            made[key] = layout_model(root / key, key)
    return made


@pytest.mark.parametrize("name", RECIPES)
def test_every_command_serves_the_same_model_with_the_same_settings(name, models, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # out/ and runs/ land here
    monkeypatch.setenv("INFERTOOL_HOME", str(tmp_path / "home"))
    data = yaml.safe_load(open(next(r.path for r in list_builtin() if r.name == name)))
    model = models[match_known(data["model"]["source"])]
    sets = ["--set", f"model.source={model}", "--set", "model.layers=null"]
    if (data.get("quantize") or {}).get("output"):
        sets += ["--set", f"quantize.output={tmp_path / 'quantized'}"]

    plan = json.loads(invoke("plan", name, *sets, "--json"))["resolution"]
    quant = json.loads(invoke("quantize", name, *sets, "--check", "--json")) if data.get("quantize") else None
    ev = json.loads(invoke("eval", name, *sets, "--dry-run", "--json", "--set", "eval.engine=vllm")) if data.get("quantize") else None
    serve = json.loads(invoke("serve", name, *sets, "--dry-run", "--json"))
    k8s = list(yaml.safe_load_all(invoke("serve", name, *sets, "--emit", "k8s")))
    bench = json.loads(invoke("bench", name, *sets, "--dry-run", "--json"))
    run = json.loads(invoke("run", name, *sets, "--dry-run", "--json"))

    # the same served model, origin, target and effective settings everywhere
    resolutions = {"plan": plan, "serve": serve["resolution"], "bench": bench["resolution"]}
    if quant:
        resolutions["quantize"] = quant["resolution"]
        resolutions["eval"] = ev["resolution"]
    served = {k: (r["served"]["path"], r["served_origin"], r["target"]["kind"], r["target"]["count"]) for k, r in resolutions.items()}
    assert len(set(served.values())) == 1, served
    settings = {k: json.dumps(r["serve"], sort_keys=True) for k, r in resolutions.items()}
    assert len(set(settings.values())) == 1, settings
    if data.get("quantize"):
        assert plan["served_origin"] == "candidate"  # never silently the original
    # the run serves what it quantizes, with the same settings
    assert run["resolution"]["served_origin"] == plan["served_origin"]
    assert json.dumps(run["resolution"]["serve"], sort_keys=True) == settings["plan"]

    # the same vLLM flags in every launch
    ref = settings_of(serve["argv"])
    launches = {"bench": bench["launches"]["the sweep"]["argv"], "run serve": run["launches"]["serve"]["argv"]}
    if quant:
        launches["quantize load check"] = quant["load_check"]["quantized"]["argv"]
        launches["eval candidate"] = settings_of(ev["launches"]["candidate"]["argv"], ("--max-logprobs",))
    for what, argv in launches.items():
        assert settings_of(argv) == ref, f"{what}: {shlex.join(argv)}\nserve: {shlex.join(serve['argv'])}"
    container = k8s[0]["spec"]["template"]["spec"]["containers"][0]
    assert settings_of(container["command"] + container["args"]) == ref
    # the served model everywhere: the same directory (the cluster sees it under /models)
    assert serve["model"] == plan["served"]["path"]
    in_pod = container["args"][container["args"].index("--model") + 1]
    assert in_pod.startswith("/models/") and in_pod.endswith(plan["served"]["name"] if not plan["served"]["path"].startswith("/models/") else in_pod)
    # the target's flags, not this host's: a GPU recipe carries no CPU variables in any launch
    if plan["target"]["kind"] == "gpu":
        for argv_env in (serve["env"], *(l["env"] for l in bench["launches"].values())):
            assert not any(k.startswith("VLLM_CPU") for k in argv_env)
        assert "--gpu-memory-utilization" in ref


def test_the_70b_tp4_recipe_as_dry_runs(models, tmp_path, monkeypatch):
    """The 70B TP-4 recipe's eval and quantize load check launch TP 4 with the recipe's memory settings."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("INFERTOOL_HOME", str(tmp_path / "home"))
    sets = ["--set", f"model.source={models['llama-3.3-70b']}", "--set", f"quantize.output={tmp_path / 'w4a16'}"]
    ev = json.loads(invoke("eval", "llama3.3-70b-w4a16-tp4", *sets, "--dry-run", "--json"))
    q = json.loads(invoke("quantize", "llama3.3-70b-w4a16-tp4", *sets, "--check", "--json"))
    for launch in (*ev["launches"].values(), *q["load_check"].values()):
        argv = launch["argv"]
        assert argv[argv.index("--tensor-parallel-size") + 1] == "4"
        assert argv[argv.index("--gpu-memory-utilization") + 1] == "0.9"
        assert argv[argv.index("--max-model-len") + 1] == "8192"
        assert launch["target"] == {"kind": "gpu", "gpu": "H100-SXM", "count": 4, "this_host": False, "source": "target.gpu"}
    assert ev["launches"]["candidate"]["model"] == str(tmp_path / "w4a16")
    assert q["load_check"]["original"]["model"] == str(models["llama-3.3-70b"])


def test_command_line_models_are_inputs_of_the_one_resolution(tmp_path):
    """--base / --candidate reach resolve() as Overrides: the ModelRefs are made there, named by what was given,
    and the served model follows the given candidate (never a ModelRef patched afterwards)."""
    from infertool.recipe import validate_recipe_data
    from infertool.resolve import Overrides, resolve

    orig = layout_model(tmp_path / "orig", "llama-3.1-8b", shards=1)
    other = layout_model(tmp_path / "other", "llama-3.1-8b", shards=1)
    cand = layout_model(tmp_path / "cand", "llama-3.1-8b", shards=1)
    recipe = validate_recipe_data({"name": "o", "model": {"source": str(orig)},
                                   "quantize": {"method": "gptq", "bits": 4, "group_size": 64}}, source="test")
    res = resolve(recipe, Overrides(base=str(other), candidate=str(cand)))
    assert (res.base.path, res.base.label, res.base.role) == (str(other.resolve()), str(other), "base")
    assert (res.candidate.path, res.candidate.label, res.candidate.exists) == (str(cand.absolute()), str(cand), True)
    assert res.candidate.quantization["bits"] == 4  # the recipe's quantization, the given directory
    assert res.served is res.candidate and res.served_origin == "candidate"
    plain = resolve(recipe)
    assert plain.base.path == str(orig.resolve()) and plain.candidate.path.endswith("out/o-gptq")
    moved = plain.candidate_at(cand)
    assert moved.exists and moved.label == plain.candidate.label and moved.path == str(cand.absolute())


def test_a_given_base_is_found_like_model_source_and_named_by_what_was_given(tmp_path, monkeypatch):
    """--base goes through the same models.sources.locate as model.source: a .gguf's conversion in the cache,
    a hub id's cached snapshot; its served name is what was given, never a cache key or a revision."""
    from infertool.errors import UsageError
    from infertool.models.sources import MARKER, locate
    from infertool.recipe import validate_recipe_data
    from infertool.resolve import Overrides, resolve

    monkeypatch.setenv("INFERTOOL_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf"))
    monkeypatch.chdir(tmp_path)
    recipe = validate_recipe_data({"name": "o", "model": {"source": str(layout_model(tmp_path / "orig", "smollm2-135m",
                                                                                        shards=1))}}, source="test")
    gguf = tmp_path / "Tiny-Q4.gguf"
    gguf.write_bytes(b"GGUF fake")
    later = resolve(recipe, Overrides(base=str(gguf))).base
    assert (later.exists, later.note, later.name) == (False, "converted on first use", "Tiny-Q4")
    converted = locate(str(gguf), dtype="bfloat16").path
    converted.mkdir(parents=True)
    (converted / MARKER).write_text("{}")  # converted before: reused, no worker runs
    for materialize in (False, True):
        base = resolve(recipe, Overrides(base=str(gguf)), materialize=materialize).base
        assert (base.path, base.exists, base.label, base.name) == (str(converted), True, str(gguf), "Tiny-Q4")
    snap = layout_model(tmp_path / "hf" / "models--org--Model-1B" / "snapshots" / "abc", "smollm2-135m", shards=1)
    for materialize in (False, True):
        base = resolve(recipe, Overrides(base="org/Model-1B"), materialize=materialize).base
        assert (base.path, base.exists, base.name) == (str(snap), True, "Model-1B")
    with pytest.raises(UsageError, match="never downloads"):
        resolve(recipe, Overrides(base="org/Other"))
    with pytest.raises(UsageError, match="model not found: ./nope"):
        resolve(recipe, Overrides(base="./nope"))


def test_ensure_makes_the_base_that_was_given(tmp_path, monkeypatch):
    """``Resolution.ensure`` converts the base as the resolution has it: the recipe's model.source with
    model.layers, or a base given with ``Overrides(base=...)`` as it was given (never model.source in its place);
    a bitsandbytes candidate (the base, quantized when loaded) with it. Conversions already in the cache are
    reused, so no worker runs here."""
    from infertool.models.sources import MARKER, locate
    from infertool.recipe import validate_recipe_data
    from infertool.resolve import Overrides, resolve

    monkeypatch.setenv("INFERTOOL_HOME", str(tmp_path / "home"))
    recipe_gguf, given_gguf = tmp_path / "Recipe-Q4.gguf", tmp_path / "Given-Q4.gguf"
    recipe_gguf.write_bytes(b"GGUF the recipe's")
    given_gguf.write_bytes(b"GGUF the given one")
    recipe = validate_recipe_data({"name": "e", "model": {"source": str(recipe_gguf), "layers": 2},
                                   "quantize": {"method": "bnb"}}, source="test")

    def convert_before(gguf, layers=None):
        path = locate(str(gguf), layers=layers, dtype="auto").path
        path.mkdir(parents=True)
        (path / MARKER).write_text("{}")
        return str(path)

    given = resolve(recipe, Overrides(base=str(given_gguf)))
    plain = resolve(recipe)
    assert not given.base.exists and not plain.base.exists and not plain.candidate.exists
    given_path, recipe_path = convert_before(given_gguf), convert_before(recipe_gguf, layers=2)
    assert given_path != recipe_path != convert_before(recipe_gguf)  # layers make another conversion
    made = given.ensure(given.base)
    assert (made.path, made.exists, made.label) == (given_path, True, str(given_gguf))
    cand = plain.ensure(plain.candidate)  # bitsandbytes: the base, quantized when loaded
    assert (cand.path, cand.exists, cand.load_quantization) == (recipe_path, True, "bitsandbytes")
    assert (plain.base.path, plain.base.exists) == (recipe_path, True)
