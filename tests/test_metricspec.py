"""The metric table (infertool.metricspec): one line declares a bench metric; bench's tables, A/B figures, the
report, compare and tune's objectives read it. TTFT p90 was added through it alone."""

from __future__ import annotations

import pytest

from infertool.bench.core import ab_table
from infertool.bench.results import BenchReport, LevelResult, Summary
from infertool.metricspec import METRICS, TTFT_P90_MS, metric, objective, objective_names
from infertool.tune import search
from infertool.tune.records import CapacityResult


def _level(p90: float) -> LevelResult:
    s = Summary.from_dict({"requests": 4, "completed": 4, "output_token_throughput": 100.0,
                           "ttft_ms": {"p50": 10.0, "p90": p90, "p99": 90.0}})
    return LevelResult.from_dict({"arm": "a", "level": {"kind": "concurrency", "value": 2, "label": "c2"},
                                  "summary": s.to_dict()})


def test_every_metric_is_declared_once_with_its_reading() -> None:
    names = [m.name for m in METRICS]
    assert len(names) == len(set(names))
    assert metric("ttft_p90_ms") is TTFT_P90_MS
    assert TTFT_P90_MS.of(_level(42.0).summary) == 42.0
    assert TTFT_P90_MS.of({"ttft_ms": {"p90": 7}}) == 7.0  # tune's short summaries (JSON data) read the same
    assert TTFT_P90_MS.of(Summary()) is None  # not measured


def test_ttft_p90_is_in_bench_tables_ab_figures_and_the_report(capsys: pytest.CaptureFixture[str]) -> None:
    from infertool.bench.console import render
    from infertool.report.bench import bench_rows as _bench_rows

    report = BenchReport(model="m", levels=[_level(42.0)])
    render(report)
    assert "TTFT p90" in capsys.readouterr().out
    rows = _bench_rows(report)
    col = rows[0].index("TTFT p90 ms")
    assert rows[1][col].startswith("42")
    exp = ab_table("x", "A", "B", [_level(40.0)], [_level(20.0)])
    fig = exp.rows[0].figures["ttft_p90_ms"]
    assert (fig.a, fig.b, fig.ratio, fig.higher_is_better) == (40.0, 20.0, 0.5, False)


def test_ttft_p90_is_a_tune_objective() -> None:
    from infertool.recipe import TuneSection

    assert "ttft_p90" in objective_names()
    assert TuneSection(candidates=["none"], objective="ttft_p90").objective == "ttft_p90"
    with pytest.raises(Exception):
        TuneSection(candidates=["none"], objective="ttft_p91")
    cap = CapacityResult(max_load=4, at_max_load={"ttft_ms": {"p90": 55.0}})
    assert search.objective_value("ttft_p90", cap) == 55.0  # lower is better: as measured
    assert objective("ttft_p90").objective_text.startswith("TTFT p90")
