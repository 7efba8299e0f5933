"""The artifact `run` and `tune` ship: the evaluated checkpoint published with its card (a real copy, the same
content fingerprint), `infertool publish` to a folder (real) and to S3 / a hub (dry runs: the exact calls), and
`infertool serve RUN_DIR | RECIPE` serving exactly that checkpoint (another one at the path is refused).

Runs use stand-in stage bodies (tests/test_pipeline.py's way) whose quantize writes a tiny real checkpoint
(config.json + a small safetensors file), through the CLI in process."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from infertool import publish, stages
from infertool.errors import UsageError
from tests.conftest import cli_in_process
from tests.fakes import write_safetensors
from tests.test_pipeline import use_bodies

CFG = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
       "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 2, "vocab_size": 256,
       "max_position_embeddings": 2048, "tie_word_embeddings": True, "dtype": "bfloat16"}
GATES = [{"name": "max_mean_kld", "metric": "mean KLD", "estimate": 0.08, "lo": 0.07, "hi": 0.09, "threshold": 0.05,
          "status": "FAIL", "n": 24, "unit": "window"},
         {"name": "min_top1", "metric": "top-1 agreement", "estimate": 0.93, "lo": 0.9, "hi": 0.95, "threshold": 0.9,
          "status": "PASS", "n": 24, "unit": "token"}]


def _tensors() -> dict[str, list[int]]:
    """Every weight of CFG's two layers (the checks read each linear layer's shape against the group size)."""
    h, kv, ff = 64, 32, 128
    out = {"model.embed_tokens.weight": [256, h], "model.norm.weight": [h]}
    for i in range(2):
        p = f"model.layers.{i}."
        out |= {p + "self_attn.q_proj.weight": [h, h], p + "self_attn.k_proj.weight": [kv, h],
                p + "self_attn.v_proj.weight": [kv, h], p + "self_attn.o_proj.weight": [h, h],
                p + "mlp.gate_proj.weight": [ff, h], p + "mlp.up_proj.weight": [ff, h], p + "mlp.down_proj.weight": [h, ff],
                p + "input_layernorm.weight": [h], p + "post_attention_layernorm.weight": [h]}
    return out


def write_checkpoint(d: Path, fill: int = 1) -> Path:
    """A tiny real checkpoint: config.json and a safetensors file (written by hand) of CFG's BF16 weights, every
    byte ``fill`` (~180 KB)."""
    d.mkdir(parents=True, exist_ok=True)
    (d / "config.json").write_text(json.dumps(CFG))
    write_safetensors(d / "model.safetensors", _tensors(), fill=fill)
    return d


@pytest.fixture
def setup(tmp_path, monkeypatch):
    """A recipe over a tiny base model, stand-in stages (quantize writes a checkpoint, eval FAILs with two
    gates), a fresh INFERTOOL_HOME; the working directory is tmp_path (the default output is relative)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("INFERTOOL_HOME", str(tmp_path / "home"))
    base = write_checkpoint(tmp_path / "base", fill=7)
    recipe = tmp_path / "r.yaml"
    recipe.write_text(f"name: r\nmodel: {{source: {base}}}\nquantize: {{method: gptq, group_size: 32}}\neval: {{}}\n"
                      "serve: {max_model_len: 512}\n")

    def body(name):
        def fn(ctx):
            if name == "quantize":
                write_checkpoint(ctx.work / "model", fill=3)
            if name == "eval":
                return {"verdict": "FAIL", "reason": "mean KLD above 0.05", "gates": GATES, "suite": "builtin-corpus",
                        "engine": "hf"}
            return {}
        return fn

    use_bodies(monkeypatch, {n: body(n) for n in stages.names()})
    return tmp_path, recipe


def run_cli(*args):
    r = cli_in_process(*args)
    assert "Traceback" not in r.stderr, r.stderr
    return r


def test_fingerprint_is_the_content_not_the_mtimes(tmp_path):
    a = write_checkpoint(tmp_path / "a")
    b = write_checkpoint(tmp_path / "b")
    os.utime(b / "model.safetensors", (1, 1))
    (b / publish.CARD).write_text("a card")  # the card and its facts are not the checkpoint
    (b / publish.FACTS).write_text("{}")
    (b / ".hidden").write_text("x")
    assert publish.fingerprint(a) == publish.fingerprint(b)
    assert publish.fingerprint(write_checkpoint(tmp_path / "c", fill=2)) != publish.fingerprint(a)  # other weights
    cfg = json.loads((b / "config.json").read_text())
    (b / "config.json").write_text(json.dumps({**cfg, "num_hidden_layers": 3}))
    assert publish.fingerprint(b) != publish.fingerprint(a)  # another config


def test_run_publishes_what_it_evaluated_and_serve_takes_the_run_dir(setup):
    tmp, recipe = setup
    r = run_cli("run", str(recipe), "--out", "runs", "--json")
    assert r.returncode == 1, r.stderr  # the FAIL verdict: exit 1, and still published
    doc = json.loads(r.stdout)
    assert doc["verdict"] == "FAIL" and [g["status"] for g in doc["gates"]] == ["FAIL", "PASS"]
    run_dir = Path(doc["run_dir"]).absolute()
    dest = tmp / "out" / "r-gptq"  # resolve.default_output
    assert doc["published"]["path"] == str(dest)
    cache_ckpt = run_dir / "quantize" / "model"
    fp = publish.fingerprint(cache_ckpt)
    assert doc["published"]["fingerprint"] == fp == publish.fingerprint(dest)
    assert not any(p.is_symlink() for p in dest.rglob("*"))  # a copy, never a link into the cache
    assert (dest / "model.safetensors").read_bytes() == (cache_ckpt / "model.safetensors").read_bytes()
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert {k: manifest["published"][k] for k in ("path", "fingerprint")} == {"path": str(dest), "fingerprint": fp}
    # no serve environment in this INFERTOOL_HOME: published without evidence, the reason in its record and card
    assert "serve' environment" in manifest["published"]["evidence"]["missing"]
    facts = json.loads((dest / publish.FACTS).read_text())
    assert facts["fingerprint"] == fp and facts["verdict"] == "FAIL" and facts["run_id"] == run_dir.name
    assert facts["method"]["method"] == "gptq" and facts["method"]["group_size"] == 32
    assert facts["inputs"]["model"] and facts["serve"]["max_model_len"] == 512
    card = (dest / publish.CARD).read_text()
    assert "**Verdict: FAIL**" in card and "did not pass its eval" in card and "| max_mean_kld | mean KLD | 0.08 |" in card
    assert f"infertool serve {run_dir}" in card and fp in card
    md = Path(doc["report"]["report.md"]).read_text()  # the report says where it is and how to serve it
    assert "## Ship it" in md and str(dest) in md and fp in md and f"infertool serve {run_dir} --emit k8s" in md
    assert "verdict **FAIL**" in md and "The verdict is FAIL" in md
    # the terminal (without --json); a re-run reusing quantize leaves the same weights in place (not copied again)
    inode = (dest / "model.safetensors").stat().st_ino
    r2 = run_cli("run", str(recipe), "--out", "runs")
    assert r2.returncode == 1 and (dest / "model.safetensors").stat().st_ino == inode
    assert json.loads((dest / publish.FACTS).read_text())["run_id"] != run_dir.name  # the card names the new run
    for text in ("verdict: FAIL", "max_mean_kld: 0.08 [0.07, 0.09] vs threshold 0.05: FAIL",
                 "min_top1: 0.93 [0.9, 0.95] vs threshold 0.9: PASS", f"published: {dest}", "report.html"):
        assert text in " ".join(r2.stderr.split()), r2.stderr
    # serve RUN_DIR: that checkpoint, checked
    s = run_cli("serve", str(run_dir), "--dry-run", "--json")
    plan = json.loads(s.stdout)
    assert plan["model"] == str(dest) and any(fp[:16] in n for n in plan["resolution"]["notes"]), s.stdout
    k = run_cli("serve", str(run_dir), "--emit", "k8s")
    assert k.returncode == 0 and str(dest) in k.stdout, k.stderr
    # another checkpoint at the published path: refused with both fingerprints and the command that re-publishes
    write_checkpoint(dest, fill=9)
    other = publish.fingerprint(dest)
    for args in (("serve", str(run_dir), "--dry-run"), ("serve", str(run_dir), "--emit", "k8s"),
                 ("serve", str(recipe), "--dry-run")):
        bad = run_cli(*args)
        text = " ".join(bad.stderr.split())
        assert bad.returncode == 2 and fp in text and other in text and "infertool publish" in text, bad.stderr
    # re-published from the run directory (its quantize entry): served again
    kept = run_cli("publish", str(run_dir), str(dest))  # not the copy infertool made any more: --force replaces it
    assert kept.returncode == 2 and "changed since infertool published it" in kept.stderr and "--force" in kept.stderr
    assert publish.fingerprint(dest) == other
    bare = run_cli("publish", str(run_dir), str(dest), "--force")  # evidence needs the serve environment (none here)
    assert bare.returncode == 3 and "--no-evidence" in bare.stderr and publish.fingerprint(dest) == other, bare.stderr
    again = run_cli("publish", str(run_dir), str(dest), "--force", "--no-evidence")
    assert again.returncode == 0 and publish.fingerprint(dest) == fp, again.stderr
    assert "verdict FAIL" in " ".join(again.stderr.split())
    refacts = json.loads((dest / publish.FACTS).read_text())  # the card from the manifest read back, the same facts
    assert {k: refacts[k] for k in ("verdict", "gates", "fingerprint", "run_id", "serve")} == \
        {k: facts[k] for k in ("verdict", "gates", "fingerprint", "run_id", "serve")}
    assert run_cli("serve", str(recipe), "--dry-run").returncode in (0, 2)  # the lint may refuse; the fingerprint passes
    assert "another checkpoint" not in run_cli("serve", str(recipe), "--dry-run").stderr


def test_publish_refuses_destinations_it_must_not_touch(setup):
    tmp, recipe = setup
    run_dir = Path(json.loads(run_cli("run", str(recipe), "--out", "runs", "--json").stdout)["run_dir"])
    home_envs = tmp / "home" / "envs"
    home_envs.mkdir(parents=True)
    (tmp / "notes").mkdir()
    (tmp / "notes" / "todo.txt").write_text("mine")
    for dest, words in ((tmp / "runs" / ".stages" / "x", "stage cache"), (run_dir / "x", "run directory"),
                        (tmp / "base", "source model"), (home_envs / "x", "environments"),
                        (tmp / "notes", "not empty and holds no config.json")):
        for args in (("run", str(recipe), "--out", "runs", "--publish", str(dest)),
                     ("run", str(recipe), "--out", "runs", "--publish", str(dest), "--dry-run")):
            r = run_cli(*args)
            assert r.returncode == 2 and words in " ".join(r.stderr.split()), (args, r.stderr)
    assert (tmp / "notes" / "todo.txt").read_text() == "mine"
    r = run_cli("publish", str(run_dir), str(home_envs / "y"))
    assert r.returncode == 2 and "environments" in r.stderr
    r = run_cli("publish", str(tmp / "notes"), str(tmp / "z"))
    assert r.returncode == 2 and "not a run directory" in " ".join(r.stderr.split())


def test_publish_copies_to_a_folder_and_dry_runs_the_remote_calls(setup):
    tmp, recipe = setup
    doc = json.loads(run_cli("run", str(recipe), "--out", "runs", "--publish", "shipped", "--json").stdout)
    pub = Path(doc["published"]["path"])
    assert pub == tmp / "shipped"
    r = run_cli("publish", str(pub), str(tmp / "elsewhere" / "copy"), "--json")
    assert r.returncode == 0, r.stderr
    copy = tmp / "elsewhere" / "copy"
    assert publish.fingerprint(copy) == doc["published"]["fingerprint"]
    assert json.loads((copy / publish.FACTS).read_text())["run_id"] == Path(doc["run_dir"]).name
    s3 = run_cli("publish", str(pub), "s3://bucket/models/r", "--dry-run")
    assert s3.returncode == 0, s3.stderr
    for name in ("config.json", "model.safetensors", publish.FACTS, publish.CARD):
        assert f"boto3.client('s3').upload_file('{pub / name}', 'bucket', 'models/r/{name}')" in s3.stdout, s3.stdout
    hf = run_cli("publish", str(pub), "hf://my-org/r-w4", "--dry-run", "--json")
    assert json.loads(hf.stdout)["calls"] == [
        f"huggingface_hub.HfApi().upload_folder(folder_path='{pub}', repo_id='my-org/r-w4', repo_type='model')"]
    for bad in ("hf://just-a-name", "s3://", "ftp://x/y"):
        r = run_cli("publish", str(pub), bad, "--dry-run")
        assert r.returncode == 2, (bad, r.stderr)


def test_remote_publish_without_the_library_says_what_is_missing(setup, monkeypatch):
    import builtins

    tmp, recipe = setup
    doc = json.loads(run_cli("run", str(recipe), "--out", "runs", "--json").stdout)
    real = builtins.__import__

    def no_libs(name, *a, **k):
        if name in ("boto3", "huggingface_hub"):
            raise ImportError(name)
        return real(name, *a, **k)

    monkeypatch.setattr(builtins, "__import__", no_libs)
    for dest, lib in (("s3://bucket/p", "boto3"), ("hf://org/name", "huggingface_hub")):
        r = run_cli("publish", doc["published"]["path"], dest)
        assert r.returncode == 3 and lib in r.stderr and "--dry-run" in " ".join(r.stderr.split()), r.stderr


def test_a_run_without_quantize_or_eval_publishes_nothing_and_says_so(setup):
    tmp, recipe = setup
    r = run_cli("run", str(recipe), "--out", "runs", "--stages", "model,quantize", "--json")
    doc = json.loads(r.stdout)
    assert "eval stage" in doc["published"]["why"] and not (tmp / "out").exists()
    s = run_cli("serve", doc["run_dir"], "--dry-run")
    assert s.returncode == 2 and "published no checkpoint" in s.stderr
    r = run_cli("run", str(recipe), "--out", "runs", "--stages", "model,quantize", "--publish", "x")
    assert r.returncode == 2 and "eval" in r.stderr


def test_check_dest_unit(tmp_path):
    (tmp_path / "model").mkdir()
    write_checkpoint(tmp_path / "model")
    with pytest.raises(UsageError, match="infertool did not publish this folder"):  # the user's own model folder
        publish.check_dest(tmp_path / "model", {})
    (tmp_path / "model" / "infertool-manifest.json").write_text("{}")  # one `infertool quantize` wrote: run's own
    assert publish.check_dest(tmp_path / "model", {}) == tmp_path / "model"
    assert publish.check_dest(tmp_path / "model", {}, force=True) == tmp_path / "model"
    with pytest.raises(UsageError, match="or holds"):
        publish.check_dest(tmp_path, {"the run directory": tmp_path / "runs" / "a"})


def test_run_publishes_over_its_own_copy_but_never_over_a_users_model_folder(setup):
    """`run --publish DIR` where DIR is someone's model folder (config.json and their notes): exit 2 before any
    stage runs, the folder untouched; a second run over run's own published copy replaces it."""
    tmp, recipe = setup
    mine = write_checkpoint(tmp / "mine", fill=5)
    (mine / "notes.txt").write_text("mine")
    before = sorted((p.name, p.read_bytes()) for p in mine.iterdir())
    r = run_cli("run", str(recipe), "--out", "runs", "--publish", str(mine))
    assert r.returncode == 2 and "infertool did not publish this folder" in r.stderr, r.stderr
    assert "--publish DIR" in r.stderr and not (tmp / "runs").exists()
    assert sorted((p.name, p.read_bytes()) for p in mine.iterdir()) == before
    for _ in range(2):
        r = run_cli("run", str(recipe), "--out", "runs", "--publish", str(tmp / "pub"), "--json")
        assert r.returncode == 1, r.stderr
    assert json.loads((tmp / "pub" / publish.FACTS).read_text())["run_id"] == Path(json.loads(r.stdout)["run_dir"]).name


@pytest.mark.parametrize("published", [{"path": 5, "fingerprint": "ab"}, {"path": ["x"]}, "nope", {"why": {"a": 1}}])
def test_a_crafted_published_record_is_refused_cleanly(setup, published):
    tmp, recipe = setup
    run_dir = Path(json.loads(run_cli("run", str(recipe), "--out", "runs", "--json").stdout)["run_dir"])
    m = json.loads((run_dir / "manifest.json").read_text())
    (run_dir / "manifest.json").write_text(json.dumps({**m, "published": published}))
    for args in (("serve", str(run_dir), "--dry-run"), ("publish", str(run_dir), str(tmp / "d")), ("report", str(run_dir))):
        r = run_cli(*args)
        assert r.returncode == (0 if args[0] == "report" else 2), (args, r.stderr)


def test_card_facts_keep_the_keys_and_order_they_were_written_with(tmp_path):
    """infertool.json read back and written again (a tune's card re-published) keeps its keys in their order, the
    copy's fingerprint, path and evidence last; a card of a newer format is refused naming the file."""
    from infertool.publish.facts import CardFacts
    from infertool.summaries import EvidenceBlock

    tune = {"v": 1, "infertool": "0.1", "published": "t", "source_model": {"source": "s", "label": "s"},
            "method": {"method": "gptq"}, "label": "L", "verdict": "PASS", "reason": "r", "gates": GATES[1:],
            "recipe": "r", "run_id": "x/y", "run_dir": "/a", "inputs": {"a": 1}, "serve": None,
            "commands": {"serve": "a", "k8s": "b"}, "fingerprint": "f", "path": "/old", "evidence": {"missing": "x"}}
    facts = CardFacts.read(tune)
    assert list(facts.to_dict()) == list(tune) and facts.to_dict()["evidence"] == {"missing": "x"}
    assert facts.gates[0].name == "min_top1" and facts.to_dict()["gates"][0]["unit"] == "token"  # kept aside
    copied = facts.copied("g", "/new", EvidenceBlock.absent("why")).to_dict()
    assert list(copied)[-3:] == ["fingerprint", "path", "evidence"] and copied["path"] == "/new"
    (tmp_path / publish.FACTS).write_text(json.dumps({**tune, "v": 99}))
    with pytest.raises(UsageError, match="format 99, newer than this infertool reads"):
        publish.read_facts(tmp_path / publish.FACTS)
