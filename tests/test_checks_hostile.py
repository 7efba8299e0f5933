"""Issue 25, findings 6, 9, 10 and 11, through the real CLI (a subprocess, as a user runs it): flags and variables
that load code need serve.allow_code; every CLI number is bounded; cross-field checks (bench lengths against
max_model_len, pipeline stages against layers, reserved CPUs against cores, absurdly small values) are seen by
validate, plan and the dry runs; safetensors headers are checked before use; a big GGUF is fingerprinted by
sampling. Each case asserts the exit code and the words of the message; no traceback, no internal error."""

from __future__ import annotations

import hashlib
import json
import os
import struct
from pathlib import Path

import pytest

from conftest import cli_in_process, run_cli
from fakes import layout_model

TIMEOUT = 120  # every CLI run here is a second or two; the bound only stops a hang


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    """A 2-layer model shaped like SmolLM2 (9 heads, hidden 576, sparse weights) and a recipe for it."""
    root = tmp_path_factory.mktemp("checks")
    layout_model(root / "m2", "smollm2-135m", shards=1, num_hidden_layers=2)
    (root / "r.yaml").write_text(
        "name: r\n"
        f"model: {{source: {root / 'm2'}}}\n"
        "serve: {max_model_len: 512, port: 18931, cpu: {kv_cache_space_gib: 1}}\n"
        "bench: {output_len: 64, requests: 4, concurrency: [1], prompt: {source: builtin, len: 128}}\n")
    return root


def cli(work: Path, *args: str):
    """The CLI in process (70-odd cases: no Python start-up each); `test_the_real_cli_in_a_subprocess` runs it as a
    user does."""
    r = cli_in_process(*args, env={"INFERTOOL_HOME": str(work / "home")})
    both = r.stdout + r.stderr
    assert "internal error" not in both and "Traceback" not in both, both
    return r.returncode, both


def recipe(work: Path) -> str:
    return str(work / "r.yaml")


# ------------------------------------------------------------------------------- 6: code loading
CODE_ARGS = [  # (argument, the flag it spells)
    ("--middleware=evil:app", "--middleware"),
    ("--middle", "--middleware"),  # an abbreviation argparse accepts
    ("--tool-parser-plugin=/tmp/p.py", "--tool-parser-plugin"),
    ("--reasoning-parser-plugin", "--reasoning-parser-plugin"),
    ("--worker_extension_cls=m.C", "--worker-extension-cls"),  # the underscore spelling
    ("--worker-cls", "--worker-cls"),
    ("--LOGITS-PROCESSORS", "--logits-processors"),
    ("--kv-transfer-config.kv_connector_module_path=evil", "--kv-transfer-config"),  # vLLM's --json-arg.key
    ("--config=more-flags.yaml", "--config"),
    ("--allowed-local-media-path=/", "--allowed-local-media-path"),
]


@pytest.mark.parametrize("arg,flag", CODE_ARGS, ids=[a for a, _ in CODE_ARGS])
def test_code_loading_flag_refused_by_validate(work, arg, flag):
    rc, out = cli(work, "validate", recipe(work), "--set", f"serve.extra_args=[{json.dumps(arg)}]")
    assert rc == 2
    assert "serve.extra_args" in out and flag in out and f"serve.allow_code: [{flag}]" in out


@pytest.mark.parametrize("name", ["LD_PRELOAD", "LD_LIBRARY_PATH", "PYTHONPATH", "PYTHONSTARTUP", "PYTHONHOME",
                                  "VLLM_PLUGINS", "PATH"])
def test_code_loading_env_refused_by_validate(work, name):
    rc, out = cli(work, "validate", recipe(work), "--set", f"serve.env={{{name}: /tmp/x}}")
    assert rc == 2
    assert f"serve.env.{name}" in out and f"serve.allow_code: [{name}]" in out


@pytest.mark.parametrize("command", [["serve", "--dry-run"], ["serve", "--emit", "k8s"], ["run", "--dry-run"],
                                     ["plan"]])
def test_code_loading_refused_by_every_command(work, command):
    rc, out = cli(work, command[0], recipe(work), *command[1:], "--set", "serve.extra_args=[--middleware, evil:app]",
                  "--set", "serve.env={LD_PRELOAD: /tmp/evil.so}")
    assert rc == 2 and "serve.extra_args" in out and "--middleware" in out
    assert "evil:app" not in out.split("extra_args[0]")[0]  # no launch line was printed before the refusal


@pytest.mark.parametrize("command", [["serve", "--dry-run"], ["run", "--dry-run"]])
def test_allowed_code_is_said_on_screen(work, command):
    rc, out = cli(work, command[0], recipe(work), *command[1:], "--set", "serve.extra_args=[--middleware, m:app]",
                  "--set", "serve.env={PYTHONPATH: /opt/plugins}", "--set", "serve.allow_code=[--middleware, PYTHONPATH]")
    assert rc == 0, out
    assert "warning" in out and "--middleware imports its value" in out and "PYTHONPATH puts its directories" in out
    assert "allowed by serve.allow_code" in out


def test_allow_code_names_exact_flags(work):
    rc, out = cli(work, "validate", recipe(work), "--set", "serve.allow_code=[--middle]")
    assert rc == 2 and "serve.allow_code" in out and "not a flag or variable that loads code" in out


@pytest.mark.parametrize("arg", ["--reasoning-parser=deepseek_r1", "--chat-template=/tmp/t.jinja", "--max-logprobs=20"])
def test_plain_flags_pass(work, arg):
    rc, out = cli(work, "validate", recipe(work), "--set", f"serve.extra_args=[{json.dumps(arg)}]")
    assert rc == 0, out


# ------------------------------------------------------------------------------- 9: CLI numbers
NUMBERS = [  # (command line after the recipe, the option named in the refusal)
    (["plan", "--context", "99999999999999999999"], "--context"),
    (["plan", "--context", "9" * 400], "--context"),
    (["plan", "--context", "0"], "--context"),
    (["plan", "--memory", "nan"], "--memory"),
    (["plan", "--memory", "inf"], "--memory"),
    (["plan", "--memory", "1e400"], "--memory"),
    (["eval", "run", "--max-items", "99999999999"], "--max-items"),
    (["profile", "--decode-len", "99999999999"], "--decode-len"),
    (["profile", "--batch", "1,99999999999999999999"], "--batch"),
    (["profile", "--prompt-len", "1," + "9" * 5000], "--prompt-len"),
]


@pytest.mark.parametrize("args,option", NUMBERS, ids=[" ".join(a)[:40] for a, _ in NUMBERS])
def test_cli_numbers_bounded(work, args, option):
    words = args[:2] if args[0] == "eval" else args[:1]
    rc, out = cli(work, *words, recipe(work), *args[len(words):])
    assert rc == 2 and option in out, out
    assert "fits" not in out


def test_model_import_layers_bounded(work):
    rc, out = cli(work, "model", "import", "bundled:smollm2-135m", str(work / "imported"), "--layers", "99999999999")
    assert rc == 2 and "--layers" in out
    assert not (work / "imported").exists()


# ------------------------------------------------------------------------------- 11: cross-field checks
@pytest.mark.parametrize("command", [["validate"], ["plan"], ["serve", "--dry-run"], ["run", "--dry-run"]])
def test_bench_lengths_against_max_model_len(work, command):
    rc, out = cli(work, command[0], recipe(work), *command[1:], "--set", "bench.output_len=10000000")
    assert rc == 2
    assert "bench.output_len" in out and "10,000,128 tokens" in out and "serve.max_model_len 512" in out


def test_output_spread_counts(work):
    # 128 prompt + 400 x 1.5 = 728 > 512: the longest request of the spread is refused, not the mean one
    rc, out = cli(work, "validate", recipe(work), "--set", "bench.output_len=300", "--set", "bench.output_len_spread=0.5")
    assert rc == 2 and "600 tokens" not in out and "578 tokens" in out


def test_tune_grid_lengths(work):
    rc, out = cli(work, "validate", recipe(work), "--set", "serve.max_model_len=null", "--set",
                  "tune={candidates: [none], serve_grid: {max_model_len: [4096, 128]}, objective: goodput, "
                  "slo: {ttft_ms: 1000}}")
    assert rc == 2 and "tune.serve_grid.max_model_len[1]" in out and "192 tokens" in out


# a recipe check (infertool.checks): exit 2 in every entry point, plan included
@pytest.mark.parametrize("command,code", [(["validate"], 2), (["plan"], 2), (["serve", "--dry-run"], 2), (["run", "--dry-run"], 2)])
def test_pipeline_stages_against_layers(work, command, code):
    rc, out = cli(work, command[0], recipe(work), *command[1:], "--set", "serve.pipeline_parallel_size=3")
    assert rc == code
    assert "pipeline_parallel_size 3 exceeds the" in out and "2 layers" in out


def test_pipeline_stages_against_recipe_layers(work):
    rc, out = cli(work, "validate", recipe(work), "--set", "model.layers=2", "--set", "serve.pipeline_parallel_size=1024")
    assert rc == 2 and "serve.pipeline_parallel_size" in out and "model's 2 layers" in out


# a recipe check (infertool.checks): exit 2 in every entry point, plan included
@pytest.mark.parametrize("command,code", [(["validate"], 2), (["plan"], 2), (["serve", "--dry-run"], 2), (["run", "--dry-run"], 2)])
def test_reserved_cpus_against_cores(work, command, code):
    rc, out = cli(work, command[0], recipe(work), *command[1:], "--set", "serve.cpu.reserved_cpus=1024")
    assert rc == code
    assert "reserved_cpus 1024" in out and f"this host's {len(os.sched_getaffinity(0))} usable cores" in out


def test_run_dry_run_json_says_not_ok(work):
    rc, out = cli(work, "run", recipe(work), "--dry-run", "--json", "--set", "serve.pipeline_parallel_size=3")
    assert rc == 2 and json.loads(out[:out.rindex("}") + 1])["ok"] is False


TINY = [("quantize.damp_percent", "quantize={method: gptq, bits: 4, group_size: 64, damp_percent: 5e-324}"),
        ("bench.rate[0]", "bench.rate=[5e-324]"), ("serve.startup_timeout_s", "serve.startup_timeout_s=5e-324"),
        ("bench.max_duration_s", "bench.max_duration_s=5e-324"), ("bench.slo.ttft_ms", "bench.slo={ttft_ms: 5e-324}"),
        ("serve.gpu_memory_utilization", "serve.gpu_memory_utilization=5e-324"),
        ("serve.cpu.kv_cache_space_gib", "serve.cpu.kv_cache_space_gib=5e-324")]


@pytest.mark.parametrize("path,setting", TINY, ids=[p for p, _ in TINY])
def test_absurdly_small_values(work, path, setting):
    rc, out = cli(work, "validate", recipe(work), "--set", setting)
    assert rc == 2 and path in out and "greater than or equal to" in out


# ------------------------------------------------------------------------------- 10: model headers
def _weights(d: Path) -> Path:
    return d / "model-00001-of-00001.safetensors"


def _rewrite(d: Path, edit) -> None:
    """Rewrite the weights file's header through ``edit(header)``; the data stays a sparse hole of its size."""
    f = _weights(d)
    raw = f.read_bytes()[:8 + 200_000]
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    data = f.stat().st_size - 8 - n
    edit(header)
    new = json.dumps(header).encode()
    new += b" " * (-len(new) % 8)
    with open(f, "wb") as out:
        out.write(struct.pack("<Q", len(new)) + new)
        out.truncate(8 + len(new) + data)


def _first(header: dict) -> dict:
    return header[next(k for k in header if k != "__metadata__")]


def _overlap(h: dict) -> None:
    names = [k for k in h if k != "__metadata__"]
    a, b = h[names[0]], h[names[1]]
    size = b["data_offsets"][1] - b["data_offsets"][0]
    b["data_offsets"] = [a["data_offsets"][0], a["data_offsets"][0] + size]


HEADERS = {  # name -> (the edit, the words of the refusal)
    "offsets_10e400": (lambda h: _first(h).update(data_offsets=[0, 10**400]), "past the end of the file's data"),
    "offsets_past_end": (lambda h: _first(h).update(data_offsets=[10**12, 10**12 + 2 * 49152 * 576]),
                         "past the end of the file's data"),
    "overlap": (_overlap, "overlap"),
    "unknown_dtype": (lambda h: _first(h).update(dtype="Q4_K"), "unknown dtype \"Q4_K\""),
    "bytes_not_shape": (lambda h: _first(h).update(shape=[7]), "needs 14"),
    "huge_shape": (lambda h: _first(h).update(shape=[10**400] * 3), "far larger than any file"),
    "no_tensors": (lambda h: [h.pop(k) for k in list(h) if k != "__metadata__"], "hold no tensors"),
}


@pytest.fixture
def model_copy(tmp_path) -> Path:
    return layout_model(tmp_path / "m", "smollm2-135m", shards=1, num_hidden_layers=2)


@pytest.mark.parametrize("name", list(HEADERS))
def test_safetensors_header_refused(work, model_copy, name):
    (model_copy / "model.safetensors.index.json").unlink()
    edit, words = HEADERS[name]
    _rewrite(model_copy, edit)
    rc, out = cli(work, "model", "info", str(model_copy))
    assert rc == 2 and words in out, out
    assert "model-00001-of-00001.safetensors" in out
    rc, out = cli(work, "plan", recipe(work), "--set", f"model.source={model_copy}")
    assert rc == 2 and words in out and "fits" not in out


@pytest.mark.parametrize("edit,words", [
    ({"head_dim": 65536}, "q_proj.weight\" has 576 rows, but config.json says num_attention_heads x head_dim = 589,824"),
    ({"num_key_value_heads": 9}, "k_proj.weight\" has 192 rows, but config.json says num_key_value_heads x head_dim"),
    ({"hidden_size": 256, "head_dim": 64}, "has 576 columns, but config.json says hidden_size 256"),
])
def test_config_against_tensor_shapes(work, model_copy, edit, words):
    cfg = json.loads((model_copy / "config.json").read_text())
    (model_copy / "config.json").write_text(json.dumps({**cfg, **edit}))
    rc, out = cli(work, "model", "info", str(model_copy))
    assert rc == 2 and words in out and "model-00001-of-00001.safetensors" in out, out
    rc, out = cli(work, "plan", recipe(work), "--set", f"model.source={model_copy}")
    assert rc == 2 and "config.json does not describe these weights" in out and "fits" not in out


def test_sound_model_still_reads(work):
    rc, out = cli(work, "model", "info", str(work / "m2"))
    assert rc == 0 and "2" in out


# ------------------------------------------------------------------------------- 10: big files sampled
def test_small_files_keep_their_plain_sha256(tmp_path):
    from infertool.data.fingerprint import content_sha256, model_identity

    f = tmp_path / "small.gguf"
    f.write_bytes(os.urandom(3 * 1024 * 1024))
    plain = hashlib.sha256(f.read_bytes()).hexdigest()
    assert content_sha256(f) == plain  # the cache keys of existing (small) conversions stay what they were
    assert model_identity(f)["sha256"] == plain and "sampled" not in model_identity(f)


def test_big_file_sampled_and_sensitive(tmp_path):
    from infertool.data.fingerprint import BIG_SAMPLES, WHOLE_FILE, content_sha256, model_identity
    from infertool.inputs import EDGE_BYTES

    f = tmp_path / "big.gguf"
    size = 2 * WHOLE_FILE + 12345
    with open(f, "wb") as out:
        out.truncate(size)  # sparse: no disk blocks
    first = content_sha256(f)
    assert model_identity(f)["sampled"] is True and model_identity(f)["sha256"] == first
    step = (size - 64 * 1024) // (BIG_SAMPLES - 1)
    seen = {first}
    for where in (0, EDGE_BYTES - 1, 7 * step + 5, size - 1):  # the head, a sampled block, the tail
        with open(f, "r+b") as out:
            out.seek(where)
            out.write(b"x")
        seen.add(content_sha256(f))
    assert len(seen) == 5  # each change made a new identity
    with open(f, "r+b") as out:
        out.truncate(size + 1)
    assert content_sha256(f) not in seen  # the size is part of it


def test_big_gguf_source_planned_without_hashing_it_whole(work, tmp_path):
    gguf = tmp_path / "big.gguf"
    with open(gguf, "wb") as out:
        out.truncate(8 * 1024**3)  # 8 GiB, sparse: hashed whole it took ~20 s before any message
    r = tmp_path / "g.yaml"
    r.write_text(f"name: g\nmodel: {{source: {gguf}}}\nserve: {{max_model_len: 512}}\n")
    rc, out = cli(work, "run", str(r), "--dry-run")
    assert rc == 0 and "serve:" in out, out
    memo = json.loads((work / "home" / "models" / "hashes.json").read_text())
    assert any(k.startswith(str(gguf.resolve()) + ":") for k in memo)


def test_the_real_cli_in_a_subprocess(work):
    """One case of each kind as a user runs it: a code-loading flag and an unbounded number, exit 2 and the message."""
    r = run_cli("validate", recipe(work), "--set", "serve.extra_args=[--middleware, evil:app]",
                env={"INFERTOOL_HOME": str(work / "home")}, timeout=TIMEOUT)
    assert r.returncode == 2 and "serve.allow_code" in " ".join(r.stderr.split()), r.stderr
    r = run_cli("plan", recipe(work), "--context", "9" * 400, env={"INFERTOOL_HOME": str(work / "home")}, timeout=TIMEOUT)
    assert r.returncode == 2 and "--context" in r.stderr and "Traceback" not in r.stderr, r.stderr
