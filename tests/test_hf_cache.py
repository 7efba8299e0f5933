"""`model.source: org/name` resolves to the local Hugging Face cache (never the network), the same way for every
command; an id that is not cached is refused with where infertool looked and how to download it."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from infertool.errors import UsageError
from infertool.models.sources import (
    find_in_hf_cache,
    hf_hub_cache,
    locate,
    looks_like_hub_id,
)
from infertool.recipe import validate_recipe_data
from tests.fakes import layout_model

REPO = "meta-llama/Llama-3.1-8B-Instruct"


def snapshot(cache, repo, rev, *, ref=True, key="llama-3.1-8b"):
    d = cache / ("models--" + repo.replace("/", "--"))
    layout_model(d / "snapshots" / rev, key, shards=2)
    if ref:
        (d / "refs").mkdir(parents=True, exist_ok=True)
        (d / "refs" / "main").write_text(rev)
    return d / "snapshots" / rev


@pytest.fixture
def hf_cache(tmp_path, monkeypatch):
    cache = tmp_path / "hf" / "hub"
    cache.mkdir(parents=True)
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    return cache


def test_cache_location_follows_huggingface_hub(tmp_path, monkeypatch):
    for var in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_HOME", "XDG_CACHE_HOME"):
        monkeypatch.delenv(var, raising=False)
    assert hf_hub_cache() == Path("~/.cache/huggingface/hub").expanduser()
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert hf_hub_cache() == tmp_path / "xdg" / "huggingface" / "hub"
    monkeypatch.setenv("HF_HOME", str(tmp_path / "home"))
    assert hf_hub_cache() == tmp_path / "home" / "hub"
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "c"))
    assert hf_hub_cache() == tmp_path / "c"


def test_hub_ids_and_paths():
    assert looks_like_hub_id("meta-llama/Llama-3.1-8B-Instruct") and looks_like_hub_id("Qwen/Qwen2.5-7B")
    for not_id in ("./a/b", "/models/x", "~/m/x", "a/b/c", "a", "../x", "a/..", "bundled:smollm2-135m", "x.gguf"):
        assert not looks_like_hub_id(not_id), not_id


def test_refs_main_wins_else_the_newest_snapshot_with_a_config(hf_cache):
    main = snapshot(hf_cache, REPO, "aaa111")
    newer = snapshot(hf_cache, REPO, "bbb222", ref=False)
    os.utime(newer, (time.time() + 10, time.time() + 10))
    snap = find_in_hf_cache(REPO)
    assert snap.path == main and snap.revision == "aaa111" and snap.how == "refs/main"
    # refs/main points to a snapshot that is not there (a partial download): the newest one with a config.json
    (hf_cache / f"models--{REPO.replace('/', '--')}" / "refs" / "main").write_text("gone999")
    (newer.parent / "ccc333").mkdir()  # newest of all, but no config.json: skipped
    os.utime(newer.parent / "ccc333", (time.time() + 20, time.time() + 20))
    snap = find_in_hf_cache(REPO)
    assert snap.path == newer and snap.how == "newest snapshot with a config.json"
    # the hub's ids are case-insensitive; the cache keeps the download's spelling
    assert find_in_hf_cache(REPO.lower()).path == newer
    assert find_in_hf_cache("meta-llama/Other") is None


def test_every_command_resolves_a_cached_hub_id_the_same_way(hf_cache, tmp_path, monkeypatch):
    from infertool.plan import plan as make_plan
    from infertool.resolve import resolve

    snap = snapshot(hf_cache, REPO, "aaa111")
    r = locate(REPO, convert=True).require()
    assert r.kind == "hub" and r.path == snap and r.key == "aaa111"
    recipe = validate_recipe_data({"name": "t", "model": {"source": REPO}, "target": {"gpu": "H100-SXM"},
                                   "serve": {"max_model_len": 8192}})
    res = resolve(recipe)
    assert res.base.exists and res.base.path == str(snap) and res.served is res.base
    assert res.base.name == "Llama-3.1-8B-Instruct"
    p = make_plan(res)
    assert p.model.how == "safetensors headers" and p.fits  # the cached weights, not the known-architecture table
    assert res.inputs()["model"]["identity"]  # fingerprinted by content, not as a missing path
    assert "missing" not in str(res.inputs()["model"])
    with pytest.raises(UsageError, match="model.layers"):
        resolve(validate_recipe_data({"name": "t", "model": {"source": REPO, "layers": 2}}))


def test_an_id_that_is_not_cached_is_refused_with_where_and_how(hf_cache):
    from infertool.resolve import resolve

    with pytest.raises(UsageError) as ei:
        locate("meta-llama/Llama-3.3-70B-Instruct", convert=True).require()
    e = ei.value
    assert "never downloads" in e.message and str(hf_cache / "models--meta-llama--Llama-3.3-70B-Instruct") in e.message
    assert "huggingface-cli download meta-llama/Llama-3.3-70B-Instruct --local-dir" in e.hint
    # planning a model that is not here still works from the known-architecture table, and says where it looked
    res = resolve(validate_recipe_data({"name": "t", "model": {"source": "meta-llama/Llama-3.3-70B-Instruct"}}))
    assert not res.base.exists and str(hf_cache) in res.base.note
    assert res.base.path != "meta-llama/Llama-3.3-70B-Instruct"  # never the id as a path (vLLM would download it)
    with pytest.raises(UsageError) as ei:
        res.ensure(res.base)
    assert "huggingface-cli download" in ei.value.hint


def test_a_local_directory_of_the_same_name_wins(hf_cache, tmp_path, monkeypatch):
    snapshot(hf_cache, REPO, "aaa111")
    monkeypatch.chdir(tmp_path)
    layout_model(tmp_path / "meta-llama" / "Llama-3.1-8B-Instruct", "llama-3.1-8b", shards=1)
    r = locate(REPO, convert=True).require()
    assert r.kind == "hf" and r.path == (tmp_path / "meta-llama" / "Llama-3.1-8B-Instruct").resolve()
