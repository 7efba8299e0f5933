"""Issue 15, deliver 2: a seeded fuzz over recipes, `--set` overrides and model directories.

Every case must end in exit 0, 1 or 2 with at most one error message: never an "internal error", a
traceback or a hang. The generator is seeded and the number of cases fixed (no time budget): the same
cases run on every machine. Commands run in-process through Typer's CliRunner (about 30 ms a case), each
under a SIGALRM deadline that turns a hang into a failure; a few run as real subprocesses. The counts by
outcome are printed (see them with -s) and kept in <pytest tmp dir>/fuzz-counts.json.
"""

from __future__ import annotations

import copy
import json
import os
import random
import signal
import struct
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from infertool.cli import app
from tests.fakes import layout_model

ROOT = Path(__file__).resolve().parents[1]
RECIPES = sorted((ROOT / "recipes").glob("*.yaml"))
SEED = 15
N_RECIPES, N_OVERRIDES, N_MODELS, N_SUBPROCESS = 300, 200, 150, 4
CASE_DEADLINE_S = 20  # a case that takes this long is a hang (they take ~30 ms)

runner = CliRunner()


# ------------------------------------------------------------------------------------------ hostile values
def hostile_value(rng: random.Random, depth: int = 0):
    """A value of the wrong type, out of range, huge, non-finite, long, or with control characters."""
    scalars = 5
    choices = [
        lambda: rng.choice([True, False, None]),
        lambda: rng.choice([0, -1, -2, 1, 2**31, 2**62, 2**63, -(2**63), 10**18, 10**30, 10**400]),
        lambda: rng.choice([0.0, -0.5, 1e-300, 1e308, -1e308, float("inf"), float("-inf"), float("nan"), 0.5, 2.5]),
        lambda: "x" * rng.choice([0, 1, 201, 5000, 100_000]),
        lambda: rng.choice(["a\nb", "x\r\ny", "\t", "\x00", "\x1b[31mred", "a\u2028b", "\x85", "[bold]x[/]", "[/]",
                            "../../../etc", "~root", "$HOME", "`id`", "; rm -rf /", "--trust-remote-code", "http://",
                            "1e999", ".inf", "yes", "0x10", "1_000", "-", "*", "&a", "!!python/object", "\u202e"]),
        lambda: [hostile_value(rng, depth + 1) for _ in range(rng.choice([0, 1, 3, 70]))],
        lambda: {rng.choice(["x", "", "1", "method", "a" * 300]): hostile_value(rng, depth + 1)},
        lambda: nested(rng.choice([20, 60, 200])),
        lambda: list(range(rng.choice([65, 1000]))),
    ]
    return rng.choice(choices if depth == 0 else choices[:scalars])()


def nested(depth: int):
    value: object = 1
    for i in range(depth):
        value = [value] if i % 2 else {"k": value}
    return value


def paths(data, prefix=()):
    """Every (path, value) in a recipe's data, mappings and lists alike."""
    yield prefix, data
    if isinstance(data, dict):
        for k, v in data.items():
            yield from paths(v, prefix + (k,))
    elif isinstance(data, list):
        for i, v in enumerate(data):
            yield from paths(v, prefix + (i,))


def mutate_data(rng: random.Random, data: dict) -> dict:
    data = copy.deepcopy(data)
    for _ in range(rng.choice([1, 1, 2, 3])):
        spots = [p for p, _ in paths(data) if p]
        path = rng.choice(spots)
        parent = data
        for part in path[:-1]:
            parent = parent[part]
        how = rng.random()
        if how < 0.7:
            parent[path[-1]] = hostile_value(rng)
        elif how < 0.8 and isinstance(parent, dict):
            del parent[path[-1]]
        elif isinstance(parent, dict):
            parent[rng.choice(["unknown_key", str(path[-1]) + "x", "x" * 500, "", "<<"])] = hostile_value(rng)
        else:
            parent.append(hostile_value(rng))
    return data


TEXT_BOMBS = [
    "!!python/object/apply:os.system ['echo pwned']",
    "!!python/name:os.system",
    "!!binary aGVsbG8=",
    "!!set {a, b}",
    "!!timestamp 2026-01-01",
    "!custom x",
    "&a [*a]",
    "{<<: [1]}",
    "[" * 5000 + "]" * 5000,
    "{" * 3000,
    "'unterminated",
    "- a\n  - b: c",
    "\t\tx",
    "\x07",
]


def mutate_text(rng: random.Random, text: str) -> str | bytes:
    """Textual damage YAML data cannot express: tags, anchors, bad syntax, bad bytes."""
    lines = text.splitlines()
    how = rng.randrange(7)
    if how == 0:  # a YAML tag / anchor / bomb as some key's value
        i = rng.randrange(len(lines))
        if ":" in lines[i]:
            key = lines[i].split(":", 1)[0]
            lines[i] = f"{key}: {rng.choice(TEXT_BOMBS)}"
        return "\n".join(lines) + "\n"
    if how == 1:  # an alias bomb
        bomb = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"] + [
            f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]" for i in range(1, 9)]
        return text + "\n".join(bomb) + "\n"
    if how == 2:  # a duplicate key
        return text + lines[rng.randrange(len(lines))] + "\n"
    if how == 3:  # bad bytes
        raw = text.encode()
        at = rng.randrange(len(raw))
        return raw[:at] + rng.choice([b"\xff\xfe", b"\x00", b"\xc3", b"\xef\xbb\xbf"]) + raw[at:]
    if how == 4:  # cut short
        return text[: rng.randrange(len(text))]
    if how == 5:  # a merge key from an anchor
        return "base: &b {port: 1}\n" + text.replace("serve:\n", "serve:\n  <<: *b\n", 1)
    return "\n".join(lines[: rng.randrange(len(lines))]) + "\n" + "  " * rng.randrange(8) + "x: [1, {y: 2}]\n"


def dump(data) -> str:
    try:
        return yaml.safe_dump(data, sort_keys=False, allow_unicode=True)
    except (yaml.YAMLError, RecursionError):
        return json.dumps(data, default=str)


# ------------------------------------------------------------------------------------------ overrides
def field_paths() -> list[str]:
    from infertool.recipe import Recipe
    from infertool.recipe_docs import _models

    out = []

    def walk(model, prefix):
        for name, field in model.model_fields.items():
            path = f"{prefix}{name}"
            out.append(path)
            subs = [m for m in _models(field.annotation) if m is not model] if prefix.count(".") < 3 else []
            for sub in subs[:1]:
                walk(sub, path + ".")

    walk(Recipe, "")
    return out


OVERRIDE_VALUES = ["1e999", ".inf", ".nan", "-1", "0", "true", "yes", "null", "~", "[]", "{}", "[[[[", "{a: *b}",
                   "!!python/name:os.system", "!!binary aGk=", "&a [*a]", "'x'", '"a\\nb"', '"\\x00"', "x" * 5000,
                   "9" * 5000, "2e308", "-2e308", "[1, 2, 3]", "[1000000000]", "{method: gptq}", "{method: nope}",
                   "-- --", "%", "@x", "`x`", "|\n  multi", "[bold]", "[/]", "\u2028", "0o777", "0x7fffffffffffffff"]
OVERRIDE_KEYS = ["", ".", "a..b", " serve.port", "serve.port ", "serve. port", "x" * 300, "serve.port.x",
                 "profile.batch.0", "quantize.method.x", "name.x", "serve.env.A B", "serve.env.1", "é.ü", "__class__",
                 "model.__dict__", "serve.cpu.kv_cache_space_gib.x"]


def override_case(rng: random.Random, keys: list[str]) -> list[str]:
    sets = []
    for _ in range(rng.choice([1, 1, 2, 3])):
        key = rng.choice(keys) if rng.random() < 0.85 else rng.choice(OVERRIDE_KEYS)
        value = rng.choice(OVERRIDE_VALUES) if rng.random() < 0.6 else dump(hostile_value(rng)).strip()
        sets += ["--set", f"{key}={value}" if rng.random() < 0.95 else key]
    return sets


# ------------------------------------------------------------------------------------------ model directories
CONFIG_KEYS = ["num_hidden_layers", "hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim",
               "vocab_size", "intermediate_size", "max_position_embeddings", "architectures", "model_type",
               "tie_word_embeddings", "text_config", "quantization_config", "rope_scaling", "dtype",
               "num_local_experts", "num_experts_per_tok", "model_max_length"]


def json_value(rng: random.Random):
    v = hostile_value(rng)
    return v if not isinstance(v, int) or abs(v) < 10**300 else float("inf")


def _make(kind: str, path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        import shutil

        shutil.rmtree(path)
    elif os.path.lexists(path):
        path.unlink()
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "dir":
        path.mkdir()
    elif kind == "loop":
        os.symlink(path.name, path)
    elif kind == "dangling":
        os.symlink("does-not-exist", path)
    elif kind == "devzero":
        os.symlink("/dev/zero", path)
    elif kind == "empty":
        path.write_bytes(b"")


def break_model(rng: random.Random, d: Path) -> str:
    """Damage one thing in a model directory; returns what was done. A file already broken (by an earlier
    call) gets a file-kind change instead of an edit."""
    try:
        return _break_model(rng, d)
    except (ValueError, KeyError, IndexError, TypeError, AttributeError, struct.error, OSError, RecursionError):
        target = rng.choice([d / "config.json", d / "tokenizer_config.json", d / "model.safetensors.index.json"])
        _make("empty", target)
        return f"{target.name} emptied"


def _regular(path: Path) -> bool:
    return path.is_file() and not path.is_symlink()


def _replace_head(f: Path, head: bytes, keep_from: int) -> None:
    """``f`` becomes ``head`` + its bytes from ``keep_from`` on, the bytes that ``read_bytes()`` and a slice
    would write, copying only the data regions of the sparse file (its hole of hundreds of MB stays a hole)."""
    size = f.stat().st_size
    regions: list[tuple[int, bytes]] = []
    with open(f, "rb") as fh:
        at = keep_from
        while at < size:
            try:
                start = os.lseek(fh.fileno(), at, os.SEEK_DATA)
            except OSError:  # ENXIO: only a hole from here on
                break
            end = os.lseek(fh.fileno(), start, os.SEEK_HOLE)
            fh.seek(start)
            regions.append((start, fh.read(end - start)))
            at = end
    with open(f, "wb") as fh:
        fh.write(head)
        for start, data in regions:
            fh.seek(len(head) + start - keep_from)
            fh.write(data)
        fh.truncate(len(head) + max(0, size - keep_from))


def _break_model(rng: random.Random, d: Path) -> str:
    cfg_path = d / "config.json"
    weights = [f for f in sorted(d.glob("*.safetensors")) if _regular(f)]
    if not _regular(cfg_path) or not weights:
        raise ValueError("already broken")
    how = rng.randrange(6)
    if how == 0:  # a config key
        cfg = json.loads(cfg_path.read_text())
        key = rng.choice(CONFIG_KEYS)
        if rng.random() < 0.2:
            cfg.pop(key, None)
        else:
            cfg[key] = json_value(rng)
        cfg_path.write_text(json.dumps(cfg, allow_nan=True))
        return f"config {key}"
    if how == 1:  # the whole config
        cfg_path.write_text(rng.choice([json.dumps(json_value(rng), allow_nan=True), "{", "", "\ufeff{}", "[" * 100000]))
        return "config replaced"
    if how == 2:  # a header entry
        f = rng.choice(weights)
        with open(f, "rb") as fh:
            n = struct.unpack("<Q", fh.read(8))[0]
            header = json.loads(fh.read(max(0, min(n, f.stat().st_size - 8))))
        name = rng.choice(list(header))
        entry = header[name]
        field = rng.choice(["dtype", "shape", "data_offsets", None])
        if field is None:
            header[name] = json_value(rng)
        elif rng.random() < 0.3:
            entry.pop(field, None)
        else:
            entry[field] = rng.choice([json_value(rng), [-1, 5], [10, 2], [0, 2**70], [2**64, 2**64 + 2], ["0", "2"]])
        new = json.dumps(header, allow_nan=True).encode()
        _replace_head(f, struct.pack("<Q", len(new)) + new, 8 + n)
        return f"header entry {field}"
    if how == 3:  # the whole header or its length
        f = rng.choice(weights)
        body = rng.choice([json.dumps(json_value(rng), allow_nan=True).encode(), b"{", b"\xff\xfe", b""])
        length = rng.choice([len(body), 0, 2**64 - 1, 100 * 1024 * 1024 + 1, len(body) + 50])
        f.write_bytes(struct.pack("<Q", length) + body)
        return "header replaced"
    if how == 4:  # a file of the wrong kind
        target = rng.choice([cfg_path, rng.choice(weights), d / "model.safetensors.index.json", d / "tokenizer_config.json"])
        kind = rng.choice(["fifo", "dir", "loop", "dangling", "devzero", "empty"])
        _make(kind, target)
        return f"{target.name} as {kind}"
    index = d / "model.safetensors.index.json"  # the index
    if _regular(index):
        data = json.loads(index.read_text())
        if rng.random() < 0.5:
            data["weight_map"] = json_value(rng)
        else:
            data["weight_map"][rng.choice(list(data["weight_map"]))] = rng.choice(
                ["../../etc/passwd", "/etc/passwd", "missing.safetensors", "", ".", "..", "config.json"])
        index.write_text(json.dumps(data, allow_nan=True))
        return "index"
    (d / "tokenizer_config.json").write_text(json.dumps(json_value(rng), allow_nan=True))
    return "tokenizer_config"


# ------------------------------------------------------------------------------------------ running one case
class Hang(Exception):
    pass


def _expired(*_):
    raise Hang(f"no answer after {CASE_DEADLINE_S} s")


def outcome(args: list[str]) -> tuple[str, str]:
    """('exit N' | 'FAIL: why', the output)."""
    signal.signal(signal.SIGALRM, _expired)
    signal.alarm(CASE_DEADLINE_S)
    try:
        r = runner.invoke(app, args)
    except Hang as e:
        return f"FAIL: hang ({e})", ""
    finally:
        signal.alarm(0)
    out = r.output or ""
    if isinstance(r.exception, Hang):
        return "FAIL: hang", out
    return judge(r.exit_code, out, r.exception)


def judge(code: int, out: str, exception: BaseException | None = None) -> tuple[str, str]:
    if exception is not None and not isinstance(exception, SystemExit):
        return f"FAIL: {type(exception).__name__}: {exception}"[:300], out
    if "internal error" in out or "Traceback (most recent call last)" in out:
        return "FAIL: internal error", out
    if code not in (0, 1, 2):
        return f"FAIL: exit {code}", out
    errors = [line for line in out.splitlines() if line.startswith("error:")]
    # the recipe checks' one message lists its findings, each a line of its own ("error: CHECK: FIELD: ...")
    if len(errors) > 1 and not errors[0].startswith("error: the recipe checks found"):
        return "FAIL: more than one error message", out
    if code == 2 and "error" not in out.lower() and "usage:" not in out.lower():
        return "FAIL: exit 2 without a message", out
    return f"exit {code}", out


# ------------------------------------------------------------------------------------------ the test
def test_fuzz_recipes_overrides_and_model_directories(tmp_path, tmp_home, monkeypatch):
    monkeypatch.delenv("INFERTOOL_DEBUG", raising=False)
    monkeypatch.setenv("INFERTOOL_API_KEY", "fuzz-key")
    rng = random.Random(SEED)
    counts: dict[str, Counter] = {"recipes": Counter(), "overrides": Counter(), "models": Counter(),
                                  "subprocess": Counter()}
    failures: list[dict] = []
    passed_models: list[str] = []  # damaged model directories a command accepted (a damage it does not read)
    commands = [["validate"], ["plan"], ["serve", "--dry-run"]]

    def record(group: str, case: str, args: list[str], result: tuple[str, str]) -> None:
        verdict, out = result
        counts[group][verdict.split(":")[0] if verdict.startswith("FAIL") else verdict] += 1
        if group == "models" and verdict == "exit 0":
            passed_models.append(f"{case} | {' '.join(args[:1] + args[2:])}")
        if verdict.startswith("FAIL"):
            failures.append({"group": group, "case": case, "args": [a[:200] for a in args], "verdict": verdict,
                             "output": out[-600:]})

    originals = [(p, p.read_text(), yaml.safe_load(p.read_text())) for p in RECIPES]
    for i in range(N_RECIPES):
        path, text, data = rng.choice(originals)
        f = tmp_path / f"r{i}.yaml"
        if rng.random() < 0.65:
            content: str | bytes = dump(mutate_data(rng, data))
        else:
            content = mutate_text(rng, text)
        f.write_bytes(content if isinstance(content, bytes) else content.encode("utf-8", "surrogatepass"))
        args = rng.choice(commands)
        args = [args[0], str(f), *args[1:]]
        record("recipes", f"{path.name} #{i}", args, outcome(args))

    keys = field_paths()
    for i in range(N_OVERRIDES):
        path = rng.choice(RECIPES)
        args = rng.choice(commands)
        args = [args[0], str(path), *args[1:], *override_case(rng, keys)]
        record("overrides", f"{path.name} #{i}", args, outcome(args))

    for i in range(N_MODELS):
        d = layout_model(tmp_path / f"m{i}", "smollm2-135m", shards=rng.choice([1, 2]))
        what = break_model(rng, d)
        if rng.random() < 0.3:
            what += " + " + break_model(rng, d)
        recipe = tmp_path / f"m{i}.yaml"
        quantize = "quantize: {method: gptq, bits: 4, group_size: 64}\n" if rng.random() < 0.5 else ""  # or serve it
        recipe.write_text(f"name: fuzz\nmodel: {{source: {json.dumps(str(d))}}}\n{quantize}"
                          "serve: {max_model_len: 2048, cpu: {kv_cache_space_gib: 1}}\n")
        second = rng.choice([["plan", str(recipe)], ["serve", str(recipe), "--dry-run"]]
                            + ([["quantize", str(recipe), "--check"]] if quantize else []))
        for args in (["model", "info", str(d)], second):
            record("models", f"m{i}: {what}", args, outcome(args))

    # a few real processes: the exit code and the stderr of the real entry point
    for i in range(N_SUBPROCESS):
        f = tmp_path / f"r{i}.yaml"
        args = ["validate", str(f)] if i % 2 == 0 else ["model", "info", str(tmp_path / f"m{i}")]
        env = {k: v for k, v in os.environ.items() if k != "INFERTOOL_DEBUG"}
        try:
            p = subprocess.run([sys.executable, "-m", "infertool", *args], capture_output=True, text=True,
                               timeout=120, env=env, stdin=subprocess.DEVNULL)
            result = judge(p.returncode, p.stdout + p.stderr)
        except subprocess.TimeoutExpired:
            result = ("FAIL: hang (subprocess)", "")
        record("subprocess", f"#{i}", args, result)

    summary = {"seed": SEED, "counts": {g: dict(sorted(c.items())) for g, c in counts.items()},
               "cases": sum(sum(c.values()) for c in counts.values()), "failures": failures,
               "models_exit_0": passed_models}
    (tmp_path / "fuzz-counts.json").write_text(json.dumps(summary, indent=1))
    print(f"\nfuzz (seed {SEED}): {summary['cases']} cases; "
          + "; ".join(f"{g}: " + ", ".join(f"{k} x{v}" for k, v in sorted(c.items())) for g, c in counts.items())
          + f"; counts kept in {tmp_path / 'fuzz-counts.json'}")
    for fail in failures[:20]:
        print("  ", json.dumps(fail)[:800])
    assert not failures, f"{len(failures)} of {summary['cases']} fuzz cases failed: " + json.dumps(failures[:5], indent=1)
