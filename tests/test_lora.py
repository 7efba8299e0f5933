"""LoRA adapters from the recipe (serve.lora): the record, vLLM's argv, the preflight, plan sizing, the
per-adapter phase. Fast: real files, no server (the real one is in test_lora_real.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from infertool.errors import UsageError
from infertool.recipe import ServeSection
from infertool.serve.command import build_launch


def _lora_serve(**lora) -> ServeSection:
    return ServeSection.model_validate({"served_model_name": "base", "lora": lora})


def test_lora_argv_names_every_adapter_with_absolute_paths(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    s = _lora_serve(adapters={"ad1": "adapters/one", "ad2": str(tmp_path / "two")}, max_lora_rank=32, max_loras=2,
                    max_cpu_loras=4)
    a = build_launch(s, "/models/x", "/py").argv
    i = a.index("--lora-modules")
    assert "--enable-lora" in a
    assert a[i + 1:i + 3] == [f"ad1={tmp_path / 'adapters/one'}", f"ad2={tmp_path / 'two'}"]  # recipe order kept
    assert a[a.index("--max-lora-rank") + 1] == "32"
    assert a[a.index("--max-loras") + 1] == "2"
    assert a[a.index("--max-cpu-loras") + 1] == "4"
    no_cpu = build_launch(_lora_serve(adapters={"a": "/x"}), "/models/x", "/py").argv
    assert "--max-cpu-loras" not in no_cpu and no_cpu[no_cpu.index("--max-lora-rank") + 1] == "16"
    assert "--enable-lora" not in build_launch(ServeSection(), "/models/x", "/py").argv


def test_lora_adapter_named_like_the_default_served_name_is_refused():
    s = ServeSection.model_validate({"lora": {"adapters": {"x": "/a"}}})
    with pytest.raises(UsageError, match="also the served model's name"):
        build_launch(s, "/models/x", "/py")


@pytest.mark.parametrize("lora, where, says", [
    ({"adapters": {}}, "lora.adapters", "at least 1"),
    ({"adapters": {"a": "/x"}, "max_lora_rank": 12}, "lora.max_lora_rank", "one of vLLM's choices"),
    ({"adapters": {"a": "/x"}, "max_loras": 3, "max_cpu_loras": 2}, "lora.max_cpu_loras", "at least max_loras"),
    ({"adapters": {"-bad": "/x"}}, "lora.adapters", "letters, digits"),
    ({"adapters": {"a": "/x"}, "rank": 8}, "lora.rank", "Extra inputs"),
])
def test_lora_recipe_refuses_bad_fields(lora, where, says):
    with pytest.raises(ValidationError) as e:
        ServeSection.model_validate({"lora": lora})
    text = str(e.value)
    assert where.split(".")[-1] in text and says in text


def test_lora_adapter_named_like_served_model_name_is_refused():
    with pytest.raises(ValidationError, match="is serve.served_model_name"):
        ServeSection.model_validate({"served_model_name": "a", "lora": {"adapters": {"a": "/x"}}})
