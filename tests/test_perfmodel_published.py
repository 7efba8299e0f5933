"""The published calibration points (issue 42, item 2a): infertool/perfmodel/published/points.jsonl and sources.json.

Read with plain json here (the package's reader is infertool.perfmodel.points): every line has the schema's fields
with their types, ids are unique, every source is described with a url, every model / GPU is one the tool knows,
every figure is positive, bounded and physically possible (no decode faster than reading the weights once), and
the data meets the issue's counts (>= 40 points over >= 4 GPU kinds, 3 models, 3 weight formats)."""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path

import pytest

import infertool
from infertool.models.known import KNOWN_ARCHS
from infertool.perf.hardware import GPUS

PUBLISHED = Path(infertool.__file__).parent / "perfmodel" / "published"
WEIGHTS = {"bf16", "fp16", "fp8", "w8a8-int8", "w4a16", "w8a16", "fp32"}
STATS = {"mean", "median", "p50", "max"}
METRICS = {"ttft_ms": (0.1, 1e6), "tpot_ms": (0.1, 1e4), "itl_ms": (0.1, 1e4), "e2e_s": (0.01, 1e4),
           "output_tps": (0.1, 1e6), "total_tps": (0.1, 1e7), "requests_per_s": (1e-3, 1e4)}
FIELDS = {"format", "id", "source", "where", "model", "weights", "gpu", "gpus", "engine", "workload", "metrics",
          "stat", "date", "hardware"}
WORKLOAD = {"input_len", "output_len", "concurrency", "rate_rps", "num_prompts"}
BYTES_PER_PARAM = {"bf16": 2.0, "fp16": 2.0, "fp8": 1.0, "w8a8-int8": 1.0, "w8a16": 1.0, "w4a16": 0.5, "fp32": 4.0}


def _points() -> list[dict]:
    lines = (PUBLISHED / "points.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines if line.strip()]


def _sources() -> dict:
    return json.loads((PUBLISHED / "sources.json").read_text())


def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def test_every_line_has_the_schema_fields_with_their_types():
    points = _points()
    assert points
    for p in points:
        assert set(p) == FIELDS, p.get("id")
        assert p["format"] == 1 and p["hardware"] is None
        assert re.fullmatch(r"[a-z0-9][a-z0-9._-]{2,120}", p["id"]), p["id"]
        assert isinstance(p["where"], str) and 10 <= len(p["where"]) <= 300, p["id"]
        assert p["model"] in KNOWN_ARCHS, p["id"]
        assert p["weights"] in WEIGHTS and p["stat"] in STATS, p["id"]
        assert p["gpu"] in GPUS, p["id"]
        assert _is_int(p["gpus"]) and 1 <= p["gpus"] <= 8, p["id"]
        # null where the source does not say (sources.json's notes say so)
        assert p["engine"] is None or re.fullmatch(r"vllm==\d+\.\d+\.\d+(\.post\d+|\.\d+)?", p["engine"]), p["id"]
        assert p["date"] is None or re.fullmatch(r"20(2[3-6])-\d\d-\d\d", p["date"]), p["id"]
        w = p["workload"]
        assert set(w) == WORKLOAD, p["id"]
        assert _is_int(w["input_len"]) and 1 <= w["input_len"] <= 200_000, p["id"]
        assert _is_int(w["output_len"]) and 1 <= w["output_len"] <= 100_000, p["id"]
        # closed loop (concurrency), open loop (rate) or offline (num_prompts): exactly one describes the load
        kinds = [k for k in ("concurrency", "rate_rps") if w[k] is not None]
        assert len(kinds) <= 1 and (kinds or w["num_prompts"] is not None), p["id"]
        for k in ("concurrency", "num_prompts"):
            assert w[k] is None or (_is_int(w[k]) and 1 <= w[k] <= 100_000), p["id"]
        assert w["rate_rps"] is None or (isinstance(w["rate_rps"], (int, float)) and 0 < w["rate_rps"] <= 1e4)
        m = p["metrics"]
        assert m and set(m) <= set(METRICS), p["id"]
        for k, v in m.items():
            lo, hi = METRICS[k]
            assert isinstance(v, (int, float)) and not isinstance(v, bool) and lo <= v <= hi, (p["id"], k, v)


def test_ids_are_unique_and_every_source_is_described():
    points, sources = _points(), _sources()
    ids = Counter(p["id"] for p in points)
    assert [i for i, n in ids.items() if n > 1] == []
    for key, s in sources.items():
        # the store's reader takes these text fields only
        assert set(s) <= {"url", "title", "publisher", "date", "how", "notes"}, key
        assert all(isinstance(v, str) and len(v) <= 4000 for v in s.values()), key
        assert s["url"].startswith("https://"), key
        assert all(isinstance(s.get(f), str) and s[f] for f in ("title", "publisher", "date", "how")), key
    used = {p["source"] for p in points}
    assert used <= set(sources), used - set(sources)
    assert set(sources) <= used, set(sources) - used  # no source described without a point


def test_no_point_decodes_faster_than_reading_the_weights_once():
    """A transcription slip (a decimal point, a column) shows as a figure the GPU cannot reach: every decode step
    reads all weights, so a request's time per output token is at least weight bytes / (bandwidth x GPUs)."""
    checked = 0
    for p in _points():
        arch = KNOWN_ARCHS[p["model"]][0]
        g = GPUS[p["gpu"]]
        floor_s = arch.linear_params_total * BYTES_PER_PARAM[p["weights"]] / (g.bandwidth_bytes_s * p["gpus"])
        w, m = p["workload"], p["metrics"]
        per_token = []
        if "tpot_ms" in m:
            per_token.append(m["tpot_ms"] / 1000)
        if "itl_ms" in m:
            per_token.append(m["itl_ms"] / 1000)
        if "e2e_s" in m and w["concurrency"] == 1:
            per_token.append(m["e2e_s"] / w["output_len"])
        if "output_tps" in m and w["concurrency"] is not None:
            per_token.append(w["concurrency"] / m["output_tps"])  # each of c streams gets output_tps / c
        for t in per_token:
            assert 0.8 * floor_s <= t <= 60 * floor_s + 0.2, (p["id"], t, floor_s)
            checked += 1
    assert checked >= 40


def test_the_published_points_meet_the_issues_counts():
    points = _points()
    assert len(points) >= 40
    assert len({p["gpu"] for p in points}) >= 4
    assert len({p["model"] for p in points}) >= 3
    assert len({p["weights"] for p in points}) >= 3
    assert len({p["source"] for p in points}) >= 6  # leave-one-source-out needs several sources


@pytest.mark.parametrize("name", ["points.jsonl", "sources.json"])
def test_the_package_ships_the_published_files(name):
    """pyproject's package-data names them, so a wheel carries them."""
    text = (Path(infertool.__file__).parent.parent / "pyproject.toml").read_text()
    assert f"perfmodel/published/*{Path(name).suffix}" in text
    assert (PUBLISHED / name).is_file()
