"""The built-in recipe registry: list, get, copy."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from infertool.catalog import BuiltinRecipe, builtin_dir, copy_builtin, get_builtin, list_builtin
from infertool.errors import UsageError
from infertool.recipe import load_recipe


def test_builtin_dir_holds_the_repository_recipes() -> None:
    repo_recipes = Path(__file__).resolve().parents[1] / "recipes"
    assert builtin_dir().resolve() == repo_recipes.resolve()


def test_list_builtin_has_quickstart_with_description() -> None:
    recipes = list_builtin()
    names = [r.name for r in recipes]
    assert names == sorted(names)
    quick = next(r for r in recipes if r.name == "quickstart")
    assert isinstance(quick, BuiltinRecipe)
    assert quick.path.name == "quickstart.yaml" and quick.path.is_file()
    assert "SmolLM2" in quick.description
    assert "\n" not in quick.description
    for expected in ("smollm2-w8-cpu", "smollm2-awq-cpu", "llama3.1-8b-speculative"):
        assert expected in names


def test_get_builtin() -> None:
    assert get_builtin("quickstart").name == "quickstart"
    assert get_builtin("quickstart.yaml").name == "quickstart"


def test_get_builtin_unknown_lists_known_names() -> None:
    with pytest.raises(UsageError) as info:
        get_builtin("quikstart")
    assert "quikstart" in info.value.message
    assert "quickstart" in info.value.message
    assert "did you mean 'quickstart'" in (info.value.hint or "")


def test_copy_to_directory(tmp_path: Path) -> None:
    written = copy_builtin("quickstart", tmp_path)
    assert written == tmp_path / "quickstart.yaml"
    assert written.read_bytes() == get_builtin("quickstart").path.read_bytes()
    assert load_recipe(written).name == "quickstart"
    assert [p.name for p in tmp_path.iterdir()] == ["quickstart.yaml"]  # no temp files left


def test_copy_to_file_path(tmp_path: Path) -> None:
    target = tmp_path / "mine.yaml"
    written = copy_builtin("smollm2-w8-cpu", target)
    assert written == target
    assert "bits: 8" in target.read_text()
    umask = os.umask(0)
    os.umask(umask)
    assert os.stat(target).st_mode & 0o777 == 0o666 & ~umask  # not the temp file's 0o600


def test_copy_refuses_to_overwrite(tmp_path: Path) -> None:
    target = tmp_path / "quickstart.yaml"
    target.write_text("mine\n")
    with pytest.raises(UsageError) as info:
        copy_builtin("quickstart", tmp_path)
    assert "--force" in (info.value.hint or "")
    assert target.read_text() == "mine\n"
    with pytest.raises(UsageError):
        copy_builtin("quickstart", target)
    assert target.read_text() == "mine\n"


def test_copy_force_overwrites(tmp_path: Path) -> None:
    target = tmp_path / "quickstart.yaml"
    target.write_text("mine\n")
    written = copy_builtin("quickstart", target, force=True)
    assert written == target
    assert target.read_bytes() == get_builtin("quickstart").path.read_bytes()


def test_copy_unknown_recipe_or_missing_folder(tmp_path: Path) -> None:
    with pytest.raises(UsageError):
        copy_builtin("nope", tmp_path)
    with pytest.raises(UsageError) as info:
        copy_builtin("quickstart", tmp_path / "missing" / "x.yaml")
    assert "does not exist" in info.value.message


def test_load_recipe_by_builtin_name(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # no local file of that name
    recipe = load_recipe("quickstart")
    assert recipe.name == "quickstart"
    assert recipe.model.source == "bundled:smollm2-135m"
    assert load_recipe("smollm2-w8-cpu.yaml", ["quantize.group_size=32"]).quantize.group_size == 32


def test_local_file_wins_over_builtin_name(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "quickstart").write_text("name: local\nmodel: {source: /m}\n")
    assert load_recipe("quickstart").name == "local"
