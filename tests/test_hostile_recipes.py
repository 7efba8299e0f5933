"""Issue 15, findings 7 and 8: absurd recipes and malformed model directories are clear errors (exit 2, one
message with the field path or the model directory), never a pass, an "internal error", a hang or a quadratic
wait. Each case here is one the issue's tester found; tests/test_fuzz.py generates many more."""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path

import pytest
from typer.testing import CliRunner

from infertool.cli import app
from infertool.errors import RecipeError, UsageError
from infertool.models.info import MAX_CONFIG_BYTES, ModelError, model_info, read_regular_file
from infertool.recipe import MAX_LISTED_ISSUES, MAX_RECIPE_BYTES, load_recipe
from tests.conftest import deadline
from tests.fakes import layout_model

runner = CliRunner()
QUICKSTART = str(Path(__file__).resolve().parents[1] / "recipes" / "quickstart.yaml")


def invoke(*args: str):
    with deadline(60):
        return runner.invoke(app, list(args))


# ------------------------------------------------------------------------------------------- finding 7
ABSURD = [
    ("serve.max_model_len=1000000000000000000", "serve.max_model_len", "less than or equal to 10000000"),
    ("serve.cpu.kv_cache_space_gib=1.0e308", "serve.cpu.kv_cache_space_gib", "less than or equal to 65536"),
    ("serve.tensor_parallel_size=1000000000", "serve.tensor_parallel_size", "less than or equal to 1024"),
    ("serve.pipeline_parallel_size=1000000000", "serve.pipeline_parallel_size", "less than or equal to 1024"),
    ("quantize.group_size=4611686018427387904", "quantize.group_size", "power of two from 16 to 1024"),
    ("quantize.group_size=2048", "quantize.group_size", "power of two from 16 to 1024"),
    ("name=" + "a" * 100_000, "name", "at most 200 characters"),
    ('serve.model="/models/x\\n---\\nkind: Pod"', "serve.model", "line breaks"),
    ('serve.host="evil\\nhost"', "serve.host", "line breaks"),
    ('serve.served_model_name="a\\tb"', "serve.served_model_name", "control characters"),
    ('model.source="/models/x\\u2028y"', "model.source", "line breaks"),
    ("serve.max_num_seqs=true", "serve.max_num_seqs", "not a boolean"),
    ("serve.port=yes", "serve.port", "not a boolean"),
    ("serve.gpu_memory_utilization=true", "serve.gpu_memory_utilization", "not a boolean"),
    ("bench.requests=100000000", "bench.requests", "less than or equal to 1000000"),
    ("bench.concurrency=[1000000000]", "bench.concurrency[0]", "less than or equal to 65536"),
    ("profile.batch=[1000000000000]", "profile.batch[0]", "less than or equal to 65536"),
    ("quantize.calibration.samples=1000000000000", "quantize.calibration.samples", "less than or equal to 100000"),
    ("quantize.calibration.seed=-1", "quantize.calibration.seed", "greater than or equal to 0"),
    ("bench.max_duration_s=1.0e300", "bench.max_duration_s", "less than or equal to 2592000"),
    ("bench.cost_per_hour=.inf", "bench.cost_per_hour", "finite number"),
    ("serve.startup_timeout_s=.nan", "serve.startup_timeout_s", "finite number"),
    ("bench.concurrency=[" + ",".join(["1"] * 65) + "]", "bench.concurrency", "at most 64 items"),
]


@pytest.mark.parametrize("override,path,words", ABSURD, ids=[a[1] + ":" + a[0][-12:] for a in ABSURD])
def test_absurd_values_are_refused_with_their_field_path(override, path, words):
    r = invoke("validate", QUICKSTART, "--set", override, "--json")
    assert r.exit_code == 2, r.output
    doc = json.loads(r.stdout)
    assert [i["path"] for i in doc["issues"]] == [path]
    assert words in doc["issues"][0]["message"]
    assert "internal error" not in r.output and "Traceback" not in r.output


# issue 34, finding 8: bench fields that contradict each other, or that nothing would read, were accepted
CONTRADICTORY = [
    (("bench.rate=[1,2]", "bench.rate_sweep.start=1"), "bench.rate_sweep", "rate and rate_sweep exclude each other"),
    (("bench.concurrency=[8,1,8]",), "bench.concurrency", "8 listed more than once"),
    (("bench.rate=[2,2.0]",), "bench.rate", "2 listed more than once"),
    (("bench.repeats.min_runs=5", "bench.repeats.max_runs=2"), "bench.repeats.min_runs",
     "min_runs (5) must not exceed max_runs (2)"),
    (("bench.rate=[1]", "bench.burstiness=0.5"), "bench.burstiness",
     "burstiness 0.5 shapes gamma arrivals only, and arrival is poisson"),
]


@pytest.mark.parametrize("overrides,path,words", CONTRADICTORY, ids=[c[1] for c in CONTRADICTORY])
def test_contradictory_bench_fields_are_refused_with_their_field_path(tmp_home, overrides, path, words):
    sets = [a for o in overrides for a in ("--set", o)]
    for command in ("validate", "plan"):
        r = invoke(command, QUICKSTART, *sets, "--json")
        assert r.exit_code == 2, (command, r.output)
        doc = json.loads(r.stdout)
        assert [i["path"] for i in doc["issues"]] == [path] and words in doc["issues"][0]["message"], doc
    r = invoke("bench", QUICKSTART, "--dry-run", *sets)
    assert r.exit_code == 2 and path in r.output and "internal error" not in r.output, r.output


def test_the_same_bench_fields_that_agree_are_accepted():
    ok = invoke("validate", QUICKSTART, "--set", "bench.rate=[1,2]", "--set", "bench.arrival=gamma",
                "--set", "bench.burstiness=0.5", "--set", "bench.repeats.max_runs=5", "--set", "bench.repeats.min_runs=5")
    assert ok.exit_code == 0, ok.output


def test_plan_with_huge_kv_space_or_memory_is_a_usage_error_not_an_overflow(tmp_home):
    r = invoke("plan", QUICKSTART, "--set", "serve.cpu.kv_cache_space_gib=1.0e308")
    assert r.exit_code == 2 and "serve.cpu.kv_cache_space_gib" in r.output, r.output
    for memory in ("1e308", "inf", "nan"):
        r = invoke("plan", QUICKSTART, "--memory", memory)
        assert r.exit_code == 2 and "--memory" in r.output and "internal error" not in r.output, r.output


def test_every_shipped_recipe_still_validates():
    for recipe in sorted((Path(QUICKSTART).parent).glob("*.yaml")):
        assert load_recipe(recipe).name


def test_a_recipe_larger_than_the_limit_is_refused_before_parsing(tmp_path):
    big = tmp_path / "big.yaml"
    big.write_text("name: x\nmodel: {source: bundled:smollm2-135m}\n" + "k: v\n" * (MAX_RECIPE_BYTES // 5 + 10))
    r = invoke("validate", str(big))
    assert r.exit_code == 2
    assert "larger than 1,048,576 bytes" in r.output and "at most 1024 KiB" in r.output


def test_a_fifo_as_recipe_is_refused_not_waited_on(tmp_path):
    fifo = tmp_path / "recipe.yaml"
    os.mkfifo(fifo)
    r = invoke("validate", str(fifo))  # the deadline fails the test if it blocks
    assert r.exit_code == 2 and "FIFO" in r.output, r.output


def test_many_errors_are_counted_and_the_first_50_listed_in_linear_work(tmp_path, monkeypatch):
    """20,000 unknown keys (17 s before, quadratic): each key's line comes from one index of its mapping, and
    "did you mean" runs for the listed errors only. Counted in calls, not timed."""
    import difflib

    import infertool.recipe.issues as recipe_mod

    n = 20_000
    path = tmp_path / "keys.yaml"
    path.write_text("name: x\nmodel: {source: bundled:smollm2-135m}\n" + "".join(f"kee{i}: 1\n" for i in range(n)))
    calls = {"suggest": 0, "index": 0}
    real_close, real_index = difflib.get_close_matches, recipe_mod._key_index

    def close(*a, **k):
        calls["suggest"] += 1
        return real_close(*a, **k)

    def index(mapping, indexes):
        calls["index"] += id(mapping) not in indexes
        return real_index(mapping, indexes)

    monkeypatch.setattr(difflib, "get_close_matches", close)
    monkeypatch.setattr(recipe_mod, "_key_index", index)
    with pytest.raises(RecipeError) as ei:
        load_recipe(path)
    err = ei.value
    assert err.message.endswith(f"{n:,} errors in the recipe (the first {MAX_LISTED_ISSUES} listed)")
    assert len(err.issues) == MAX_LISTED_ISSUES + 1
    assert err.issues[0].path == "kee0" and err.issues[0].line == 3
    assert err.issues[-1].message == f"... and {n - MAX_LISTED_ISSUES:,} more errors (fix the ones above first)"
    assert calls["suggest"] <= MAX_LISTED_ISSUES and calls["index"] == 1


def test_a_typo_still_gets_its_suggestion():
    r = invoke("validate", QUICKSTART, "--set", "serve.maxx_model_len=5")
    assert r.exit_code == 2 and "did you mean 'max_model_len'?" in r.output


# ------------------------------------------------------------------------------------------- finding 8
def _st(d: Path) -> Path:
    return d / "model-00001-of-00001.safetensors"


def _config(d: Path, value) -> None:
    (d / "config.json").write_text(json.dumps(value))


def _edit(d: Path, **kv) -> None:
    _config(d, {**json.loads((d / "config.json").read_text()), **kv})


def _header(d: Path, header) -> None:
    raw = json.dumps(header).encode()
    _st(d).write_bytes(struct.pack("<Q", len(raw)) + raw)


def _replace(path: Path, make) -> None:
    path.unlink()
    make(path)


MALFORMED = {  # name -> (how the directory is broken, words the message must have)
    "config_list": (lambda d: _config(d, [1, 2]), "config.json must be a JSON object"),
    "config_string": (lambda d: _config(d, "llama"), "got a string"),
    "config_null": (lambda d: _config(d, None), "got null"),
    "config_not_json": (lambda d: (d / "config.json").write_text("{nope"), "config.json is not valid JSON"),
    "config_dir": (lambda d: _replace(d / "config.json", Path.mkdir), "a directory, not a regular file"),
    "config_fifo": (lambda d: _replace(d / "config.json", os.mkfifo), "a FIFO"),
    "architectures_5": (lambda d: _edit(d, architectures=5), "architectures must be a list"),
    "heads_string": (lambda d: _edit(d, num_attention_heads="9"), "num_attention_heads must be a whole number"),
    "hidden_float": (lambda d: _edit(d, hidden_size=576.5), "hidden_size must be a whole number"),
    "layers_negative": (lambda d: _edit(d, num_hidden_layers=-2), "num_hidden_layers must be between 1 and 10,000"),
    "layers_huge": (lambda d: _edit(d, num_hidden_layers=10**9), "num_hidden_layers must be between 1"),
    "vocab_zero": (lambda d: _edit(d, vocab_size=0), "vocab_size must be between 1"),
    "heads_not_dividing_hidden": (lambda d: _edit(d, num_attention_heads=7, head_dim=None), "do not divide hidden_size"),
    "kv_heads_not_dividing": (lambda d: _edit(d, num_key_value_heads=2), "key/value heads do not divide"),
    "text_config_list": (lambda d: _edit(d, text_config=[1]), "text_config must be a JSON object"),
    "tie_string": (lambda d: _edit(d, tie_word_embeddings="no"), "tie_word_embeddings must be true or false"),
    "header_list": (lambda d: _header(d, [1, 2, 3]), "the safetensors header must be a JSON object, got a list"),
    "header_no_offsets": (lambda d: _header(d, {"w": {"dtype": "BF16", "shape": [4]}}), "data_offsets"),
    "header_entry_string": (lambda d: _header(d, {"w": "x"}), "must be an object"),
    "header_shape_strings": (lambda d: _header(d, {"w": {"dtype": "BF16", "shape": ["a"], "data_offsets": [0, 2]}}),
                             "shape"),
    "header_length_huge": (lambda d: _st(d).write_bytes(struct.pack("<Q", 2**63) + b"{}"), "header length"),
    "header_truncated": (lambda d: _st(d).write_bytes(struct.pack("<Q", 1000) + b"{}"), "truncated"),
    "weights_dir": (lambda d: _replace(_st(d), Path.mkdir), "is a directory, not a weights file"),
    "weights_fifo": (lambda d: _replace(_st(d), os.mkfifo), "is a FIFO (named pipe), not a weights file"),
    "weights_symlink_loop": (lambda d: _replace(_st(d), lambda p: os.symlink(p.name, p)), "a symlink loop"),
    "index_list": (lambda d: (d / "model.safetensors.index.json").write_text("[1]"), "not a valid safetensors index"),
    "index_escapes": (lambda d: (d / "model.safetensors.index.json").write_text(
        json.dumps({"weight_map": {"w": "../../etc/passwd"}})), "names files outside the model directory"),
}


def _broken(tmp_path: Path, name: str) -> Path:
    d = layout_model(tmp_path / name, "smollm2-135m", shards=1)
    if not name.startswith("index"):  # one file found by its name, not through the index
        (d / "model.safetensors.index.json").unlink()
    MALFORMED[name][0](d)
    return d


@pytest.mark.parametrize("name", sorted(MALFORMED))
def test_malformed_model_directory_is_a_model_error(tmp_path, tmp_home, name):
    d = _broken(tmp_path, name)
    words = MALFORMED[name][1]
    with deadline(30), pytest.raises(ModelError) as ei:
        model_info(d)
    assert ei.value.exit_code == 2 and ei.value.message.startswith(f"model directory {d}")
    assert words in ei.value.message and ei.value.hint
    r = invoke("model", "info", str(d))
    assert r.exit_code == 2 and words in r.output and "internal error" not in r.output, r.output


@pytest.mark.parametrize("name", ["config_list", "layers_negative", "header_list", "weights_fifo", "weights_dir"])
def test_plan_and_quantize_check_refuse_a_malformed_model(tmp_path, tmp_home, name):
    d = _broken(tmp_path, name)
    recipe = tmp_path / "r.yaml"
    recipe.write_text(f"name: t\nmodel: {{source: '{d}'}}\nquantize: {{method: gptq, bits: 4, group_size: 64}}\n"
                      "serve: {max_model_len: 2048, cpu: {kv_cache_space_gib: 1}}\n")
    for args in (["plan", str(recipe)], ["quantize", str(recipe), "--check"]):
        r = invoke(*args)
        assert r.exit_code == 2 and MALFORMED[name][1] in r.output and "internal error" not in r.output, (args, r.output)


@pytest.mark.parametrize("name", ["config_list", "text_config_list", "config_fifo", "config_dir"])
def test_serving_a_malformed_original_model_is_refused(tmp_path, tmp_home, name):
    """Without a quantize section the original is served: its dtype and quantization are read from config.json,
    which must then be a readable JSON object (a FIFO there is not "no model here")."""
    d = _broken(tmp_path, name)
    recipe = tmp_path / "r.yaml"
    recipe.write_text(f"name: t\nmodel: {{source: '{d}'}}\nserve: {{max_model_len: 2048, cpu: {{kv_cache_space_gib: 1}}}}\n")
    for args in (["serve", str(recipe), "--dry-run"], ["serve", str(recipe), "--emit", "k8s"], ["plan", str(recipe)]):
        r = invoke(*args)
        assert r.exit_code == 2 and MALFORMED[name][1] in r.output and "internal error" not in r.output, (args, r.output)


def test_symlink_loop_as_the_model_directory(tmp_path):
    loop = tmp_path / "loop"
    os.symlink(loop.name, loop)
    with pytest.raises(UsageError) as ei:
        model_info(loop)
    assert "symlink" in ei.value.message


def test_read_regular_file_refuses_fifos_devices_and_large_files(tmp_path):
    fifo = tmp_path / "f"
    os.mkfifo(fifo)
    for path, words in ((fifo, "FIFO"), (Path("/dev/zero"), "character device"), (tmp_path, "directory")):
        with deadline(10), pytest.raises(OSError) as ei:
            read_regular_file(path, MAX_CONFIG_BYTES)
        assert words in ei.value.strerror
    big = tmp_path / "big"
    big.write_bytes(b"x" * 101)
    with pytest.raises(OSError) as ei:
        read_regular_file(big, 100)
    assert "larger than 100 bytes" in ei.value.strerror
    assert read_regular_file(big, 101) == b"x" * 101
