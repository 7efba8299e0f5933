"""Issue 44 item 1: a tune starts vLLM once per distinct serve configuration (the tune's ``ServerPool``), every stage
that needs that configuration (reference, screening, its lossless check, capacity per class, the served check) uses
it while it is up; a per-class tune starts no more servers than a plain one; a resumed tune none; tune.json and
routing.json list every start with why.

vLLM itself is replaced below the one launcher (``infertool.serve.launcher.Server``: no process, each start counted);
everything above it is infertool's own: the stage bodies' launches (``stages.launch_scored`` as the accuracy stages
call it, the real ``run_capacity`` with its load search stood in), ``prepare``, the launch keys and the pool."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import pytest

from infertool.recipe import validate_recipe_data
from tests.test_tune import Stand, smol, tune_recipe  # noqa: F401 - smol: the fixture
from tests.test_tune_classes import classed_recipe

W8 = "W8A8 (llmcompressor)"
ORIGINAL_SEARCH = __import__("infertool.tune.stages", fromlist=["_search_load"])._search_load
ORIGINAL_ALONE = __import__("infertool.tune.stages", fromlist=["Probes"]).Probes.alone


class FakeVllm:
    """``serve.launcher.Server`` without a process: ``starts`` holds each start's command line."""

    starts: list[list[str]] = []

    def __init__(self, spec, log_path, *, detached: bool = False):
        self.spec, self.log_path, self.pid = spec, Path(log_path), None

    def start(self) -> None:
        if self.spec.port is None:
            self.spec = self.spec.at_port(40000 + len(FakeVllm.starts))
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self.log_path.write_text(f"# fake infertool serve: {' '.join(self.spec.argv)}\n")
        FakeVllm.starts.append(list(self.spec.argv))

    def wait_ready(self, timeout_s=None, on_tick=None):
        from infertool.serve.launcher import ReadyInfo

        return ReadyInfo(f"http://127.0.0.1:{self.spec.port}/v1", 0.5, ["stub"])

    def alive(self) -> bool:
        return True

    def stop(self) -> None:
        pass


class ServedStand(Stand):
    """The accuracy stages launch exactly as their bodies do (``launch_scored`` on the stage's resolution; a
    speculative screening's lossless check on the same settings without ``speculative``) and score nothing; the
    capacity stage is the real one with its load search stood in."""

    def __init__(self, monkeypatch, smol_dir: Path, **kw):
        super().__init__(monkeypatch, **kw)
        from infertool import stages
        from infertool.tune import stages as tune_stages

        self.smol = smol_dir
        monkeypatch.setitem(stages.REGISTRY.by_name, "capacity", replace(stages.get("capacity"), run=tune_stages.run_capacity))
        monkeypatch.setattr(tune_stages, "_search_load", self.search)
        monkeypatch.setattr(tune_stages.Probes, "alone", lambda probes, c, why: self.alone(c))
        monkeypatch.setattr("infertool.serve.launcher.Server", FakeVllm)
        monkeypatch.setattr("infertool.serve.launches.require_server_env", lambda plan: None)
        monkeypatch.setattr("infertool.serve.start_times.note_launch", lambda *a, **kw: None)  # not this host's times
        monkeypatch.setattr("infertool.serve.pool.ServerPool.pause", lambda self, why, keep=None: None)
        FakeVllm.starts = []

    def quantize(self, ctx):
        out = super().quantize(ctx)
        shutil.copy(self.smol / "config.json", ctx.work / "model" / "config.json")  # a servable stand-in checkpoint
        return out

    def _served(self, ctx, label: str, figure):
        from infertool.stages.builtin import resolution
        from infertool.tune.stages import launch_scored

        res = resolution(ctx)
        model = res.base if label == "reference" else res.served
        out = launch_scored(res, model, ctx, f"tune: {label}", lambda sc: figure, label)
        if label != "reference" and res.serve_section.speculative is not None:  # the lossless check's plain server
            plain = res.serve_section.model_copy(update={"speculative": None})
            launch_scored(res, res.served, ctx, f"tune: {label} without speculation", lambda sc: None, "plain",
                          serve=plain)
        return out

    def reference(self, ctx):
        return self._served(ctx, "reference", super().reference(ctx))

    def screen(self, ctx):
        if "quantize" not in ctx.upstream:  # the original's own screening (its speculative settings change outputs)
            self.calls.append("screen:original")
            return self._served(ctx, "screen", {"verdict": "PASS", "reason": "stand-in", "items": 2, "mean_kld": 0.0,
                                                "rounds": [{"items": 2}], "stopped_early": True})
        return self._served(ctx, "screen", super().screen(ctx))

    def served_check(self, ctx):
        return self._served(ctx, "served", super().served_check(ctx))

    def alone(self, c: int):
        from infertool.bench.results import LevelResult

        self.calls.append(f"alone:{c}")
        return LevelResult()

    def search(self, ctx, res, srv, hi, levels, journal=None):
        from infertool.tune import search
        from infertool.tune.records import Probe, ProbeSummary

        trial, cls = ctx.job.trial, ctx.job.tune.bench.classes.replay
        self.calls.append(f"capacity:{cls}:{trial.id}")
        load, cost = self.loads[(trial.candidate.label, "ngram k=2" if trial.serve.get("speculative") else "none")]
        at = ProbeSummary.from_dict({"cost": {"per_1m_output_tokens": cost}, "tpot_ms": {"p50": 50.0},
                                     "goodput": {"requests_per_s": 1.0}, "output_token_throughput": 100.0 / cost})
        return search.LoadSearch(load, [Probe(concurrency=load, ok=True, goodput_fraction=1.0, summary=at)], "stand-in")


def _keys(tune_json: dict) -> list[str]:
    return [s["key"] for s in tune_json["servers"]]


def _recipe(smol, tmp_path, classes, grid=None):
    data = classed_recipe(smol, tmp_path, classes=classes)
    data["tune"]["serve_grid"] = grid or {"max_num_seqs": [4]}
    return validate_recipe_data(data)


LOADS = {("original", "none"): (4, 8.0), (W8, "none"): (4, 4.0)}


def test_a_plain_tune_starts_each_serve_configuration_once(smol, tmp_path, monkeypatch):
    from infertool.tune.run import run_tune

    stand = ServedStand(monkeypatch, smol, verdicts={W8: "PASS"}, loads=LOADS, served={})
    result = run_tune(_recipe(smol, tmp_path, classes=None))
    doc = json.loads((Path(result.tune_dir) / "tune.json").read_text())
    keys = _keys(doc)
    # the reference (the original, the recipe's settings), W8A8's screening (the recipe's settings), and each
    # trial's exact settings (max_num_seqs 4) for capacity and the served check: four configurations, four starts
    assert len(keys) == len(set(keys)) == len(FakeVllm.starts) == 4
    purposes = [s["purpose"] for s in doc["servers"]]
    assert purposes[0] == "tune: reference" and any(p.startswith("capacity ") for p in purposes)
    # the winner's served check found its capacity server up: shared, not started again
    served = [s for s in doc["servers"] if any(u.startswith("served ") for u in s["used_by"])]
    assert len(served) == 1 and served[0]["started_by"].startswith("capacity ")
    assert stand.calls.count("served:" + result.winner.id) == 1
    # each start says who started it, for what, how long it took to answer and why it stopped (tune.json is
    # written before the tune's end stops them: "the run ended" is the pool's word when it closes)
    assert all(s["start_s"] == 0.5 and s["log"] and s["started_by"] for s in doc["servers"])
    # resumed: every stage is reused; the one start is the winner's evidence, captured again as it is published
    # again (publishing is not a stage)
    FakeVllm.starts.clear()
    stand.calls.clear()
    again = run_tune(_recipe(smol, tmp_path, classes=None))
    resumed = json.loads((Path(again.tune_dir) / "tune.json").read_text())["servers"]
    assert [s["started_by"] for s in resumed] == [f"evidence {again.winner.label}"] and len(FakeVllm.starts) == 1
    assert stand.calls == []


def test_a_per_class_tune_starts_no_more_servers_than_a_plain_one(smol, tmp_path, monkeypatch):
    from infertool.tune.classes import run_per_class
    from infertool.tune.run import run_tune

    stand = ServedStand(monkeypatch, smol, verdicts={W8: "PASS"}, loads=LOADS, served={})
    (tmp_path / "plain").mkdir()
    run_tune(_recipe(smol, tmp_path / "plain", classes=None))
    plain = len(FakeVllm.starts)
    FakeVllm.starts.clear()
    stand.calls.clear()
    per = run_per_class(_recipe(smol, tmp_path, classes=True))
    routing = json.loads((Path(per.tune_dir) / "routing.json").read_text())
    keys = _keys(routing)
    assert len(FakeVllm.starts) == len(keys) == len(set(keys)) == plain == 4
    # every class's capacity was measured, the second class's on the server the first class's measurement started
    caps = [c for c in stand.calls if c.startswith("capacity:")]
    assert sorted(c.split(":")[1] for c in caps) == ["chat", "chat", "rag", "rag"]
    cap_servers = [s for s in routing["servers"] if s["started_by"].startswith("capacity ")]
    assert len(cap_servers) == 2 and all(s["started_by"].endswith("(class chat)") for s in cap_servers)
    assert all(any(u.endswith("(class rag)") for u in s["used_by"]) for s in cap_servers)
    # each class's tune.json lists the starts made while it ran: the second class made none
    starts = {name: json.loads((Path(per.tune_dir) / "classes" / name / "tune.json").read_text())["servers"]
              for name in ("chat", "rag")}
    assert len(starts["chat"]) == 4 and starts["rag"] == []


def test_a_speculative_grid_starts_one_server_per_setting(smol, tmp_path, monkeypatch):
    """The issue's case: the recipe's own settings are a grid point. The screening of a speculative setting serves
    exactly that trial's settings, its lossless check the same without speculation (the plain trial's, or the
    reference for the original), the reference the original's plain trial: one start per trial, nothing else."""
    from infertool.tune.run import run_tune

    grid = {"max_num_seqs": [4], "speculative": [None, {"method": "ngram", "num_speculative_tokens": 2}]}
    loads = {**LOADS, ("original", "ngram k=2"): (4, 7.0), (W8, "ngram k=2"): (4, 3.0)}
    data = classed_recipe(smol, tmp_path, classes=None)
    data["tune"]["serve_grid"] = grid
    data["serve"]["max_num_seqs"] = 4  # the recipe serves a grid point
    stand = ServedStand(monkeypatch, smol, verdicts={W8: "PASS"}, loads=loads, served={})
    result = run_tune(validate_recipe_data(data))
    doc = json.loads((Path(result.tune_dir) / "tune.json").read_text())
    keys = _keys(doc)
    assert len(keys) == len(set(keys)) == len(FakeVllm.starts) == len(result.trials) == 4
    assert sum("--speculative-config" in a for a in FakeVllm.starts) == 2
    # each speculative screening used two servers, both started by another stage or its own: its settings (then the
    # trial's capacity) and the same without speculation for its lossless check (the reference for the original,
    # W8A8's plain screening)
    spec_screens = {u for s in doc["servers"] for u in s["used_by"] if u.startswith("screen ") and "speculative" in u}
    assert len(spec_screens) == 2
    for user in spec_screens:
        assert sum(user in s["used_by"] for s in doc["servers"]) == 2
    assert sum(c.startswith("capacity") for c in stand.calls) == 4


@pytest.mark.parametrize("gpu", [False, True])
def test_a_measurement_alone_pauses_the_others_on_a_cpu_and_stops_them_on_a_gpu(tmp_path, gpu):
    from infertool.serve.pool import ServerPool
    from tests.test_pipeline import _gone, _stopped, stub_plan

    a, b = stub_plan(tmp_path, "a"), stub_plan(tmp_path, "b")
    pool = ServerPool(tmp_path / "servers", gpu=gpu, memory=lambda: 1 << 40)
    try:
        sa = pool.get(a, label="screen")
        sb = pool.get(b, label="capacity", alone=True)
        from tests.conftest import wait_for

        if gpu:
            assert _gone(sa) and pool.running() == [sb.key]
        else:  # kept, frozen while b is measured; running again when a stage next asks for a server
            assert pool.running() == [sa.key, sb.key]
            wait_for(lambda: _stopped(sa), 30, "the other server to be paused")
            assert not _stopped(sb) and pool.records[0]["paused_for"] == ["test measures another server alone"]
            again = pool.get(a, label="served")
            assert again.reused and again.pid == sa.pid
            wait_for(lambda: not _stopped(sa), 30, "the paused server to run again")
            assert len(pool.records) == 2
    finally:
        pool.close()


def test_a_resumed_capacity_search_reuses_every_probe_it_finished(smol, tmp_path, monkeypatch):
    """Interrupted in its third probe, the capacity search's first two probes are kept (the probe journal, by the
    stage's key); resumed with the same --out, they are read back, not measured again."""
    from infertool.bench.results import LevelResult
    from infertool.tune import stages as tune_stages
    from infertool.tune.run import run_tune

    data = classed_recipe(smol, tmp_path, classes=None)
    data["tune"]["candidates"] = ["none"]
    data["tune"]["serve_grid"] = {"max_num_seqs": [8]}
    data["tune"]["load"] = {"repeats": {"max_runs": 1, "min_runs": 1}}
    r = validate_recipe_data(data)
    ServedStand(monkeypatch, smol, verdicts={}, loads={}, served={})
    monkeypatch.setattr(tune_stages, "_search_load", ORIGINAL_SEARCH)
    monkeypatch.setattr("infertool.tune.space.capacity_start", lambda *a, **kw: None)
    monkeypatch.setattr("infertool.bench.sweep.connect", lambda handle, bench: handle)
    measured: list[int] = []
    stop_at = [3]

    def measure(handle, bench, levels, **kw):
        (level,) = levels
        if len(measured) + 1 == stop_at[0]:
            raise KeyboardInterrupt
        measured.append(level.value)
        good = 1.0 if level.value <= 4 else 0.5  # the SLO holds up to 4 concurrent requests
        return [LevelResult.from_dict({"arm": f"c{level.value}", "summary": {
            "requests": 20, "completed": 20, "output_token_throughput": 10.0 * level.value,
            "goodput": {"fraction": good}, "ttft_ms": {"p50": 100.0}}})]

    monkeypatch.setattr("infertool.bench.sweep.measure", measure)
    with pytest.raises(KeyboardInterrupt):
        run_tune(r)
    first = list(measured)
    assert len(first) == 2
    journal = list((Path(r.tune.out_dir) / r.name / ".stages" / "probes").glob("capacity-*/c*-r0.json"))
    assert sorted(p.name for p in journal) == sorted(f"c{c}-r0.json" for c in first)
    measured.clear()
    stop_at[0] = 0
    result = run_tune(r)
    assert not set(first) & set(measured)  # the finished probes were read back
    assert measured and result.trials[0].capacity.max_load == 4  # the search went on from where it stopped


def test_the_report_says_how_many_starts_and_why(smol, tmp_path, monkeypatch):
    from infertool.tune.run import run_tune

    ServedStand(monkeypatch, smol, verdicts={W8: "PASS"}, loads=LOADS, served={})
    result = run_tune(_recipe(smol, tmp_path, classes=None))
    md = (Path(result.tune_dir) / "tune.md").read_text()
    html_text = (Path(result.tune_dir) / "tune.html").read_text()
    assert "vLLM started 4 time(s) in this invocation" in md and "## vLLM starts: 4" in md
    assert "| 1 | reference (the original) | tune: reference |" in md
    assert "served W8A8 (llmcompressor) | max_num_seqs=4; evidence" in md.replace("\\|", "|")
    assert "<h2>vLLM starts: 4</h2>" in html_text


def test_a_per_class_tune_sends_the_mix_once_per_load_and_cuts_each_class_from_it(smol, tmp_path, monkeypatch):
    """Issue 44, item 2: each load of a configuration is one probe of the whole traffic, its requests tagged by
    class; every class's search reads its own requests from it under its own SLO (the second class measures only
    where the first class's search did not reach); a speculative setting's class sends its traffic alone once, for
    the acceptance per draft position the server counts for the mix. The report says which."""
    from infertool.bench.metrics import RequestResult, summarize
    from infertool.bench.results import LevelResult
    from infertool.bench.sweep import class_figures
    from infertool.tune import stages as tune_stages
    from infertool.tune.classes import run_per_class

    data = classed_recipe(smol, tmp_path, classes=["chat", {"name": "rag", "slo": {"ttft_ms": 3000}}], requests=120)
    data["tune"]["candidates"] = ["none"]
    data["tune"]["serve_grid"] = {"max_num_seqs": [8], "speculative": [None, {"method": "ngram",
                                                                              "num_speculative_tokens": 2}]}
    data["tune"]["load"] = {"repeats": {"max_runs": 1, "min_runs": 1}, "max_probes": 8}
    ServedStand(monkeypatch, smol, verdicts={}, loads={}, served={})
    monkeypatch.setattr(tune_stages, "_search_load", ORIGINAL_SEARCH)
    monkeypatch.setattr(tune_stages.Probes, "alone", ORIGINAL_ALONE)
    monkeypatch.setattr("infertool.tune.space.capacity_start", lambda *a, **kw: None)

    def connect(handle, bench):  # as bench's does: the server's tokenizer resolved into the (shared) prompt section
        bench.prompt.tokenizer = "resolved"
        return handle

    monkeypatch.setattr("infertool.bench.sweep.connect", connect)
    mixes: list[tuple[str, int]] = []
    alone: list[tuple[str, int]] = []

    def measure(handle, bench, levels, by_class=None, **kw):
        (level,) = levels
        c = int(level.value)
        if by_class is None:  # a class alone: only the acceptance probe of a speculative setting
            alone.append((bench.classes.replay, c))
            return [LevelResult.from_dict({"arm": kw["arm"], "summary": {"requests": 10, "completed": 10}})]
        assert bench.classes.replay is None and sorted(by_class) == ["chat", "rag"]
        mixes.append((handle.url, c))
        # chat's first token takes 0.3 s per request in flight (its SLO, 1 s, holds up to 3); rag's 2 s at any load
        rs = [RequestResult(True, ttft=0.3 * c if i % 4 else 2.0, e2e=1.0, output_tokens=8,
                            cls="chat" if i % 4 else "rag") for i in range(bench.requests)]
        return [LevelResult(arm=kw["arm"], level=level.spec(), summary=summarize(rs, 5.0),
                            classes=class_figures(rs, 5.0, level, by_class, 1.0))]

    monkeypatch.setattr("infertool.bench.sweep.measure", measure)
    per = run_per_class(validate_recipe_data(data))
    caps = {name: {t.label: t.capacity for t in r.trials} for name, r in per.results.items()}
    for name, want in (("chat", 3), ("rag", 8)):  # each class's largest load under its own SLO
        assert {c.max_load for c in caps[name].values()} == {want}, (name, caps[name])
    # one probe of the mix per configuration and load: rag's search measured only above chat's (4..8 missed by chat)
    assert len(mixes) == len(set(mixes))
    for cap in caps["rag"].values():
        assert cap.mix is not None and cap.mix.classes == ["chat", "rag"] and cap.mix.reused
        assert not set(cap.mix.reused) & set(cap.mix.measured)
    for cap in caps["chat"].values():
        assert cap.mix is not None and cap.mix.measured and not cap.mix.reused
    # the speculative setting's classes each sent their traffic alone once, at their largest load
    assert sorted(alone) == [("chat", 3), ("rag", 8)]
    spec = [c for label, c in caps["rag"].items() if "ngram" in label]
    assert spec and spec[0].mix.alone == 8 and "acceptance" in spec[0].mix.alone_why
    md = (Path(per.results["rag"].tune_dir) / "tune.md").read_text()
    assert "traffic sent" in md and "the mix of chat, rag: measured at" in md and "alone at 8" in md
    notes = json.loads((Path(per.tune_dir) / "routing.json").read_text())["notes"]
    rag = next(n for n in notes if n.startswith("class rag: its figures are its own requests"))
    assert "2 load(s) measured for its searches, 6 read from probes already sent" in rag
    assert "its traffic alone once for each of 1 speculative setting(s)" in rag
