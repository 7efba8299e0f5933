"""`verify --perf`: serve the checkpoint as its evidence records (or under --engine / --set serve.X=Y), run the
bench it was published with (``evidence/speed.json``'s workload) ``repeats`` times against that server, and judge
each figure against the recorded one beyond the noise the repeats measured (``verify.perf_rule``). On other
hardware the figures are compared with the performance model's prediction for this host instead.

    plan(source, options, repeats) -> PerfPlan      the verify plan (evidence, settings, launch), the speed record,
                                                    the bench recipe; every refusal before work
    run(plan, ctx) -> VerifyResult                  the verdict from the speed figures (``perf``: PerfCheck),
                                                    written to verify.json; gates one per figure
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from infertool.capability import RunContext
from infertool.errors import UsageError
from infertool.records import Record
from infertool.verify import core
from infertool.verify import evidence as E
from infertool.verify import speed as S
from infertool.verify.perf_rule import CONFIDENCE, MIN_SLOWDOWN, PerfCheck, PerfMetric, Predicted

if TYPE_CHECKING:
    from infertool.resolve import Resolution

REPEATS = 3
MAX_REPEATS = 10
BUILTIN_SOURCES = ("builtin", "synthetic", "shared_prefix")  # prompt sources that read no file
BENCH_DROPPED = ("experiments", "per_class", "rate_sweep")  # what the re-run does not repeat (servers of their own)


@dataclass
class PerfPlan:
    verify: core.VerifyPlan
    speed: S.SpeedRecord
    bench_res: Resolution
    repeats: int
    hardware: S.SpeedHardware
    hardware_note: str | None

    def to_dict(self) -> dict[str, Any]:  # Any: JSON values
        return {**self.verify.to_dict(), "perf": {
            "repeats": self.repeats, "confidence": CONFIDENCE, "floor": MIN_SLOWDOWN,
            "recorded": {"engine": self.speed.engine.label, "hardware": self.speed.hardware.to_dict(),
                         "levels": [lv.to_dict() for lv in self.speed.levels]},
            "workload": {k: v for k, v in self.speed.workload.to_dict().items() if k != "bench"},
            "hardware": self.hardware.to_dict(), "hardware_note": self.hardware_note}}


def check_repeats(repeats: int) -> int:
    if not 1 <= repeats <= MAX_REPEATS:
        raise UsageError(f"--repeats {repeats}: verify --perf runs the bench 1 to {MAX_REPEATS} times",
                         hint=f"e.g. --repeats {REPEATS} (2 or more measure the noise)")
    return repeats


def repeats_asked(perf: bool, repeats: int | None, url: str | None) -> int | None:
    """--perf's repeats from the flags (None: no --perf), before anything is read: --repeats without --perf, out
    of 1 to MAX_REPEATS, or --perf with --url: a UsageError."""
    if repeats is not None and not perf:
        raise UsageError("--repeats sets how often --perf runs the bench: it needs --perf", hint="add --perf")
    if perf and url is not None:
        raise UsageError("--perf measures a server it starts itself (the recorded settings): it takes no --url",
                         hint="leave --url out")
    return check_repeats(REPEATS if repeats is None else repeats) if perf else None


def read_speed(folder: Path) -> S.SpeedRecord:
    """The folder's speed record; none: a UsageError saying how to publish one."""
    rec = S.read(folder / E.DIRNAME)
    if rec is None or not rec.levels:
        raise UsageError(f"{folder} carries no speed figures ({E.DIRNAME}/{S.FILENAME}"
                         + (" lists no level" if rec is not None else " is not there") + "): verify --perf has "
                         "nothing to compare with",
                         hint="publish it from a run with a bench stage: infertool publish RUN_DIR DEST --force")
    if not rec.workload.bench:
        raise UsageError(f"{folder / E.DIRNAME / S.FILENAME} records no bench workload to run again",
                         hint="publish it again from its run directory")
    return rec


def bench_resolution(source: core.Source, ev: E.Evidence, options: core.VerifyOptions,
                     rec: S.SpeedRecord) -> Resolution:
    """The recipe the bench runs again with: the evidence's serve settings (with --set), the recorded bench section
    (its server experiments left out: the one server of verify is measured); a prompt file it names is refused
    unless it is the builtin source (the record is untrusted input)."""
    from infertool.recipe import validate_recipe_data
    from infertool.resolve import resolve

    data, _ = core._recipe_data(source, ev, options.overrides)
    bench = {k: v for k, v in rec.workload.bench.items() if k not in BENCH_DROPPED}
    data = {**data, "bench": {**bench, "experiments": []}, "verify": {}}
    recipe = validate_recipe_data(data, source=f"{source.folder / E.DIRNAME / S.FILENAME}'s workload")
    b = recipe.bench
    if b is not None and (b.prompt.source not in BUILTIN_SOURCES or b.trace is not None or b.prompt.tokenizer):
        raise UsageError(f"{source.folder / E.DIRNAME / S.FILENAME}: its workload reads a file "
                         f"({str(b.trace or b.prompt.tokenizer or b.prompt.source)[:200]}), which verify does not "
                         "open from a published record",
                         hint="publish from a run whose bench uses a built-in prompt source")
    return resolve(recipe)


def plan(source: core.Source, options: core.VerifyOptions, repeats: int = REPEATS) -> PerfPlan:
    """The verify plan (signature, evidence, settings, launch: ``core.plan``), the speed record, this host's
    hardware against the recorded one, and the bench's recipe."""
    if options.url is not None:
        raise UsageError("verify --perf measures a server it starts itself (the recorded settings): it takes no --url",
                         hint="leave --url out")
    check_repeats(repeats)
    vp = core.plan(source, options)
    rec = read_speed(source.folder)
    now = S.hardware_now()
    res = bench_resolution(source, vp.evidence, options, rec)
    note = rec.hardware.differs(now)
    if note:
        vp.notes.append(f"other hardware: {note}; the figures are compared with the performance model's prediction "
                        "for this host, not with the recorded ones")
    return PerfPlan(vp, rec, res, repeats, now, note)


# ------------------------------------------------------------------------------------------ predictions
def predictor(folder: Path, hardware: S.SpeedHardware, rec: S.SpeedRecord) -> Callable[[S.SpeedLevel, str], Predicted | None]:
    """The performance model's prediction of a level's figure on this host (i42's ``perfmodel``), or a function
    that says None (the model missing or the checkpoint unknown to it: ``why_no_prediction``)."""
    try:
        from infertool.perfmodel.model import Query, load_model
        from infertool.models.info import model_info
        from infertool.models.weights import arch_from_info
        from infertool.perf.hardware import match_device_name

        info = model_info(folder)
        arch = arch_from_info(info)
        gpu = match_device_name(hardware.gpu_model) if hardware.gpu_model else None
        model = load_model()
    except Exception:  # noqa: BLE001 - no model here, or it cannot describe this checkpoint: no prediction
        return lambda level, metric: None
    w = rec.workload

    def predict(level: S.SpeedLevel, metric: str) -> Predicted | None:
        try:
            q = Query(model=folder.name, arch=arch, weights=weights_of(info.quantization), gpu=gpu.key if gpu else "cpu",
                      gpus=max(1, hardware.gpu_count), input_len=w.input_len or 512, output_len=w.output_len or 256,
                      concurrency=level.concurrency or 1,
                      engine=f"{rec.engine.package}=={rec.engine.version}" if rec.engine.package else None)
            iv = getattr(model.predict(q), metric)
            return Predicted(iv.value, iv.lo95, iv.hi95, iv.text())
        except Exception:  # noqa: BLE001 - a query the model refuses: no prediction for it
            return None

    return predict


def weights_of(quantization: dict[str, Any] | None) -> str:  # Any: config.json's quantization_config
    """The checkpoint's weight format as the performance model names it, from its config's quantization (bf16
    without one)."""
    import json

    text = json.dumps(quantization).lower() if quantization else ""
    if not text:
        return "bf16"
    if "fp8" in text or "float8" in text:
        return "fp8"
    eight = '"num_bits": 8' in text or '"bits": 8' in text
    if eight and '"input_activations": {' in text:
        return "w8a8-int8"
    return "w8a16" if eight else "w4a16"


# ------------------------------------------------------------------------------------------ run
def measure(p: PerfPlan, url: str, model: str, ctx: RunContext) -> list[S.SpeedLevel]:
    """The recorded workload run ``p.repeats`` times against the server at ``url``; each level's figures over the
    repeats (per run: the level's mean)."""
    from infertool.bench import core as bench_core

    runs: list[list[S.SpeedLevel]] = []
    for i in range(p.repeats):
        ctx.emit(f"perf: repeat {i + 1} of {p.repeats} of the recorded workload")
        bp = bench_core.plan(p.bench_res, bench_core.BenchOptions(url=url, model=model, experiments=False,
                                                                  arm=f"repeat {i + 1}"))
        report = bench_core.run(replace(bp, notes=[]), RunContext(on_event=ctx.on_event))
        runs.append([x for x in (S.level_of(lv) for lv in report.levels) if x is not None])
    out = []
    for first in runs[0]:
        same = [next((x for x in r if (x.concurrency, x.rate_rps) == (first.concurrency, first.rate_rps)), None)
                for r in runs]
        got = [x for x in same if x is not None]
        ttft, tpot, tps = (S.figure_of([x.figure(m).mean for x in got], got[0].figure(m).p50, got[0].figure(m).p90)
                           for m in S.METRICS)
        out.append(S.SpeedLevel(first.concurrency, first.rate_rps, first.requests, sum(x.completed for x in got),
                                ttft, tpot, tps))
    return out


def judge(p: PerfPlan, levels: list[S.SpeedLevel]) -> list[PerfMetric]:
    """The figures judged: against the recorded ones beyond the noise, or (other hardware) the prediction."""
    from infertool.verify.perf_rule import judge_levels, judge_predicted

    if p.hardware_note is None:
        return judge_levels(p.speed.levels, levels)
    predict = predictor(p.verify.source.folder, p.hardware, p.speed)
    out = []
    for r in p.speed.levels:
        n = next((x for x in levels if (x.concurrency, x.rate_rps) == (r.concurrency, r.rate_rps)), S.SpeedLevel())
        out += [judge_predicted(r.label, m, r.figure(m), n.figure(m), predict(n, m), concurrency=r.concurrency,
                                why_none="the performance model gives none for this checkpoint and host")
                for m in S.METRICS]
    return out


def run(p: PerfPlan, ctx: RunContext | None = None) -> core.VerifyResult:
    """Serve the checkpoint (``core``'s launch), run the workload, judge, write verify.json; never prints."""
    from infertool.atomic import check_output_dir, write_json
    from infertool.errors import BackendError, RuntimeFailure
    from infertool.evaluate.verdict import Gate
    from infertool.serve import launch
    from infertool.verify.hold import hold_out
    from infertool.verify.perf_rule import verdict

    ctx = ctx or RunContext()
    t0 = time.monotonic()
    vp = p.verify
    assert vp.launch is not None  # plan refuses --url
    out_dir = check_output_dir(ctx.out_dir or vp.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    held = hold_out(out_dir, "verify")
    timing = core.VerifyTiming()
    core._own_log(out_dir / core.SERVER_LOG)
    started = False
    try:
        try:
            with launch(vp.launch, out_dir / core.SERVER_LOG, label="the checkpoint (verify --perf)",
                        on_event=ctx.on_event) as srv:
                started = True
                timing.ready_s = round(srv.ready_s, 1)
                engine = core.served_engine(vp, srv.plan.spec.argv[0] if srv.plan.spec.argv else None)
                engine.argv = list(srv.plan.spec.argv)
                t = time.monotonic()
                levels = measure(p, srv.url, srv.model, ctx)
                timing.gather_s = round(time.monotonic() - t, 2)
        except RuntimeFailure as e:
            if started:
                raise
            raise BackendError(e.message, hint=e.hint, log_path=e.log_path) from None
        metrics = judge(p, levels)
        v, reason = verdict(metrics, p.hardware_note)
        check = PerfCheck(p.repeats, CONFIDENCE, MIN_SLOWDOWN, p.speed.engine.label, p.speed.hardware, p.hardware,
                          p.hardware_note, p.speed.workload, metrics, levels, timing.gather_s)
        timing.wall_s = round(time.monotonic() - t0, 2)
        gates: list[Gate] = [m.gate() for m in metrics]
        result = vp.result(engine, timing, out_dir, verdict=v, reason=reason, gates=gates, confidence=CONFIDENCE,
                           perf=check)
        write_json(out_dir / core.RESULT_FILE, result.to_dict())
        return result
    finally:
        if held is not None:
            held.release()


def verify_perf(source: core.Source, options: core.VerifyOptions, ctx: RunContext) -> core.VerifyResult:
    """One verification on speed (``plan`` then ``run``): the test of ``verify --perf --bisect``."""
    return run(plan(source, options, options.perf_repeats or REPEATS), ctx)
