"""Crafted run directories through the real CLI (`infertool report DIR`, `infertool compare DIR GOOD`): issue 25's
findings 5 and 8. Each case builds a run directory someone else could hand over (a manifest of the wrong shape,
nested 100,000 deep, a link to a 16 GB file, a fifo, report.html that is a directory, a figure that is a link
to a secret, ...) and asserts the exit code, the message, and that no file was read, embedded or deleted that
should not be: a clean error (exit 2) or a report that says what it did not read (exit 0), never an internal error,
never a hang (every subprocess has a deadline)."""

from __future__ import annotations

import base64
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import pytest

from tests.conftest import cli_in_process, run_cli
from tests.report_fixture import make_run_dir

SECRET = "SECRET-TOKEN-8f3a1c"
GIB = 2**30


def _manifest(d: Path, doc=None, raw: str | bytes | None = None) -> Path:
    d.mkdir(parents=True, exist_ok=True)
    data = raw if raw is not None else json.dumps(doc)
    (d / "manifest.json").write_bytes(data.encode() if isinstance(data, str) else data)
    return d


def _sparse(path: Path, size: int) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f:
        f.truncate(size)  # a hole: no disk, no time
    return path


def _secret(tmp: Path) -> Path:
    s = tmp / "secret.txt"
    s.write_text(SECRET)
    return s


def _dir_with(d: Path, make: Callable[[Path], object]) -> Path:
    """A directory whose manifest.json is made by ``make(path)``."""
    d.mkdir(parents=True)
    make(d / "manifest.json")
    return d


def _run_with(d: Path, rel: str, make: Callable[[Path], None], **manifest) -> Path:
    """A run directory whose manifest is fine and whose file ``rel`` is made by ``make(path)``."""
    _manifest(d, {"recipe_name": "crafted", "stages": {}, **manifest})
    (d / rel).parent.mkdir(parents=True, exist_ok=True)
    make(d / rel)
    return d


def _eval_with_histogram(d: Path, name) -> Path:
    """eval/results.json naming its KLD histogram ``name`` (what eval writes: files.kld_histogram)."""
    return _run_with(d, "eval/results.json", lambda p: p.write_text(json.dumps(
        {"verdict": "PASS", "gates": [], "files": {"kld_histogram": name}})))


def _link_outside_stage(d: Path) -> Path:
    """The stage link `run` makes (run/eval -> an entry), pointing at a folder outside the run and its cache."""
    elsewhere = d.parent / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "results.json").write_text(json.dumps({"verdict": "PASS", "reason": SECRET}))
    _manifest(d, {"recipe_name": "crafted"})
    os.symlink(elsewhere, d / "eval")
    return d


@dataclass
class Case:
    build: Callable[[Path], Path]  # tmp_path / "run" -> the run directory to give the CLI
    code: int  # report's exit code (compare's too)
    says: str  # what report says (on stderr)
    report_writes: bool = True  # compare reads only: a case about report's own files leaves compare at 0
    after: Callable[[Path], bool] | None = None  # what must hold of the run directory afterwards


def _deep(open_: str, close: str, inner: str = "") -> str:
    return open_ * 100_000 + inner + close * 100_000


CASES = {
    # the manifest's shape: read as "not measured"
    "manifest a list": Case(lambda d: _manifest(d, [1, 2]), 0, "report.html"),
    "manifest a string": Case(lambda d: _manifest(d, "a string"), 0, "report.html"),
    "manifest null": Case(lambda d: _manifest(d, None), 0, "report.html"),
    "manifest a number": Case(lambda d: _manifest(d, 7), 0, "report.html"),
    "stages a list": Case(lambda d: _manifest(d, {"stages": [1, {"status": "done"}]}), 0, "report.html"),
    "stage records of the wrong type": Case(lambda d: _manifest(d, {"stages": {"eval": [1], "bench": {"status": 3,
                                             "seconds": "x", "summary": "y", "key": 5}}}), 0, "report.html"),
    "NaN and 1e400 figures": Case(lambda d: _manifest(d, raw='{"recipe_name": NaN, "recipe": {"a": -Infinity}, '
                                  '"stages": {"eval": {"status": "done", "seconds": 1e400}}}'), 0, "report.html"),
    # the manifest as a file: a clean refusal, exit 2
    "manifest 100,000-deep array": Case(lambda d: _manifest(d, raw=_deep("[", "]")), 2,
                                        "not valid JSON: nested deeper than 64 levels"),
    "manifest 100,000-deep object": Case(lambda d: _manifest(d, raw=_deep('{"a":', "}", "1")), 2,
                                         "not valid JSON: nested deeper than 64 levels"),
    "recipe 900 deep (parses, too deep to use)": Case(lambda d: _manifest(d, raw='{"recipe":' + '{"a":' * 900 + "1"
                                                      + "}" * 900 + "}"), 2, "nested deeper than 64 levels"),
    "manifest a link to a 16 GB file": Case(lambda d: (_manifest(d, {}), (d / "manifest.json").unlink(), os.symlink(
        _sparse(d.parent / "huge.bin", 16 * GIB), d / "manifest.json"))[0], 2, "manifest.json: a symbolic link"),
    "manifest a 16 GB file": Case(lambda d: _dir_with(d, lambda m: _sparse(m, 16 * GIB)), 2,
                                  "manifest.json: too large (over 67,108,864 bytes)"),
    "manifest a directory": Case(lambda d: _dir_with(d, Path.mkdir), 2, "manifest.json: a directory"),
    "manifest a fifo": Case(lambda d: _dir_with(d, os.mkfifo), 2, "manifest.json: a fifo"),
    "manifest not UTF-8": Case(lambda d: _manifest(d, raw=b"\xff\xfe\x00garbage\x80"), 2, "manifest.json: not valid JSON"),
    "manifest a 5,000-digit number": Case(lambda d: _manifest(d, raw='{"started": ' + "9" * 5000 + "}"), 2,
                                          "manifest.json: not valid JSON"),
    "no manifest": Case(lambda d: (d.mkdir(), d)[1], 2, "is not a run directory (no manifest.json)"),
    "run directory a file": Case(lambda d: (d.write_text("{}"), d)[1], 2, "is not a run directory (not a directory)"),
    # the result files: not read, and said so; the report is written
    "results.json a fifo": Case(lambda d: _run_with(d, "eval/results.json", os.mkfifo), 0,
                                "not read: eval/results.json: a fifo"),
    "results.json a link to /dev/zero": Case(lambda d: _run_with(d, "eval/results.json", lambda p: os.symlink("/dev/zero", p)),
                                             0, "not read: eval/results.json: a symbolic link"),
    "bench.json of 100 MB": Case(lambda d: _run_with(d, "bench/bench.json", lambda p: _sparse(p, 100 * 2**20)), 0,
                                 "not read: bench/bench.json: too large (over 67,108,864 bytes)"),
    "profile.json 100,000 deep": Case(lambda d: _run_with(d, "profile/profile.json", lambda p: p.write_text(_deep("[", "]"))),
                                      0, "not read: profile/profile.json: not valid JSON: nested deeper than 64 levels"),
    "a stage linked outside the run": Case(_link_outside_stage, 0, "not read: eval/results.json: outside the run directory"),
    # figures (finding 5): never embedded unless a PNG / SVG file of the run itself
    "figure a link to a secret (eval/kld.png -> ../secret.txt)": Case(
        lambda d: (_eval_with_histogram(d, "kld.png"), _secret(d), os.symlink("../secret.txt", d / "eval" / "kld.png"))[0],
        0, "figure not embedded: eval/kld.png: a symbolic link"),
    "figure a link outside": Case(lambda d: _run_with(d, "profile/roofline.png",
                                                      lambda p: os.symlink(_secret(d.parent), p)), 0,
                                  "figure not embedded: profile/roofline.png: a symbolic link"),
    "figure a directory": Case(lambda d: _run_with(d, "bench/latency_throughput.png", Path.mkdir), 0,
                               "figure not embedded: bench/latency_throughput.png: a directory"),
    "figure a fifo": Case(lambda d: _run_with(d, "profile/roofline.png", os.mkfifo), 0,
                          "figure not embedded: profile/roofline.png: a fifo"),
    "figure of 1 GB": Case(lambda d: _run_with(d, "profile/roofline.png", lambda p: _sparse(p, GIB)), 0,
                           "figure not embedded: profile/roofline.png: too large (over 16,777,216 bytes)"),
    "figure a text file named .png": Case(lambda d: _run_with(d, "profile/roofline.png", lambda p: p.write_text(SECRET)),
                                          0, "figure not embedded: profile/roofline.png: not a PNG image"),
    "histogram named secret.txt": Case(lambda d: (_eval_with_histogram(d, "secret.txt"), _secret(d / "eval"))[0], 0,
                                       "figure not embedded: eval/secret.txt: not a .png or .svg file"),
    "histogram name not a string": Case(lambda d: _eval_with_histogram(d, 5), 0, "report.html"),
    "histogram name '..'": Case(lambda d: _eval_with_histogram(d, "../.."), 0, "report.html"),
    # report's own files: a regular file is replaced, anything else refused and left as it is
    "report.html a directory": Case(lambda d: (_manifest(d, {}), (d / "report.html").mkdir(),
                                               (d / "report.html" / "keep.txt").write_text("mine"))[0], 2,
                                    "report.html: it is a directory, not a report infertool wrote", False,
                                    lambda d: (d / "report.html" / "keep.txt").read_text() == "mine"
                                    and not (d / "report.md").exists()),
    "report.md a link to a file elsewhere": Case(lambda d: (_manifest(d, {}), os.symlink(_secret(d.parent), d / "report.md"))[0],
                                                 2, "report.md: it is a symbolic link", False,
                                                 lambda d: (d / "report.md").is_symlink() and (d / "report.md").read_text()
                                                 == SECRET and not (d / "report.html").exists()),
}


@pytest.fixture(scope="module")
def good_run(tmp_path_factory) -> Path:
    return make_run_dir(tmp_path_factory.mktemp("good"))


@pytest.mark.parametrize("name", list(CASES))
def test_a_crafted_run_directory(tmp_path, good_run, name):
    case = CASES[name]
    d = case.build(tmp_path / "run")
    r = cli_in_process("report", str(d))  # 34 cases x 2 commands: in process (one subprocess run below)
    text = " ".join((r.stdout + r.stderr).split())  # Rich wraps long lines
    assert r.returncode == case.code, text
    assert case.says in text
    assert "internal error" not in text and "Traceback" not in text
    html = d / "report.html"
    if case.code == 0:  # written, and nothing of the secret in it, raw or base64
        page = html.read_text()
        assert SECRET not in page and base64.b64encode(SECRET.encode()).decode()[:16] not in page
        assert "<img" not in page  # none of these runs has a figure to embed
    elif case.report_writes:
        assert not html.exists() and not (d / "report.md").exists()
    else:  # report's own file names taken: nothing written, nothing removed
        assert case.after is not None and case.after(d)
    c = cli_in_process("compare", str(good_run), str(d), "--json")
    assert c.returncode == (case.code if case.report_writes else 0), c.stderr
    assert "internal error" not in c.stderr and "Traceback" not in c.stderr
    if c.returncode == 0:
        doc = json.loads(c.stdout)
        assert SECRET not in c.stdout and doc["rows"]
        if case.code == 0 and case.says.startswith(("not read", "figure not embedded")):
            assert any(case.says in n for n in doc["notes"]), doc["notes"]
    else:
        assert case.says in " ".join(c.stderr.split())


def test_a_real_run_directory_embeds_its_figures(tmp_path):
    """`run`'s layout: each stage's entry lives in <out>/.stages and is linked into the run directory; its figures
    (PNG, PNG, SVG) are regular files there, so all three are embedded and nothing is said about them."""
    run = make_run_dir(tmp_path / "runs")
    r = run_cli("report", str(run), "--json", timeout=120)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert set(doc["figures"]) == {"roofline", "latency_throughput", "kld_histogram"}
    assert doc["not_read"] == {} and doc["figures_not_embedded"] == {}
    page = (run / "report.html").read_text()
    assert page.count('<img alt="') == 3 and "figure not embedded" not in page
    assert page.count("data:image/png;base64,") == 2 and page.count("data:image/svg+xml;base64,") == 1


# ------------------------------------------------------------------------------------------ output paths (finding 14)
@pytest.fixture(scope="module")
def small_model(tmp_path_factory) -> Path:
    from tests.fakes import layout_model

    return layout_model(tmp_path_factory.mktemp("models") / "SmolLM2-135M-Instruct", "smollm2-135m", shards=1)


def _fifo(tmp: Path) -> str:
    os.mkfifo(tmp / "fifo.yaml")
    return str(tmp / "fifo.yaml")


def _link(tmp: Path) -> str:
    (tmp / "real.yaml").write_text("mine\n")
    os.symlink(tmp / "real.yaml", tmp / "link.yaml")
    return str(tmp / "link.yaml")


# each: how to make the path (in tmp), what the refusal says; `infertool init MODEL --out P --force` and
# `infertool recipes copy quickstart P --force` both refuse it (exit 2) before writing anything
OUTPUT_PATHS = {
    "empty": (lambda tmp: "", "an empty path: nothing to write to"),
    "stdout's fd link": (lambda tmp: "/proc/self/fd/1", "cannot write '/proc/self/fd/1': it is a symbolic link"),
    "under /proc": (lambda tmp: "/proc/self/x.yaml", "a system folder, not a place for files"),
    "a fifo": (_fifo, "fifo.yaml': it is a fifo"),
    "a link to a file": (_link, "link.yaml': it is a symbolic link"),
    "a missing folder": (lambda tmp: str(tmp / "no" / "such" / "r.yaml"), "folder"),
    "a file as its folder": (lambda tmp: ((tmp / "f").write_text("x"), str(tmp / "f" / "r.yaml"))[1], "is not a folder"),
}


@pytest.mark.parametrize("command", ["init", "copy"])
@pytest.mark.parametrize("name", list(OUTPUT_PATHS))
def test_an_output_path_that_cannot_be_a_file_is_refused(tmp_path, small_model, command, name):
    make, says = OUTPUT_PATHS[name]
    path = make(tmp_path)
    before = sorted(p.name for p in tmp_path.iterdir())
    args = ["init", str(small_model), "--cpu", "--out", path] if command == "init" else ["recipes", "copy", "quickstart", path]
    r = run_cli(*args, "--force", timeout=120)
    text = " ".join(r.stderr.split())
    assert r.returncode == 2 and says in text, text
    assert ("--out: " if command == "init" else "DEST: ") in text and "internal error" not in text
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # nothing written, nothing replaced
    if name == "a link to a file":
        assert (tmp_path / "link.yaml").is_symlink() and (tmp_path / "real.yaml").read_text() == "mine\n"
    if name == "a missing folder":
        assert "does not exist" in text


def test_copy_to_dash_is_refused_and_init_to_dash_prints(tmp_path, small_model):
    r = run_cli("recipes", "copy", "quickstart", "-", timeout=120)
    assert r.returncode == 2 and "`infertool recipes show quickstart` prints it" in " ".join(r.stderr.split())
    assert not (Path(__file__).resolve().parents[1] / "-").exists()
    r = run_cli("init", str(small_model), "--cpu", "--out", "-", timeout=120)
    assert r.returncode == 0 and r.stdout.startswith("# ") and "\nname: " in r.stdout, r.stderr


def test_copy_into_a_new_folder_under_a_system_folder_is_refused(tmp_path):
    r = run_cli("recipes", "copy", "quickstart", "/proc/infertool-new/", timeout=120)
    assert r.returncode == 2 and "under /proc, a system folder" in " ".join(r.stderr.split())
    r = run_cli("recipes", "copy", "quickstart", str(tmp_path / "a" / "b") + "/", timeout=120)  # created, as before
    assert r.returncode == 0 and (tmp_path / "a" / "b" / "quickstart.yaml").is_file(), r.stderr


# ------------------------------------------------------------------------------------------ YAML tags (finding 14)
TAGS = {
    "!!binary": "name: !!binary cXVpY2tzdGFydA==",
    "!!timestamp": "name: !!timestamp 2024-01-01",
    "!!set": "name: !!set {a, b}",
    "!!omap": "name: !!omap [{a: 1}]",
    "!!pairs": "name: !!pairs [{a: 1}]",
    "!!python/name:os.system": "name: !!python/name:os.system ''",
    "!local": "name: !local quickstart",
}


@pytest.mark.parametrize("tag", list(TAGS))
def test_a_yaml_tag_that_is_not_plain_is_refused_with_its_field(tmp_path, tag):
    from infertool.errors import RecipeError
    from infertool.recipe import load_recipe

    path = tmp_path / "r.yaml"
    path.write_text(f"{TAGS[tag]}\nmodel:\n  source: bundled:smollm2-135m\n  dtype: !!binary Zmxvb2F0MTY=\n")
    with pytest.raises(RecipeError) as info:
        load_recipe(path)
    got = [(i.path, i.line, i.message) for i in info.value.issues]
    assert got == [("name", 1, f"the YAML tag '{tag}' is not allowed: a recipe is text; write the value without a tag"),
                   ("model.dtype", 4, "the YAML tag '!!binary' is not allowed: a recipe is text; write the value without a tag")]


def test_yaml_tags_through_the_cli(tmp_path):
    """validate exits 2 naming the field, also for a tagged node an alias repeats (named where it is written) and
    for --set; the plain tags (!!str, !!int, !!float, !!bool, !!null, !) still read."""
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: &n !!binary cXVpY2tzdGFydA==\ndescription: *n\nmodel: {source: bundled:smollm2-135m}\n")
    r = run_cli("validate", str(bad), timeout=120)
    text = " ".join(r.stderr.split())
    assert r.returncode == 2 and "• name (line 1, column 7): the YAML tag '!!binary' is not allowed" in text, text
    assert "description" not in text
    good = tmp_path / "good.yaml"
    good.write_text("name: !!str quickstart\ndescription: ! plain\nmodel: {source: bundled:smollm2-135m, dtype: !!str auto}\n"
                    "quantize: {method: gptq, bits: !!int '4', group_size: !!int 64}\n")
    r = run_cli("validate", str(good), timeout=120)
    assert r.returncode == 0, r.stderr
    r = run_cli("validate", str(good), "--set", "name=!!binary aGk=", timeout=120)
    assert r.returncode == 2 and "the tag '!!binary' is not allowed" in " ".join(r.stderr.split()), r.stderr


# ------------------------------------------------------------------------------------------ the other outputs
@pytest.mark.parametrize("args, says", [
    # bench's --out / --plot (files) are checked before any request: as root, a rename over /dev/null replaced it
    (["bench", "quickstart", "--url", "http://127.0.0.1:1/v1", "--out", "/dev/null", "--force"],
     "cannot write '/dev/null': it is a character device"),
    (["bench", "quickstart", "--url", "http://127.0.0.1:1/v1", "--plot", "/proc/self/fd/2", "--force"],
     "cannot write '/proc/self/fd/2': it is a symbolic link"),
    (["profile", "quickstart", "--out", "/proc/infertool-x"], "under /proc, a system folder"),
    # eval export-lm-eval DIR: a folder, created when missing; not a file, a fifo or /proc
    (["eval", "export-lm-eval", "synthetic-mc", "/proc/self/fd/1"], "cannot write into '/proc/self/fd/1': it is"),
    (["eval", "export-lm-eval", "synthetic-mc", "/proc/infertool-x"], "under /proc, a system folder"),
    # run --out DIR: where run directories go (an internal error before: FileNotFoundError, NotADirectoryError)
    (["run", "quickstart", "--out", "/proc/infertool-x"], "--out: cannot write '/proc/infertool-x': it is under /proc"),
    (["run", "quickstart", "--out", "/proc/self/fd/1"], "--out: cannot write into '/proc/self/fd/1': it is"),
    (["run", "quickstart", "--out", ""], "--out: an empty path: no folder to write into"),
])
def test_other_outputs_are_checked_before_any_work(args, says):
    r = run_cli(*args, timeout=120)
    text = " ".join(r.stderr.split())
    assert r.returncode == 2 and says in text and "internal error" not in text, text
    assert Path("/dev/null").is_char_device()


def test_export_lm_eval_into_a_file_or_a_fifo_is_refused(tmp_path):
    (tmp_path / "file").write_text("mine")
    os.mkfifo(tmp_path / "fifo")
    for dest, says in ((tmp_path / "file" / "sub", "/file' is not a folder"), (tmp_path / "fifo", "it is a fifo, not a folder"),
                       (tmp_path / "file", "it is a regular file, not a folder")):
        r = run_cli("eval", "export-lm-eval", "synthetic-mc", str(dest), timeout=120)
        assert r.returncode == 2 and says in " ".join(r.stderr.split()), r.stderr
    assert (tmp_path / "file").read_text() == "mine"
    r = run_cli("eval", "export-lm-eval", "synthetic-mc", str(tmp_path / "new" / "tasks"), timeout=120)
    assert r.returncode == 0 and len(list((tmp_path / "new" / "tasks").glob("*.yaml"))) == 5, r.stderr
