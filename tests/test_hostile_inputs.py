"""Issue 34, findings 6, 7 and 8: every input file a recipe or a flag names (bench prompts, traces, eval suites and
their data, decode prompts, init --traffic) is read by one reader, infertool/inputs.py, and checked before any
work. Each case hands the real CLI a hostile file (binary, empty, a directory, a fifo, a 1 TiB sparse file, a link
into /proc, JSON nested 50,000 deep, bad UTF-8, a NaN timestamp, duplicate decode ids) and asserts the exit code
(2), the message naming the field and the file, and no traceback. Every call has a deadline: a hang fails."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest

from infertool import inputs
from tests.conftest import cli_in_process, deadline
from tests.fakes import layout_model

QUICKSTART = str(Path(__file__).resolve().parents[1] / "recipes" / "quickstart.yaml")
TIB = 2**40
TRACE_LINE = '{"timestamp": 0, "prompt": "hello", "output_length": 4}\n'
MC_ITEM = '{"id": "a", "question": "one or two?", "choices": ["one", "two"], "answer": 0}\n'


def cli(*args: str):
    with deadline(60):
        r = cli_in_process(*args)
    assert "Traceback" not in r.stderr and "internal error" not in r.stderr, r.stderr
    return r


# each hostile file: how to make it (at PATH) and what the message says
def _binary(p: Path) -> None:
    p.write_bytes(b"\x7fELF\x02\x01\x01\x00" + bytes(range(256)))


def _sparse(p: Path) -> None:
    with open(p, "wb") as f:
        f.truncate(TIB)  # a hole: no disk, no time; read whole it would never end


def _proc(p: Path) -> None:
    p.symlink_to("/proc/self/environ")


def _deep(p: Path) -> None:
    p.write_text("[" * 50_000 + "]" * 50_000 + "\n")


def _bad_utf8(p: Path, first: str = TRACE_LINE) -> None:
    p.write_bytes(first.encode() + b'{"prompt": "caf\xe9"}\n')


HOSTILE = {
    "binary": (_binary, ":1: a NUL byte: a binary file, not "),
    "empty": (lambda p: p.write_text("\n  \n"), "empty"),
    "directory": (lambda p: p.mkdir(), ": a directory, not "),
    "fifo": (lambda p: os.mkfifo(p), ": a fifo, not "),  # refused on its stat: nothing opens it (which would block)
    "sparse_1tib": (_sparse, ": too large (1 TiB; "),
    "proc_link": (_proc, ": a file of /proc (it resolves to /proc/"),
    "deep_json": (_deep, "1: not valid JSON (nested deeper than 64 levels)"),  # ":1:", or "line 1:" in a list
    "bad_utf8": (_bad_utf8, ":2: not UTF-8 text (byte 0xe9 at column 16)"),
}
JSON_ONLY = {"deep_json"}  # a YAML suite is not JSON


def _make(tmp_path: Path, kind: str, name: str) -> Path:
    path = tmp_path / name
    HOSTILE[kind][0](path)
    return path


# the recipe fields that name an input file, each as `--set FIELD=PATH` on quickstart
FIELDS = {"bench.trace": "trace.jsonl", "bench.prompt.source": "prompts.jsonl", "eval.decode.prompts": "decode.jsonl",
          "eval.suite": "suite.yaml"}


@pytest.mark.parametrize("field, kind", [(f, k) for f in FIELDS for k in HOSTILE
                                         if not (f == "eval.suite" and k in JSON_ONLY)])  # a suite is YAML
def test_validate_refuses_a_hostile_input_file_naming_the_field_and_the_file(tmp_path, field, kind):
    path = _make(tmp_path, kind, FIELDS[field])
    r = cli("validate", QUICKSTART, "--set", f"{field}={path}")
    assert r.returncode == 2, r.stderr
    assert f"error: input_files: {field}: {path}" in r.stderr, r.stderr
    assert HOSTILE[kind][1] in r.stderr, r.stderr


@pytest.mark.parametrize("kind", list(HOSTILE))
def test_a_suite_data_file_is_read_by_the_same_reader(tmp_path, kind):
    """`eval suites --show` and `eval --dry-run` on a suite whose data file is hostile (MemoryError on 1 TiB, a
    UnicodeDecodeError, a /proc link were internal errors)."""
    data = _make(tmp_path, kind, "data.jsonl")
    suite = tmp_path / "suite.yaml"
    suite.write_text(f"name: s\ntasks:\n  - {{name: t, type: multiple_choice, data: {data.name}}}\n")
    for args in (("eval", "suites", "--show", str(suite)),
                 ("eval", QUICKSTART, "--dry-run", "--set", f"eval.suite={suite}")):
        r = cli(*args)
        assert r.returncode == 2, r.stderr
        assert str(data) in r.stderr and HOSTILE[kind][1] in r.stderr, r.stderr


@pytest.mark.parametrize("kind", [k for k in HOSTILE if k not in JSON_ONLY])
def test_eval_suites_show_refuses_a_hostile_suite_file(tmp_path, kind):
    suite = _make(tmp_path, kind, "suite.yaml")
    r = cli("eval", "suites", "--show", str(suite))
    assert r.returncode == 2, r.stderr
    assert f"eval.suite: {suite}" in r.stderr and HOSTILE[kind][1] in r.stderr, r.stderr


def _model(tmp_path: Path) -> Path:
    """A model folder shaped like SmolLM2-135M (the bundled model is installed only with the quant env)."""
    return layout_model(tmp_path / "SmolLM2-135M", "smollm2-135m", shards=1)


@pytest.mark.parametrize("kind", list(HOSTILE))
def test_init_traffic_refuses_a_hostile_prompt_file(tmp_path, kind):
    """init --traffic with a binary file, 50k-deep JSON or a link to /proc were internal errors (exit 4)."""
    path = _make(tmp_path, kind, "traffic.jsonl")
    r = cli("init", str(_model(tmp_path)), "--traffic", str(path))
    assert r.returncode == 2, r.stderr
    assert f"--traffic: {path}" in r.stderr and HOSTILE[kind][1] in r.stderr, r.stderr


def test_init_traffic_through_a_link_to_proc_self_mem(tmp_path):
    """A link to /proc/self/mem stats as a regular file of size 0: refused by where it resolves, never read."""
    path = tmp_path / "traffic.jsonl"
    path.symlink_to("/proc/self/mem")
    r = cli("init", str(_model(tmp_path)), "--traffic", str(path))
    assert r.returncode == 2 and "a file of /proc" in r.stderr, r.stderr


@pytest.mark.parametrize("argv", [["run", QUICKSTART, "--dry-run"], ["eval", QUICKSTART, "--dry-run"],
                                  ["bench", QUICKSTART, "--dry-run"], ["validate", QUICKSTART]],
                         ids=["run", "eval", "bench", "validate"])
def test_a_1_tib_decode_prompt_file_ends_at_once_in_every_dry_run(tmp_path, argv):
    """Finding 6: `run --dry-run` hashed input files whole and did not end in 60 s on a 1-2 TiB sparse file."""
    path = _make(tmp_path, "sparse_1tib", "decode.jsonl")
    r = cli(*argv, "--set", f"eval.decode.prompts={path}")
    assert r.returncode == 2, r.stderr
    assert f"eval.decode.prompts: {path}: too large (1 TiB; a decode prompt file is at most 8 MiB)" in r.stderr


def test_a_1_tib_bench_prompt_file_ends_at_once_in_run_dry_run(tmp_path):
    path = _make(tmp_path, "sparse_1tib", "prompts.jsonl")
    r = cli("run", QUICKSTART, "--dry-run", "--set", f"bench.prompt.source={path}")
    assert r.returncode == 2 and "too large (1 TiB; a prompt file is at most 256 MiB)" in r.stderr, r.stderr


@pytest.mark.parametrize("argv", [["validate", QUICKSTART], ["bench", QUICKSTART, "--dry-run"],
                                  ["run", QUICKSTART, "--dry-run"]], ids=["validate", "bench", "run"])
def test_a_nan_timestamp_in_a_trace_is_refused_before_any_request(tmp_path, argv):
    """Finding 8: a NaN trace was found only after the concurrency sweep had run against the server."""
    trace = tmp_path / "trace.jsonl"
    trace.write_text(TRACE_LINE + '{"timestamp": NaN, "prompt": "x", "output_length": 4}\n')
    r = cli(*argv, "--set", f"bench.trace={trace}")
    assert r.returncode == 2, r.stderr
    assert f"bench.trace: {trace}:2: not valid JSON (NaN is not a JSON number)" in r.stderr, r.stderr


def test_bench_refuses_a_bad_trace_in_its_plan_before_any_server(tmp_path):
    """The real bench (not a dry run) reads the trace in its plan: against a --url that nothing listens on, the
    trace is what it says, not a connection error after a sweep."""
    trace = tmp_path / "trace.jsonl"
    trace.write_text(TRACE_LINE + '{"timestamp": 1, "prompt": "x", "output_length": Infinity}\n')
    r = cli("bench", QUICKSTART, "--url", "http://127.0.0.1:9", "--set", f"bench.trace={trace}")
    assert r.returncode == 2, r.stderr
    assert f"{trace}:2: not valid JSON (Infinity is not a JSON number)" in r.stderr, r.stderr


def test_a_trace_in_infertool_s_own_spelling_is_refused_by_name(tmp_path):
    """docs/commands/bench.md said `t_s` / `output_len`; the code reads Mooncake's `timestamp` / `output_length`.
    The docs now say the latter; a trace written after the old docs is told which fields it needs."""
    trace = tmp_path / "trace.jsonl"
    trace.write_text('{"t_s": 0, "prompt": "x", "output_len": 4}\n')
    r = cli("validate", QUICKSTART, "--set", f"bench.trace={trace}")
    assert r.returncode == 2, r.stderr
    assert f"{trace}:1: `t_s` and `output_len` are not trace fields" in r.stderr, r.stderr
    assert "`timestamp` (seconds)" in r.stderr
    docs = (Path(__file__).resolve().parents[1] / "docs" / "commands" / "bench.md").read_text()
    assert "`timestamp`" in docs and "`output_length`" in docs and "(`t_s`, `prompt`, `output_len`)" not in docs


@pytest.mark.parametrize("argv", [["validate", QUICKSTART], ["eval", QUICKSTART, "--dry-run"]], ids=["validate", "eval"])
def test_duplicate_decode_prompt_ids_are_refused_before_any_work(tmp_path, argv):
    path = tmp_path / "decode.jsonl"
    path.write_text('{"id": 7, "prompt": "a"}\n{"id": "7", "prompt": "b"}\n')
    r = cli(*argv, "--set", f"eval.decode.prompts={path}", "--set", "eval.engine=vllm")
    assert r.returncode == 2, r.stderr
    assert f"eval.decode.prompts: {path}: 1 bad line(s): line 2: duplicate id '7'" in r.stderr, r.stderr


def test_a_good_input_file_passes(tmp_path):
    trace = tmp_path / "trace.jsonl"
    trace.write_text(TRACE_LINE)
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('"hello"\n{"prompt": "there"}\n')
    r = cli("validate", QUICKSTART, "--set", f"bench.trace={trace}", "--set", f"bench.prompt.source={prompts}")
    assert r.returncode == 0, r.stderr


# ------------------------------------------------------------------------------------------ inputs.py itself
def test_read_text_checks_the_file_before_reading(tmp_path):
    good = tmp_path / "a.jsonl"
    good.write_text('{"x": 1}\n\n[2]\n')
    assert inputs.read_jsonl(good, inputs.TRACE, "bench.trace") == [(1, {"x": 1}), (3, [2])]
    with pytest.raises(inputs.InputFileError, match=r"bench.trace: .*: not found \(no such file\)"):
        inputs.read_text(tmp_path / "absent", inputs.TRACE, "bench.trace")
    link = tmp_path / "null.jsonl"
    link.symlink_to("/dev/null")
    with pytest.raises(inputs.InputFileError, match="a file of /dev"):
        inputs.read_text(link, inputs.TRACE, "bench.trace")
    small = inputs.Kind("a tiny file", 4)
    with pytest.raises(inputs.InputFileError, match=r"too large \(14 bytes; a tiny file is at most 4 bytes\)"):
        inputs.read_text(good, small, "x")
    assert inputs.InputFileError("m").exit_code == 2


def test_read_jsonl_bounds_its_rows(tmp_path):
    p = tmp_path / "rows.jsonl"
    p.write_text("1\n2\n3\n")
    with pytest.raises(inputs.InputFileError, match="more than 2 lines"):
        inputs.read_jsonl(p, inputs.PROMPTS, "bench.prompt.source", max_rows=2)
    p.write_text('{"a": 1}\n{oops\n')
    with pytest.raises(inputs.InputFileError, match=r"rows.jsonl:2: not valid JSON"):
        inputs.read_jsonl(p, inputs.PROMPTS, "bench.prompt.source")


def test_parse_jsonl_can_collect_every_bad_line():
    """The one JSONL reader, for a caller that lists every bad line in one error: the good rows come back, each bad
    line is said by its number, and no line bound applies with max_rows None."""
    bad: dict[int, str] = {}
    rows = inputs.parse_jsonl('{oops\n{"a": 1}\n\n[NaN]\n2\n', "f.jsonl", "w", max_rows=None, bad=bad)
    assert rows == [(2, {"a": 1}), (5, 2)]
    assert bad == {1: "line 1: not valid JSON (Expecting property name enclosed in double quotes)",
                   4: "line 4: not valid JSON (NaN is not a JSON number)"}
    assert len(inputs.parse_jsonl("1\n" * 3, "f.jsonl", "w", max_rows=None)) == 3


@pytest.mark.parametrize("text, why", [("[NaN]", "NaN is not a JSON number"), ('{"t": -Infinity}', "-Infinity is not"),
                                       ("[1e999]", "out of a number's range"), ("[" * 65 + "]" * 65, "deeper than 64"),
                                       ("[" * 50_000 + "]" * 50_000, "deeper than 64"), ("{", "Expecting")])
def test_parse_json_refuses_what_is_not_bounded_json(text, why):
    with pytest.raises(ValueError, match=why):
        inputs.parse_json(text)
    assert inputs.parse_json("[" * 64 + "]" * 64) is not None and inputs.parse_json('{"a": 1.5}') == {"a": 1.5}


def test_fingerprint_is_bounded_and_whole_up_to_its_size(tmp_path):
    small = tmp_path / "small.jsonl"
    small.write_text("hello\n")
    assert inputs.fingerprint(small) == hashlib.sha256(b"hello\n").hexdigest()  # the keys of before
    big = tmp_path / "big"
    _sparse(big)
    with deadline(30):
        first = inputs.fingerprint(big)
    assert first is not None and first != hashlib.sha256(b"").hexdigest()
    with open(big, "r+b") as f:  # a change in its tail changes it
        f.seek(TIB - 10)
        f.write(b"x")
    assert inputs.fingerprint(big) != first
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    proc = tmp_path / "proc"
    proc.symlink_to("/proc/self/status")
    with deadline(10):
        assert [inputs.fingerprint(p) for p in (fifo, tmp_path, proc, tmp_path / "absent")] == [None] * 4


def test_the_input_files_check_is_in_the_registry():
    from infertool import checks

    assert "input_files" in checks.names()
    assert json.dumps(checks.get("input_files").summary)
