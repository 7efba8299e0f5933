"""The recipe models and loader: defaults, every-error-at-once reporting, overrides, YAML pitfalls."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from infertool.catalog import builtin_dir
from infertool.errors import RecipeError, UsageError
from infertool.recipe import (
    AWQConfig,
    BNBConfig,
    GPTQConfig,
    Recipe,
    apply_overrides,
    load_recipe,
    load_recipe_data,
    parse_overrides,
    recipe_to_dict,
    validate_recipe_data,
)

MINIMAL = """\
name: tiny
model:
  source: bundled:smollm2-135m
"""


def write(tmp_path: Path, text: str, name: str = "recipe.yaml") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    return path


def issues_by_path(err: RecipeError) -> dict[str, object]:
    return {issue.path: issue for issue in err.issues}


def recipe_error(path: Path, overrides: list[str] | None = None) -> RecipeError:
    with pytest.raises(RecipeError) as info:
        load_recipe(path, overrides)
    return info.value


# ---------------------------------------------------------------------------- valid recipes


def test_valid_recipe_loads_with_defaults(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        MINIMAL
        + """\
quantize:
  method: gptq
  group_size: 64
eval: {}
serve:
  port: 8001
bench:
  concurrency: [4]
""",
    )
    recipe = load_recipe(path)
    assert isinstance(recipe, Recipe)
    assert recipe.name == "tiny"
    assert recipe.model.dtype == "bfloat16"
    assert recipe.model.trust_remote_code is False
    assert isinstance(recipe.quantize, GPTQConfig)
    assert recipe.quantize.backend == "gptqmodel"
    assert recipe.quantize.bits == 4
    assert recipe.quantize.group_size == 64
    assert recipe.quantize.calibration.samples == 128
    assert recipe.quantize.calibration.source == "builtin"
    assert recipe.eval is not None and recipe.eval.engine == "hf"
    assert recipe.eval.accept.preset == "standard"
    assert recipe.eval.accept.confidence == 0.95
    assert recipe.serve is not None and recipe.serve.port == 8001
    assert recipe.serve.host == "127.0.0.1"
    assert recipe.serve.gpu_memory_utilization == 0.9
    assert recipe.serve.env == {} and recipe.serve.extra_args == []
    assert recipe.bench is not None and recipe.bench.concurrency == [4]
    assert recipe.bench.prompt.len == 256
    assert recipe.profile is None and recipe.run is None


def test_union_members_are_chosen_by_method(tmp_path: Path) -> None:
    awq = load_recipe(write(tmp_path, MINIMAL + "quantize: {method: awq, group_size: 64}\n", "a.yaml"))
    bnb = load_recipe(write(tmp_path, MINIMAL + "quantize: {method: bnb}\n", "b.yaml"))
    assert isinstance(awq.quantize, AWQConfig) and awq.quantize.format == "gemm"
    assert isinstance(bnb.quantize, BNBConfig) and bnb.quantize.quant_type == "nf4"


def test_short_dtype_spellings_are_normalised(tmp_path: Path) -> None:
    recipe = load_recipe(
        write(tmp_path, MINIMAL.replace("  source:", "  dtype: bf16\n  source:") + "serve: {dtype: fp16}\n")
    )
    assert recipe.model.dtype == "bfloat16"
    assert recipe.serve is not None and recipe.serve.dtype == "float16"


def test_env_values_and_extra_args_accept_numbers(tmp_path: Path) -> None:
    recipe = load_recipe(
        write(tmp_path, MINIMAL + "serve:\n  env: {OMP_NUM_THREADS: 4}\n  extra_args: [--seed, 0]\n")
    )
    assert recipe.serve is not None
    assert recipe.serve.env == {"OMP_NUM_THREADS": "4"}
    assert recipe.serve.extra_args == ["--seed", "0"]


def test_recipe_to_dict_round_trips(tmp_path: Path) -> None:
    recipe = load_recipe(builtin_dir() / "quickstart.yaml")
    data = recipe_to_dict(recipe)
    assert data["quantize"]["method"] == "gptq"
    assert data["serve"]["cpu"] == {"kv_cache_space_gib": 1.0, "omp_threads_bind": None, "reserved_cpus": 0}
    assert "eval" in data and data["profile"]["batch"] == [1, 8, 32]
    again = validate_recipe_data(data)
    assert again == recipe
    assert recipe_to_dict(again) == data


# ---------------------------------------------------------------------------- all errors at once


def test_three_mistakes_give_exactly_three_issues_with_lines(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """\
        name: three-mistakes
        model:
          source: bundled:smollm2-135m
        quantize:
          method: gptq
          grup_size: 64
        profile:
          batch: [1, "x"]
        serve:
          port: 99999
        """,
    )
    err = recipe_error(path)
    assert len(err.issues) == 3
    found = issues_by_path(err)
    assert set(found) == {"quantize.grup_size", "profile.batch[1]", "serve.port"}

    typo = found["quantize.grup_size"]
    assert typo.line == 6 and typo.column == 3
    assert "unknown field 'grup_size'" in typo.message
    assert "did you mean 'group_size'" in typo.message

    batch = found["profile.batch[1]"]
    assert batch.line == 8
    assert "integer" in batch.message

    port = found["serve.port"]
    assert port.line == 10 and port.column == 3
    assert "65535" in port.message
    # issues come sorted by line
    assert [i.line for i in err.issues] == [6, 8, 10]
    assert "3 errors" in err.message


def test_discriminated_union_tag_is_stripped_from_paths(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        MINIMAL
        + """\
quantize:
  method: awq
  group_size: 100
  bits: 8
""",
    )
    found = issues_by_path(recipe_error(path))
    assert set(found) == {"quantize.group_size", "quantize.bits"}
    assert "power of two" in found["quantize.group_size"].message
    assert found["quantize.group_size"].line == 6
    assert found["quantize.bits"].line == 7
    assert not any("awq" in p for p in found)


def test_bad_method_lists_known_methods(tmp_path: Path) -> None:
    path = write(tmp_path, MINIMAL + "quantize:\n  method: hqq\n")
    (issue,) = recipe_error(path).issues
    assert issue.path == "quantize.method"
    assert "'hqq'" in issue.message
    for method in ("gptq", "awq", "bnb"):
        assert method in issue.message
    assert issue.line == 5


def test_missing_method_and_missing_required_fields(tmp_path: Path) -> None:
    path = write(tmp_path, "name: x\nmodel: {}\nquantize:\n  bits: 4\n")
    found = issues_by_path(recipe_error(path))
    assert set(found) == {"model.source", "quantize.method"}
    assert "gptq" in found["quantize.method"].message
    # a missing field points at its parent mapping
    assert found["model.source"].line == 2
    assert found["quantize.method"].line == 3


def test_bnb_rejects_calibration(tmp_path: Path) -> None:
    path = write(tmp_path, MINIMAL + "quantize: {method: bnb, calibration: {samples: 8}}\n")
    (issue,) = recipe_error(path).issues
    assert issue.path == "quantize.calibration"
    assert "unknown field 'calibration'" in issue.message


def test_unknown_top_level_section_suggests_the_right_one(tmp_path: Path) -> None:
    path = write(tmp_path, MINIMAL + "evaluation: {}\nserv: {}\n")
    found = issues_by_path(recipe_error(path))
    assert "did you mean 'eval'" in found["evaluation"].message
    assert "did you mean 'serve'" in found["serv"].message


def test_bad_name_and_unknown_bundled_model(tmp_path: Path) -> None:
    path = write(tmp_path, "name: ../escape\nmodel: {source: 'bundled:gpt-5'}\n")
    found = issues_by_path(recipe_error(path))
    assert "run directories" in found["name"].message
    assert "smollm2-135m" in found["model.source"].message


@pytest.mark.parametrize("backend", ["auto-gptq", "autoawq"])
def test_end_of_life_backend_points_to_gptqmodel(tmp_path: Path, backend: str) -> None:
    path = write(tmp_path, MINIMAL + f"quantize: {{method: gptq, backend: {backend}}}\n")
    (issue,) = recipe_error(path).issues
    assert issue.path == "quantize.backend"
    assert "end-of-life" in issue.message
    assert "gptqmodel" in issue.message
    assert issue.line == 4


def test_scheme_needs_llmcompressor(tmp_path: Path) -> None:
    bad = write(tmp_path, MINIMAL + "quantize: {method: gptq, scheme: W4A16}\n", "bad.yaml")
    (issue,) = recipe_error(bad).issues
    assert issue.path == "quantize.scheme"
    assert "llmcompressor" in issue.message
    good = write(
        tmp_path, MINIMAL + "quantize: {method: gptq, backend: llmcompressor, scheme: W4A16}\n", "ok.yaml"
    )
    assert load_recipe(good).quantize.scheme == "W4A16"


def test_eval_engine_openai_needs_url(tmp_path: Path) -> None:
    path = write(tmp_path, MINIMAL + "eval:\n  engine: openai\n")
    (issue,) = recipe_error(path).issues
    assert issue.path == "eval.url"
    assert "url" in issue.message and "openai" in issue.message
    ok = write(tmp_path, MINIMAL + "eval: {engine: openai, url: 'http://127.0.0.1:8000/v1'}\n", "ok.yaml")
    assert load_recipe(ok).eval.url == "http://127.0.0.1:8000/v1"


def test_api_key_env_that_looks_like_a_key(tmp_path: Path) -> None:
    secret = "sk-proj-abcdefghijklmnopqrstuvwxyz0123456789"
    path = write(tmp_path, MINIMAL + f"serve:\n  api_key_env: {secret}\n")
    (issue,) = recipe_error(path).issues
    assert issue.path == "serve.api_key_env"
    assert "NAME of an environment variable" in issue.message
    assert secret not in issue.message  # never echo a key
    assert issue.line == 5


@pytest.mark.parametrize("name", ["INFERTOOL_API_KEY", "HF_TOKEN", "OPENAI_API_KEY", "_KEY2"])
def test_api_key_env_accepts_variable_names(tmp_path: Path, name: str) -> None:
    recipe = load_recipe(write(tmp_path, MINIMAL + f"serve: {{api_key_env: {name}}}\n"))
    assert recipe.serve.api_key_env == name


def test_api_key_env_must_be_a_variable_name(tmp_path: Path) -> None:
    path = write(tmp_path, MINIMAL + "serve: {api_key_env: 'my key'}\n")
    (issue,) = recipe_error(path).issues
    assert issue.path == "serve.api_key_env"
    assert "environment variable name" in issue.message


def test_speculative_draft_model_needs_model(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        MINIMAL + "serve:\n  speculative:\n    method: draft_model\n    num_speculative_tokens: 3\n",
    )
    (issue,) = recipe_error(path).issues
    assert issue.path == "serve.speculative.model"
    assert "draft_model" in issue.message
    assert issue.line == 5  # the `speculative:` key, the parent of the missing one


def test_tool_choice_needs_parser(tmp_path: Path) -> None:
    path = write(tmp_path, MINIMAL + "serve: {enable_auto_tool_choice: true}\n")
    (issue,) = recipe_error(path).issues
    assert issue.path == "serve.tool_call_parser"


def test_range_checks(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        MINIMAL
        + """\
serve:
  gpu_memory_utilization: 1.5
  cpu: {kv_cache_space_gib: 0, omp_threads_bind: "all", reserved_cpus: -1}
bench:
  shared_prefix_ratio: 2
  concurrency: []
  experiments: [warp_speed]
profile:
  batch: [0]
""",
    )
    found = issues_by_path(recipe_error(path))
    assert set(found) == {
        "serve.gpu_memory_utilization",
        "serve.cpu.kv_cache_space_gib",
        "serve.cpu.omp_threads_bind",
        "serve.cpu.reserved_cpus",
        "bench.shared_prefix_ratio",
        "bench.concurrency",
        "bench.experiments[0]",
        "profile.batch[0]",
    }


# ---------------------------------------------------------------------------- YAML problems


def test_yaml_syntax_error_has_line_and_column(tmp_path: Path) -> None:
    path = write(tmp_path, "name: x\nmodel:\n  source: [unclosed\n  dtype: bf16\nserve: {port: 1}\n")
    (issue,) = recipe_error(path).issues
    assert issue.path == "<yaml>"
    assert issue.line is not None and issue.line >= 3
    assert issue.column is not None and issue.column >= 1


def test_yaml_bad_indentation_position(tmp_path: Path) -> None:
    path = write(tmp_path, "name: x\nmodel:\n  source: a\n dtype: b\n")
    (issue,) = recipe_error(path).issues
    assert issue.path == "<yaml>"
    assert (issue.line, issue.column) == (4, 2)


def test_duplicate_keys_are_detected(tmp_path: Path) -> None:
    path = write(tmp_path, MINIMAL + "serve:\n  port: 8000\n  host: 0.0.0.0\n  port: 9000\n")
    (issue,) = recipe_error(path).issues
    assert issue.path == "<yaml>"
    assert "duplicate key 'port'" in issue.message
    assert "line 5" in issue.message  # where the first one is
    assert issue.line == 7


def test_duplicate_top_level_section(tmp_path: Path) -> None:
    path = write(tmp_path, MINIMAL + "name: other\n")
    (issue,) = recipe_error(path).issues
    assert "duplicate key 'name'" in issue.message and issue.line == 4


def test_yaml_merge_keys_still_work(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        MINIMAL
        + """\
bench:
  slo: &slo {ttft_ms: 100, tpot_ms: 10}
  concurrency: [1]
eval:
  accept:
    <<: {min_top1: 0.5, confidence: 0.9}
    confidence: 0.99
""",
    )
    recipe = load_recipe(path)
    assert recipe.eval.accept.confidence == 0.99 and recipe.eval.accept.min_top1 == 0.5


@pytest.mark.parametrize("text", ["", "\n", "# only a comment\n", "~\n"])
def test_empty_recipe(tmp_path: Path, text: str) -> None:
    (issue,) = recipe_error(write(tmp_path, text)).issues
    assert "empty" in issue.message


def test_top_level_list(tmp_path: Path) -> None:
    err = recipe_error(write(tmp_path, "- name: x\n- model: y\n"))
    (issue,) = err.issues
    assert "mapping" in issue.message and "list" in issue.message


def test_section_that_is_not_a_mapping(tmp_path: Path) -> None:
    (issue,) = recipe_error(write(tmp_path, MINIMAL + "serve: fast\n")).issues
    assert issue.path == "serve" and "mapping" in issue.message and issue.line == 4


def test_python_tags_are_refused(tmp_path: Path) -> None:
    path = write(tmp_path, MINIMAL + "description: !!python/object/apply:os.system ['true']\n")
    (issue,) = recipe_error(path).issues
    assert issue.path == "description" and issue.line == 4  # refused by its field path, before any constructor runs
    assert "the YAML tag '!!python/object/apply:os.system' is not allowed" in issue.message


# ---------------------------------------------------------------------------- files


def test_missing_file_is_usage_error(tmp_path: Path) -> None:
    missing = tmp_path / "nope.yaml"
    with pytest.raises(UsageError) as info:
        load_recipe(missing)
    assert str(missing) in info.value.message
    assert info.value.hint and "recipes list" in info.value.hint
    assert not isinstance(info.value, RecipeError)


def test_unknown_bare_name_suggests_builtin() -> None:
    with pytest.raises(UsageError) as info:
        load_recipe("quickstrat")
    assert "quickstart" in (info.value.hint or "")


def test_directory_is_usage_error(tmp_path: Path) -> None:
    with pytest.raises(UsageError) as info:
        load_recipe(tmp_path)
    assert "directory" in info.value.message
    assert not isinstance(info.value, RecipeError)


def test_binary_file_is_usage_error(tmp_path: Path) -> None:
    path = tmp_path / "weights.yaml"
    path.write_bytes(b"\xff\xfe\x00\x81garbage")
    with pytest.raises(UsageError):
        load_recipe(path)


def test_load_recipe_data_only_parses(tmp_path: Path) -> None:
    data = load_recipe_data(write(tmp_path, "name: x\nbogus: 1\n"))
    assert data == {"name": "x", "bogus": 1}


def test_validate_recipe_data_with_yaml_text_locates_issues() -> None:
    text = MINIMAL + "serve:\n  port: 0\n"
    import yaml

    with pytest.raises(RecipeError) as info:
        validate_recipe_data(yaml.safe_load(text), source="inline", yaml_text=text)
    (issue,) = info.value.issues
    assert (issue.path, issue.line) == ("serve.port", 5)
    assert info.value.source == "inline"
    with pytest.raises(RecipeError) as info:
        validate_recipe_data(yaml.safe_load(text))
    assert info.value.issues[0].line is None


def test_non_mapping_data_is_recipe_error() -> None:
    with pytest.raises(RecipeError):
        validate_recipe_data(["not", "a", "mapping"])  # type: ignore[arg-type]


# ---------------------------------------------------------------------------- overrides


def test_parse_overrides_types() -> None:
    parsed = parse_overrides(
        [
            "quantize.group_size=64",
            "serve.enforce_eager=true",
            "profile.batch=[1,2]",
            "name=abc",
            "description=",
            "serve.host=0.0.0.0",
            "eval.url=http://h:1/v1?a=b",
            "quantize=null",
        ]
    )
    assert parsed == [
        ("quantize.group_size", 64),
        ("serve.enforce_eager", True),
        ("profile.batch", [1, 2]),
        ("name", "abc"),
        ("description", ""),
        ("serve.host", "0.0.0.0"),
        ("eval.url", "http://h:1/v1?a=b"),
        ("quantize", None),
    ]


@pytest.mark.parametrize("item", ["no-equals", "=5", "a..b=1", ".a=1", "a.=1", "a b=1"])
def test_malformed_override_is_usage_error(item: str) -> None:
    with pytest.raises(UsageError) as info:
        parse_overrides([item])
    assert item in info.value.message
    assert info.value.hint and "=" in info.value.hint


def test_unparseable_override_value_is_usage_error() -> None:
    with pytest.raises(UsageError) as info:
        parse_overrides(["profile.batch=[1,2"])
    assert "profile.batch" in info.value.message


def test_apply_overrides_creates_intermediate_dicts_and_copies() -> None:
    data = {"name": "x", "serve": None, "model": {"source": "a"}}
    result = apply_overrides(data, [("serve.cpu.kv_cache_space_gib", 2), ("bench.requests", 8)])
    assert result["serve"] == {"cpu": {"kv_cache_space_gib": 2}}
    assert result["bench"] == {"requests": 8}
    assert data == {"name": "x", "serve": None, "model": {"source": "a"}}  # untouched


def test_apply_override_into_scalar_is_usage_error() -> None:
    with pytest.raises(UsageError) as info:
        apply_overrides({"model": {"source": "a"}}, [("model.source.path", "b")])
    assert "model.source" in info.value.message


def test_apply_override_list_index_is_usage_error() -> None:
    with pytest.raises(UsageError) as info:
        apply_overrides({"profile": {"batch": [1, 8]}}, [("profile.batch.0", 4)])
    assert "list indices are not supported" in info.value.message


def test_override_fixes_an_invalid_recipe(tmp_path: Path) -> None:
    path = write(tmp_path, MINIMAL + "quantize:\n  method: gptq\n  group_size: 100\n")
    assert recipe_error(path).issues[0].path == "quantize.group_size"
    recipe = load_recipe(path, ["quantize.group_size=64"])
    assert recipe.quantize.group_size == 64
    recipe = load_recipe(path, [("quantize.group_size", 32)])
    assert recipe.quantize.group_size == 32


def test_override_errors_have_no_line(tmp_path: Path) -> None:
    path = write(tmp_path, MINIMAL + "serve:\n  port: 8000\n")
    (issue,) = recipe_error(path, ["serve.port=70000"]).issues
    assert issue.path == "serve.port"
    assert issue.line is None


def test_override_bad_method_reports_methods(tmp_path: Path) -> None:
    (issue,) = recipe_error(write(tmp_path, MINIMAL), ["quantize.method=foo"]).issues
    assert issue.path == "quantize.method" and "gptq, awq, bnb" in issue.message


# ---------------------------------------------------------------------------- built-in recipes

BUILTIN_FILES = sorted(builtin_dir().glob("*.yaml"))


def test_there_are_builtin_recipes() -> None:
    assert len(BUILTIN_FILES) >= 8


def test_target_section_and_moved_profile_gpu() -> None:
    from infertool.errors import RecipeError
    from infertool.recipe import validate_recipe_data

    r = validate_recipe_data({"name": "t", "model": {"source": "/m"}, "target": {"gpu": "h100 sxm"}})
    assert r.target.gpu == "H100-SXM"  # aliases resolve to the hardware table's key
    with pytest.raises(RecipeError) as e:
        validate_recipe_data({"name": "t", "model": {"source": "/m"}, "target": {"gpu": "Z80"}, "profile": {"gpu": "H100"}})
    paths = {i.path: i.message for i in e.value.issues}
    assert "unknown GPU 'Z80'" in paths["target.gpu"] and "moved to target.gpu" in paths["profile.gpu"]


@pytest.mark.parametrize("path", BUILTIN_FILES, ids=[p.stem for p in BUILTIN_FILES])
def test_every_builtin_recipe_validates(path: Path) -> None:
    recipe = load_recipe(path)
    assert recipe.name == path.stem
    assert recipe.description
    assert recipe_to_dict(recipe)["name"] == path.stem


def test_quickstart_matches_the_architecture_sketch() -> None:
    recipe = load_recipe(builtin_dir() / "quickstart.yaml")
    assert recipe.model.source == "bundled:smollm2-135m"
    q = recipe.quantize
    assert isinstance(q, GPTQConfig)
    assert (q.backend, q.bits, q.group_size) == ("gptqmodel", 4, 64)
    assert (q.calibration.samples, q.calibration.seq_len, q.calibration.seed) == (32, 256, 0)
    s = recipe.serve
    assert s is not None
    assert (s.host, s.port, s.max_model_len, s.max_num_seqs) == ("127.0.0.1", 8000, 2048, 32)
    assert s.enforce_eager and s.enable_prefix_caching and s.api_key_env == "INFERTOOL_API_KEY"
    assert s.cpu is not None and s.cpu.kv_cache_space_gib == 1
    b = recipe.bench
    assert b is not None and b.slo is not None
    # the bench is shortened from the sketch (64 requests x 128 tokens at [1, 8, 32]) so that `make demo`
    # runs end to end in minutes on 2 CPU cores
    assert (b.concurrency, b.requests, b.output_len, b.prompt.len, b.cost_per_hour) == ([1, 8], 16, 64, 256, 0.5)
    assert (b.slo.ttft_ms, b.slo.tpot_ms) == (2000, 200)


def test_importing_recipe_stays_light() -> None:
    import subprocess
    import sys

    code = "import sys, infertool.recipe; print(any(m in sys.modules for m in ('torch', 'numpy')))"
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        cwd=Path(__file__).resolve().parents[1],
    )
    assert out.stdout.strip() == "False"
