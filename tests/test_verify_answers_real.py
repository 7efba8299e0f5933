"""The served-formats suite's answers in the evidence and in `verify`, for real (slow): the bundled SmolLM2-135M
served by vLLM with the tool-calling flags, its json and tool_call answers captured into evidence/ beside a copy
of the model (publish's writer), then `infertool verify` on that folder against a fresh vLLM server under the
recorded settings: every item asked again and checked, validity as recorded."""

from __future__ import annotations

import json
import shutil

import pytest

from conftest import require_env, run_cli

pytestmark = pytest.mark.slow


def test_served_formats_answers_are_recorded_and_verified_as_served(full_model, tmp_path):
    require_env("serve")
    from infertool import publish
    from infertool.recipe import validate_recipe_data
    from infertool.resolve import Overrides, resolve
    from infertool.verify import capture
    from infertool.verify import evidence as E

    data = {"name": "formats", "model": {"source": str(full_model)},
            "eval": {"suite": "served-formats", "engine": "vllm", "max_items": 4,
                     "decode": {"n_prompts": 2, "max_tokens": 8}},
            "serve": {"enforce_eager": True, "max_model_len": 1024, "max_num_seqs": 8, "cpu": {"kv_cache_space_gib": 1},
                      "enable_auto_tool_choice": True, "tool_call_parser": "hermes"},
            "verify": {"evidence": {"top_k": 4}}}
    ckpt = tmp_path / "ckpt"
    shutil.copytree(full_model, ckpt)
    res = resolve(validate_recipe_data(data, source="test"), Overrides(candidate=str(ckpt)))
    index = capture.capture_checkpoint(res, ckpt, ckpt / E.DIRNAME, fingerprint=publish.fingerprint(ckpt),
                                       log_dir=tmp_path)
    assert index.format == 3 and E.TASKS in index.files and E.PROMPTS in index.files, index.missing
    ev = E.read(ckpt / E.DIRNAME)
    asked = {t["name"]: t for t in ev.tasks}
    assert [it["expected"]["name"] for it in asked["tools"]["items"]][:1] == ["get_weather"]
    answered = ev.prompts["tasks"]
    assert len(answered["extract"]["items"]) == len(answered["tools"]["items"]) == 4
    r = run_cli("verify", str(ckpt), "--out", str(tmp_path / "v"), "--json", "--allow-inconclusive", timeout=1500)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    doc = json.loads(r.stdout)
    a = doc["answers"]
    assert a["items"] == 8 and set(a["tasks"]) == {"extract", "tools"}
    # the engine and settings recorded: no item lost its validity (the json answers are held to the schema by
    # vLLM's structured outputs; vLLM 0.32 sends tool arguments as a JSON string, recorded and now alike)
    assert a["lost"] == 0 and a["valid_now"] >= a["valid_recorded"], a
    gates = {g["name"]: g for g in doc["gates"]}
    assert gates["max_valid_drop"]["status"] == "PASS" and gates["max_answers_changed"]["status"] != "n/a"
    saved = json.loads((tmp_path / "v" / "verify.json").read_text())
    assert saved["answers"]["items"] == 8 and saved["evidence"]["serve"]["tool_call_parser"] == "hermes"
