"""benchmarks/spec_decode_workloads.py's code-edit workload: seeded chats whose reference reply repeats the
prompt's code with one variable renamed, in a form the bench's conversation loader reads; and its table rows
read from the bench's experiment block."""

from __future__ import annotations

import json
import re
import runpy
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MOD = runpy.run_path(str(ROOT / "benchmarks" / "spec_decode_workloads.py"))


def test_code_edit_chats_rename_one_variable_and_repeat_the_rest(tmp_path):
    chats = MOD["code_edit_chats"](48, seed=0)
    assert chats == MOD["code_edit_chats"](48, seed=0) and chats != MOD["code_edit_chats"](48, seed=1)
    assert len({c["id"] for c in chats}) == 48
    for c in chats:
        user, reply = c["messages"]
        old, new = re.match(r"Rename the variable `(\w+)` to `(\w+)`", user["content"]).groups()
        src = user["content"].split("```python\n", 1)[1].rsplit("\n```", 1)[0]
        out = reply["content"].removeprefix("```python\n").removesuffix("\n```")
        assert re.search(rf"\b{old}\b", src) and not re.search(rf"\b{old}\b", out)
        assert out == re.sub(rf"\b{old}\b", new, src) and out.count(new) >= 4  # long repeated spans: n-gram food
    from infertool.bench.datasets import read_chat_jsonl

    path = tmp_path / "code-edit.jsonl"
    path.write_text("".join(json.dumps(c) + "\n" for c in chats))
    got = read_chat_jsonl(path)
    assert len(got) == 48 and [r for r, _ in got[0]] == ["user", "assistant"]


def test_rows_read_acceptance_and_speed_up_from_the_experiment():
    fig = lambda a, b, ratio=None: {"a": a, "b": b, "ratio": ratio}  # noqa: E731
    doc = {"experiments": [{"experiment": "prefix_caching", "rows": [{"level": "x"}]},
                           {"experiment": "speculative", "rows": [{"level": "concurrency 1", "figures": {
                               "spec_decode_acceptance_rate": fig(None, 0.62),
                               "spec_decode_mean_accepted_len": fig(None, 3.5),
                               "output_token_throughput": fig(31.7, 54.4, 1.72),
                               "tpot_p50_ms": fig(31.2, 17.3, 0.56)}}]}]}
    rows = MOD["rows_of"]("code-edit", doc)
    assert rows == [{"workload": "code-edit", "level": "concurrency 1", "acceptance": 0.62, "mean_accepted_len": 3.5,
                     "tok_s_off": 31.7, "tok_s_on": 54.4, "speedup": 1.72, "tpot_p50_ms_off": 31.2,
                     "tpot_p50_ms_on": 17.3}]
    assert MOD["rows_of"]("x", {"experiments": None}) == []
