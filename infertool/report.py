"""`infertool report RUN_DIR` (Markdown + a self-contained HTML page) and `infertool compare RUN_A RUN_B`.

Everything comes from the run directory: manifest.json and the files each stage wrote (quantize.json,
results.json, profile.json, bench.json, plots). Plots are embedded in the HTML as <img> data: URIs, SVG too,
never inline: a browser shows an SVG image without running its scripts, event handlers or links and without
loading anything, so a plot in a run directory (written by someone else) cannot script the page. That is
sturdier than sanitising the SVG's markup, where every missed element or attribute is a hole. Every other
string from the run directory is escaped (html.escape / md_escape) by the renderers below.
"""

from __future__ import annotations

import base64
import html
import json
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from infertool.atomic import dumps_json, file_kind, write_text
from infertool.bench.results import BenchReport, BenchSettings, Interval
from infertool.decision import Names, RunData, RunSummary, model_names, speed, summarize
from infertool.errors import UsageError
from infertool.inputs import MAX_JSON_DEPTH, depth
from infertool.metricspec import METRICS, compared
from infertool.evaluate.verdict import Gate
from infertool.records import Record, as_float
from infertool.summaries import EvalSummary, RunManifest, ServeSummary

# each stage's result file in a run directory
STAGE_FILES = (("quantize", "quantize/quantize.json"), ("eval", "eval/results.json"), ("profile", "profile/profile.json"),
               ("bench", "bench/bench.json"))
# what report / compare read of a run directory, at most: a result file, a figure, and how deep JSON may nest
# (infertool's own files are a few MB and under 15 levels; a crafted one reads as "not readable", never fills memory)
MAX_JSON_BYTES = 64 * 2**20
MAX_FIGURE_BYTES = 16 * 2**20
FIGURE_TYPES = {".png": "image/png", ".svg": "image/svg+xml"}


class Unreadable(Exception):
    """A file of a run directory that is there but is not read: the reason, for people ("too large: ...")."""


def _roots(run_dir: Path) -> tuple[Path, ...]:
    """Where a run directory's files may lie once links are resolved: the run directory, and the stage cache beside
    it (``<out>/.stages``: `run` links each stage's entry into the run directory)."""
    d = run_dir.resolve()
    return d, (d.parent / ".stages").resolve()


def read_inside(run_dir: Path, rel: str, limit: int) -> bytes:
    """The bytes of ``run_dir / rel``, only when it is a regular file (not a link itself), inside the run directory
    (or its stage entry) once links are resolved, and at most ``limit`` bytes: never a fifo that blocks, a device, a
    file elsewhere, or more than ``limit`` bytes in memory. FileNotFoundError when it is not there; Unreadable with
    the reason when it is there and is not read."""
    path = run_dir / rel
    try:
        st = os.lstat(path)
    except (FileNotFoundError, NotADirectoryError):
        raise FileNotFoundError(str(path)) from None
    except OSError as e:
        raise Unreadable(f"not readable: {e.strerror or e}") from None
    if stat.S_ISLNK(st.st_mode):
        raise Unreadable("a symbolic link (infertool writes none there; a link may point anywhere)")
    if not stat.S_ISREG(st.st_mode):
        raise Unreadable(file_kind(st.st_mode))
    try:
        real = path.resolve()
    except (OSError, RuntimeError) as e:
        raise Unreadable(f"not readable: {e}") from None
    if not any(real == r or r in real.parents for r in _roots(run_dir)):
        raise Unreadable(f"outside the run directory (it resolves to {real})")
    too_large = f"too large (over {limit:,} bytes)"
    if st.st_size > limit:
        raise Unreadable(too_large)
    try:
        fd = os.open(real, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as e:
        raise Unreadable(f"not readable: {e.strerror or e}") from None
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):  # swapped for something else since the check
            raise Unreadable("not a regular file")
        data = f.read(limit + 1)
    if len(data) > limit:
        raise Unreadable(too_large)
    return data


def read_json_inside(run_dir: Path, rel: str) -> Any:  # Any: JSON read from a file, of any shape
    """A JSON file of a run directory (``read_inside``, then parsed): Unreadable "not valid JSON: ..." for what
    does not parse or nests deeper than MAX_JSON_DEPTH."""
    data = read_inside(run_dir, rel, MAX_JSON_BYTES)
    try:
        doc = json.loads(data)
    except RecursionError:
        raise Unreadable(f"not valid JSON: nested deeper than {MAX_JSON_DEPTH} levels") from None
    except ValueError as e:  # UnicodeDecodeError and an integer of more than 4300 digits too
        raise Unreadable(f"not valid JSON: {str(e)[:200]}") from None
    if depth(doc) > MAX_JSON_DEPTH:
        raise Unreadable(f"not valid JSON: nested deeper than {MAX_JSON_DEPTH} levels")
    return doc


def load_run(run_dir: str | Path) -> tuple[Path, RunManifest]:
    """The run directory and its manifest (any JSON object reads: what is not there reads as not measured). A
    manifest that is missing, not a regular file inside the directory, too large or not JSON: a UsageError."""
    d = Path(run_dir).expanduser()
    hint = "give a directory that `infertool run` wrote, e.g. runs/<recipe>-<time>"
    if not str(run_dir).strip() or not d.is_dir():
        raise UsageError(f"{str(run_dir)!r} is not a run directory (not a directory)", hint=hint)
    try:
        return d, RunManifest.from_dict(read_json_inside(d, "manifest.json"))
    except FileNotFoundError:
        raise UsageError(f"{d} is not a run directory (no manifest.json)", hint=hint) from None
    except Unreadable as e:
        raise UsageError(f"{d / 'manifest.json'}: {e}", hint=hint) from None


def _figure(run_dir: Path, rel: str) -> bytes:
    """The bytes of ``run_dir / rel`` when it is a figure to show (a PNG or an SVG that ``read_inside`` reads);
    else FileNotFoundError or Unreadable with the reason."""
    kind = FIGURE_TYPES.get(Path(rel).suffix.lower())
    if kind is None:
        raise Unreadable(f"not a .png or .svg file ({Path(rel).name!r})")
    data = read_inside(run_dir, rel, MAX_FIGURE_BYTES)
    if kind == "image/png" and not data.startswith(b"\x89PNG\r\n\x1a\n"):
        raise Unreadable("not a PNG image")
    if kind == "image/svg+xml" and b"<svg" not in data[:4096]:
        raise Unreadable("not an SVG image")
    return data


def collect(run_dir: Path, manifest: RunManifest) -> RunData:
    """The run directory read once: each stage's result file as its typed record, and the figures beside them.
    Only regular files inside the run directory are read (``read_inside``); what is there and is not read is
    named with its reason (``RunData.unreadable``, ``RunData.figure_notes``)."""
    docs, unreadable = {}, {}
    for key, rel in STAGE_FILES:
        try:
            docs[key] = read_json_inside(run_dir, rel)
        except FileNotFoundError:
            docs[key] = None
        except Unreadable as e:
            docs[key], unreadable[rel] = None, str(e)
    run = RunData.of(manifest, **docs)
    run.unreadable = unreadable
    figs = {"roofline": "profile/roofline.png", "latency_throughput": "bench/latency_throughput.png",
            "lengths": "bench/latency_throughput.lengths.svg"}  # bench.plot.lengths_path of the plot
    hist = run.eval.kld_histogram_file if run.eval is not None else None
    if hist and Path(hist).name not in ("", ".", ".."):
        figs["kld_histogram"] = "eval/" + Path(hist).name
    for key, rel in figs.items():
        try:
            _figure(run_dir, rel)
            run.figures[key] = run_dir / rel
        except FileNotFoundError:
            pass
        except Unreadable as e:
            run.figure_notes[key] = f"{rel}: {e}"
    return run


def read_run(run_dir: str | Path) -> tuple[Path, RunData]:
    d, manifest = load_run(run_dir)
    return d, collect(d, manifest)


def _fmt(v, digits: int = 3) -> str:
    if v is None:
        return "–"
    if isinstance(v, float):
        if abs(v) >= 1000:
            return f"{v:,.0f}"
        return f"{v:.{digits}g}"
    return str(v)


# ------------------------------------------------------------------------------------------ the page model
# A section is a title and blocks; text is a tuple of runs, each plain text, Bold or Code. Every run is
# escaped by the renderer (Markdown or HTML), so what a recipe or a model says can never become markup.
class Bold(str):
    pass


class Code(str):
    pass


@dataclass
class Para:
    runs: tuple


@dataclass
class Table:
    rows: list[list[str]]  # the first is the header


@dataclass
class Bullets:
    items: list[Para]


@dataclass
class Figure:
    key: str  # a key of RunData.figures


@dataclass
class Section:
    id: str
    title: str
    blocks: list = field(default_factory=list)


def P(*runs) -> Para:
    """A paragraph of runs: Bold(...) and Code(...) keep their style, anything else is plain text."""
    return Para(tuple(r if isinstance(r, (Bold, Code)) else str(r) for r in runs if r is not None))


def _x(v) -> str:
    """A ratio, '1.52x'."""
    return "–" if v is None else f"{v:.2f}x"


def _interval(g: Gate) -> str:
    return "–" if g.lo is None and g.hi is None else f"{_fmt(g.lo, 4)} .. {_fmt(g.hi, 4)}"


def _pct(v) -> str:
    return "–" if v is None else f"{v:.0%}"


def _money(v) -> str:
    return "–" if v is None else f"${v:,.4g}"


def _bytes(v) -> str:
    return "–" if v is None else f"{v:,}"


def _traffic(s: BenchSettings | None) -> str:
    if s is None or s == BenchSettings():
        return ""
    slo = s.slo.bounds() if s.slo is not None else {}
    slo_txt = ", ".join(f"{k.removesuffix('_ms').upper()} ≤ {_fmt(v)} ms" for k, v in slo.items())
    return (f"the same traffic ({s.requests_per_level} requests per load level, prompts of about "
            f"{s.prompt_tokens} tokens from {s.prompt_source}, {s.output_len} output tokens) "
            f"and SLO ({slo_txt or 'none set'})"
            + (f", the machine at ${s.cost_per_hour:.2f} per hour" if s.cost_per_hour is not None else
               "; $ per 1M output tokens needs bench.cost_per_hour"))


def _summary_section(run: RunData) -> Section:
    """The section that decides: what was compared, what the candidate gains, what it costs, the verdict,
    what to try next."""
    s = summarize(run)
    names, dec = s.names, s.decision
    sec = Section("summary", "Summary: " + dec.title)
    sec.blocks.append(P(Bold(dec.text)))
    if names.candidate:
        sec.blocks.append(P("Compared: the original ", Bold(names.original or "?"), " and the candidate ",
                            Bold(names.candidate), "."))
    elif names.served or names.original:
        sec.blocks.append(P("Served: ", Bold(names.served or names.original), "."))
    if not names.candidate:
        return sec
    sec.blocks += _gains_blocks(s)
    gates = [g for g in s.gates if g.status != "n/a"]
    if gates:  # what it costs
        rows = [["what it costs (eval gate)", "estimate", f"interval ({s.confidence:.0%})" if s.confidence else "interval",
                 "threshold", "status"]]
        rows += [[g.name, _fmt(g.estimate, 4), _interval(g), _fmt(g.threshold, 4), g.status or ""] for g in gates]
        sec.blocks.append(Table(rows))
    if s.verdict:
        sec.blocks.append(P(Bold(f"Verdict: {s.verdict}"), " — ", s.reason or "",
                            f" (suite {s.suite}, engine {s.engine})" if s.suite else ""))
    if s.next:
        sec.blocks.append(P(Bold("Next to try:")))
        sec.blocks.append(Bullets([P(n) for n in s.next]))
    return sec


def _gains_blocks(s: RunSummary) -> list:
    """What the candidate gains: weights, and the headline level's speed and cost of both; how it was measured;
    every level when there are several."""
    w, sp = s.weights, s.speed
    blocks: list = []
    rows = [["what the candidate gains", "original", "candidate", "candidate / original"]]
    if w:
        rows.append(["weight bytes", _bytes(w.original), _bytes(w.candidate), _x(w.ratio)])
    head = sp.headline
    if head:
        lvl = head.level
        rows.append([f"output tokens/s at {lvl}", _fmt(head.output_tok_s.original), _fmt(head.output_tok_s.candidate),
                     _x(head.output_tok_s.ratio)])
        rows.append([f"$ per 1M output tokens at {lvl}", _money(head.cost_per_1m.original), _money(head.cost_per_1m.candidate),
                     _x(head.cost_per_1m.ratio)])
        rows.append([f"requests meeting the SLO at {lvl}", _pct(head.goodput.original), _pct(head.goodput.candidate), ""])
    if len(rows) > 1:
        blocks.append(Table(rows))
    if sp.status == "nothing to compare":
        return blocks + [P("Speed: nothing to compare, measured: " + (sp.why or "") + ".")]
    if sp.status != "measured":
        return blocks + [P("Speed: not measured against the original: " + (sp.why or "") + ".")]
    traffic = _traffic(sp.settings)
    blocks.append(P("Speed and cost measured in this run on both models, served one after the other by the same "
                    "launcher with the recipe's serve settings" + (f", at {traffic}" if traffic else "") + "."))
    if sp.dtype_original and sp.dtype_candidate and sp.dtype_original != sp.dtype_candidate:
        blocks.append(P(f"As served, the original ran with --dtype {sp.dtype_original} and the candidate with --dtype "
                        f"{sp.dtype_candidate}: the effective serve settings every command uses for each (see Bench)."))
    if len(sp.rows) > 1:
        per = [["load level", "original tok/s", "candidate tok/s", "ratio", "original $/1M", "candidate $/1M", "ratio",
                "TPOT p50 ms (orig / cand)"]]
        for r in sp.rows:
            per.append([r.level, _fmt(r.output_tok_s.original), _fmt(r.output_tok_s.candidate), _x(r.output_tok_s.ratio),
                        _money(r.cost_per_1m.original), _money(r.cost_per_1m.candidate), _x(r.cost_per_1m.ratio),
                        f"{_fmt(r.tpot_p50_ms.original)} / {_fmt(r.tpot_p50_ms.candidate)}"])
        blocks.append(Table(per))
    failed = [r.level for r in sp.rows if r.failed_original or r.failed_candidate]
    if failed:
        blocks.append(P("Some requests failed at " + ", ".join(failed) + " (see Bench)."))
    return blocks


def _sections(run_dir: Path, run: RunData) -> list[Section]:
    """The summary that decides, then the detail sections, for both renderers."""
    names = model_names(run)
    out = [_summary_section(run)]
    ship = _ship_section(run_dir, run)
    if ship is not None:
        out.append(ship)
    out.append(_run_section(run))
    for part in (_quantize_section, _eval_section, _profile_section, _serve_section, _bench_section):
        sec = part(run, names)
        if sec is not None:
            out.append(sec)
    return out


def _ship_section(run_dir: Path, run: RunData) -> Section | None:
    """Ship it: where the checkpoint the eval scored was published, its fingerprint, the verdict, and the exact
    commands that serve it (checked by that fingerprint) here and on Kubernetes; or why nothing was published."""
    import shlex

    pub = run.manifest.published if isinstance(run.manifest.published, dict) else None
    if not pub:
        return None
    sec = Section("ship", "Ship it")
    if not isinstance(pub.get("path"), str):
        sec.blocks.append(P("Nothing was published: ", str(pub.get("why") or "the run did not say why"), "."))
        return sec
    ev = run.manifest.stages.get("eval")  # results.json's verdict, else the manifest's record of the eval stage
    verdict = (run.eval.verdict if run.eval is not None else None) or \
        (ev.summary_as(EvalSummary).verdict if ev is not None and ev.summary is not None else None)
    where = shlex.quote(str(run_dir.absolute()))
    sec.blocks.append(P("The checkpoint the eval scored is published at ", Code(pub["path"]), " (fingerprint ",
                        Code(str(pub.get("fingerprint"))), ") with MODEL_CARD.md and infertool.json beside it; verdict ",
                        Bold(str(verdict or "not scored")), "."))
    if verdict not in ("PASS", None):
        sec.blocks.append(P(Bold(f"The verdict is {verdict}:"), " it is published so that you can decide; read the "
                            "gates above before serving it."))
    sec.blocks.append(P("Serve it (the fingerprint is checked first): ", Code(f"infertool serve {where}")))
    sec.blocks.append(P("On Kubernetes: ", Code(f"infertool serve {where} --emit k8s > vllm.yaml")))
    return sec


def _run_section(run: RunData) -> Section:
    m = run.manifest
    rows = [["stage", "status", "seconds", "key"]]
    for name, rec in m.stages.items():
        rows.append([name, rec.status or "", _fmt(rec.seconds), (rec.key or "")[:10]])
    envs = ", ".join(f"{n}: " + ", ".join(f"{k} {v}" for k, v in e.packages.items()) for n, e in m.environments.items())
    return Section("run", "Run", [
        P("recipe ", Bold(str(m.recipe_name)), f", started {m.started}, finished {m.finished}"),
        *(P(line) for line in _parallel_setup(m.recipe)),
        P(f"infertool {m.infertool}; environments: {envs or 'none recorded'}"), Table(rows),
        *(P(f"not read: {rel}: {why}") for rel, why in run.unreadable.items())])


def _parallel_setup(recipe: dict | None) -> list[str]:
    """The GPUs each server took, from the recipe the run recorded: the served model's (the serve section, what
    is deployed) and the eval's original when eval.base_serve gives it its own ([] on a CPU or an older run)."""
    serve = (recipe or {}).get("serve") if isinstance(recipe, dict) else None
    if not isinstance(recipe, dict) or not isinstance(serve, dict) or not (recipe.get("target") or {}).get("gpu"):
        return []
    tp, pp = serve.get("tensor_parallel_size", 1), serve.get("pipeline_parallel_size", 1)
    lines = [f"served (and deployed) with tensor_parallel_size {tp} x pipeline_parallel_size {pp} (the serve section)"]
    base = ((recipe.get("eval") or {}).get("base_serve") or {}) if isinstance(recipe.get("eval"), dict) else {}
    if isinstance(base, dict) and any(v is not None for v in base.values()):
        lines.append(f"the eval's original served with tensor_parallel_size {base.get('tensor_parallel_size') or tp} x "
                     f"pipeline_parallel_size {base.get('pipeline_parallel_size') or pp} (eval.base_serve: it needs "
                     "more GPUs than the quantized model)")
    return lines


def _quantize_section(run: RunData, names: Names) -> Section | None:
    q = run.quantize
    if q is None:
        return None
    size = q.weight_size
    b, a = size.weight_bytes_before, size.weight_bytes_after
    if b and a:
        pct = size.reduction_pct if size.reduction_pct is not None else 100.0 * (1 - a / b)
        sz = f"weights {b:,} -> {a:,} bytes ({pct:.1f}% smaller)"
    else:
        sz = dumps_json(q.size or {}, indent=None)
    blocks = [P(Bold(names.candidate or f"{q.method} via {q.backend}"), ": ", sz)]
    v = q.load_check_result
    if v is not None:
        agree = v.agreement_share
        blocks.append(P(f"vLLM load check: loaded={v.loaded}, generated={v.generated}"
                        + (f", greedy token agreement with the original {_fmt(agree)}" if agree is not None else "")
                        + (f" ({v.reason})" if v.reason else "")))
    la = q.kernel_agreement
    if la is not None:
        blocks.append(P(f"greedy token agreement ({la.engine}): {_fmt(la.agreement)} over {la.tokens} tokens"))
    return Section("quantize", "Quantize", blocks)


def _eval_section(run: RunData, names: Names) -> Section | None:
    ev = run.eval
    if ev is None:
        return None
    rows = [["gate", "metric", "estimate", "interval", "threshold", "status"]]
    for g in (g for g in ev.gates if isinstance(g.name, str)):
        rows.append([g.name, g.metric or "", _fmt(g.estimate, 4), _interval(g), _fmt(g.threshold, 4), g.status or ""])
    blocks = [P("base ", Bold(names.original or "?"), ", candidate ", Bold(names.candidate or "?")),
              P(ev.reason or ""), P(f"suite {ev.suite.name or None}, engine {ev.engine or None}"),
              Table(rows), Figure("kld_histogram")]
    blocks += _phase_blocks(ev.pooled)
    return Section("eval", f"Eval: {ev.verdict}", blocks)


def _phase_blocks(pooled) -> list:
    """The as-served phases of the eval (infertool.evaluate.blocks): lm-eval tasks, the decode path."""
    from infertool.evaluate.blocks import LM_EVAL_HEADER, decode_rows, lm_eval_rows, task_code_note

    out: list = []
    lm, dec = pooled.lm_eval, pooled.decode
    if lm is not None:
        out += [P(Bold("lm-eval tasks"), " (as served: candidate against base, joined by document)"),
                Table([list(LM_EVAL_HEADER)] + lm_eval_rows(lm))]
        if note := task_code_note(lm):
            out.append(P(Bold("Task code"), " ", note))
    if dec is not None:
        out += [P(Bold("Decode path"), " (as served: greedy continuations of a fixed prompt set; decode-step "
                  "distributions compared on the same tokens)"),
                Table([["figure", "value"]] + [list(r) for r in decode_rows(dec)])]
    return out


def _profile_section(run: RunData, names: Names) -> Section | None:
    pr = run.profile
    if pr is None:
        return None
    rows = [["phase", "shape", "ms", "MBU", "MFU", "verdict", "confidence"]]
    for p in pr.timed:
        shape = f"{p.tokens} tokens" if p.phase == "prefill" else f"batch {p.batch} @ {p.tokens}"
        rows.append([p.phase or "", shape, _fmt(p.seconds * 1e3 if p.seconds is not None else None), _pct(p.mbu),
                     _pct(p.mfu), p.verdict or "", p.confidence or ""])
    pk = pr.peak
    return Section("profile", "Profile", [
        P("profiled: ", Bold(pr.model_label or names.original or "?"), f" on {pr.device_name}"),
        P(f"peaks: {_fmt(_per_giga(pk.bandwidth))} GB/s, {_fmt(_per_giga(pk.flops))} GFLOP/s ({pk.dtype})"),
        Bullets([P(a) for a in pr.advice]), Table(rows), Figure("roofline")])


def _per_giga(v: float | None) -> float | None:
    return v / 1e9 if v is not None else None


def _serve_section(run: RunData, names: Names) -> Section | None:
    sv = run.summary("serve", ServeSummary)
    if sv is None:
        return None
    smoke = sv.smoke_test
    return Section("serve", "Serve", [
        P("served: ", Bold(sv.label or names.served or "?"), f" ({sv.served or 'served'})"),
        P(f"ready in {sv.ready_s} s; smoke completion of {smoke.prompt!r}: {smoke.completion!r}")])


def _bench_section(run: RunData, names: Names) -> Section | None:
    be = run.bench
    if be is None:
        return None
    arms = [("candidate", be, names.candidate), ("original", be.original, names.original)] if be.original else \
        [("served", be, names.served)]
    blocks: list = []
    for role, arm, fallback in arms:
        label = arm.label or arm.served_model.label or fallback or names.served
        blocks.append(P(f"{role}: ", Bold(label or "?"), " (vLLM name ", Code(str(arm.model)), f"), endpoint {arm.endpoint}"))
        blocks.append(Table(_bench_rows(arm)))
        if any(lv.summary.lengths is not None for lv in arm.levels):
            blocks.append(P(f"{role}: the token lengths sent (the server's usage) and the server's reuse figures"))
            blocks.append(Table(_length_rows(arm)))
        if arm.knee is not None:  # bench.rate_sweep: the knee and its evidence
            k = arm.knee
            blocks.append(P(f"rate sweep knee: the server follows {k.rate:g} req/s, not {k.first_bad:g} ({k.criterion})"
                            if k.found else f"rate sweep: no knee bracketed: {k.stopped} ({k.criterion})"))
    blocks += _class_blocks(be)
    blocks += [P("note: " + note) for note in be.notes]
    from infertool.perf.fleet import run_fleet  # replicas and $/month for target.peak_rps from the measured max load

    blocks += [P(line) for line in run_fleet(run.manifest.recipe, run.manifest.target, be.levels)["lines"]]
    blocks.append(Figure("latency_throughput"))
    blocks.append(Figure("lengths"))
    return Section("bench", "Bench", blocks)


def _class_blocks(be: BenchReport) -> list:
    """The traffic's classes and bench.per_class (speculation and prefix caching per class), the rows `infertool
    bench` prints (infertool.bench.perclass_tables)."""
    from infertool.bench.perclass_tables import class_tables, traffic_table

    tables = ([traffic_table(be.classes)] if be.classes is not None and be.classes.classes else []) + \
        (class_tables(be.per_class) if be.per_class is not None else [])
    blocks: list = []
    for ct in tables:
        blocks += [P(Bold(ct.title)), Table(ct.rows), *(P(line) for line in ct.notes)]
    return blocks


def _length_rows(arm: BenchReport) -> list[list[str]]:
    """Per level: the input and output token lengths sent (p50 / p90 / p99 / max), the prefix-cache hit rate,
    the speculative-decoding acceptance rate and mean accepted length ('-': not measured)."""
    rows = [["level", "input p50 / p90 / p99 / max", "output p50 / p90 / p99 / max", "prefix hit", "spec accept",
             "mean accepted len"]]
    for lv in arm.levels:
        d, sm = lv.summary.lengths, lv.server_metrics
        cells = ["–" if h is None else " / ".join(_fmt(v) for v in (h.p50, h.p90, h.p99, h.max))
                 for h in ((d.input, d.output) if d is not None else (None, None))]
        rows.append([lv.level.label, *cells, _pct(sm.prefix_cache_hit_rate), _pct(sm.spec_decode_acceptance_rate),
                     _fmt(sm.spec_decode_mean_accepted_len)])
    return rows


def _bench_rows(arm: BenchReport) -> list[list[str]]:
    """A bench's levels, one row each: the metric table's report metrics (``infertool.metricspec``), a repeated
    level's (bench.repeats) with its interval where the repeats have one."""
    specs = [m for m in METRICS if m.report is not None]
    rows = [["level", *(str(m.report) for m in specs), "errors"]]
    for lv in arm.levels:
        f, r = lv.summary, lv.repeats
        cells = []
        for m in specs:
            interval = getattr(r, m.name, None) if r is not None else None
            cells.append(_ci_cell(interval if isinstance(interval, Interval) else None, m.of(f)))
        rows.append([lv.level.label, *cells, _fmt(f.failed)])
    return rows


def _ci_cell(interval, value) -> str:
    """A figure, with its interval over repeated runs when it has one: "1.2 [1.1, 1.3]"."""
    if interval is None or interval.lo is None or interval.hi is None:
        return _fmt(value)
    return f"{_fmt(interval.value)} [{_fmt(interval.lo)}, {_fmt(interval.hi)}]"


# ------------------------------------------------------------------------------------------ Markdown
_MD_ALWAYS = set("\\`*[]<|~&")


def md_escape(text: str) -> str:
    """Text that Markdown shows as it is: no emphasis, link, HTML, code span or table cell break can come
    from it. '_' is escaped unless it sits between two letters or digits (where it cannot emphasise)."""
    text = " ".join(str(text).splitlines())
    out = []
    for i, ch in enumerate(text):
        if ch in _MD_ALWAYS:
            out.append("\\" + ch)
        elif ch == "_" and not (0 < i < len(text) - 1 and text[i - 1].isalnum() and text[i + 1].isalnum()):
            out.append("\\_")
        else:
            out.append(ch)
    return "".join(out)


def _md_runs(p: Para) -> str:
    parts = []
    for r in p.runs:
        if type(r) is Bold:
            parts.append(f"**{md_escape(r)}**" if r.strip() else md_escape(r))
        elif type(r) is Code and "`" not in r and "\n" not in r:
            parts.append(f"`{r}`" if r else "")
        else:
            parts.append(md_escape(r))
    text = "".join(parts)
    # a line that begins like a block (heading, quote, list, rule) stays a paragraph
    if text[:1] in ("#", ">", "-", "+", "=") or (text[:1].isdigit() and text.split(" ", 1)[0].rstrip("0123456789") in (".", ")")):
        text = "\\" + text
    return text


def md_table(rows: list[list[str]]) -> str:
    head, *body = rows
    lines = ["| " + " | ".join(md_escape(c) for c in head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(md_escape(c) for c in r) + " |" for r in body]
    return "\n".join(lines)


def render_markdown(run_dir: Path, run: RunData) -> str:
    parts = [f"# infertool report: {md_escape(str(run.manifest.recipe_name))}", "",
             _md_runs(P("Run directory: ", Code(str(run_dir)))), ""]
    for sec in _sections(run_dir, run):
        parts += [f"## {md_escape(sec.title)}", ""]
        for b in sec.blocks:
            if isinstance(b, Para):
                text = _md_runs(b)
                if text:
                    parts += [text, ""]
            elif isinstance(b, Table):
                parts += [md_table(b.rows), ""]
            elif isinstance(b, Bullets):
                if b.items:
                    parts += [f"- {_md_runs(i)}" for i in b.items] + [""]
            elif isinstance(b, Figure) and b.key in run.figures:
                rel = os.path.relpath(run.figures[b.key], run_dir).replace(os.sep, "/")
                parts += [f"![{b.key}](<{rel.replace('<', '%3C').replace('>', '%3E')}>)", ""]
            elif isinstance(b, Figure) and b.key in run.figure_notes:
                parts += [_md_runs(P(f"figure not embedded: {run.figure_notes[b.key]}")), ""]
    return "\n".join(parts)


# ------------------------------------------------------------------------------------------ HTML
def img_tag(path: Path, data: bytes | None = None) -> str:
    """The figure embedded as a data: URI (PNG or SVG; an SVG as an image runs no script of its own): ``data``,
    else the file's bytes (a plot infertool has just drawn)."""
    mime = "image/svg+xml" if path.suffix == ".svg" else "image/png"
    b64 = base64.b64encode(path.read_bytes() if data is None else data).decode()
    return f'<img alt="{html.escape(path.stem)}" src="data:{mime};base64,{b64}">'


def _html_figure(run_dir: Path, run: RunData, key: str) -> str:
    """A figure of the run directory embedded, read again as ``collect`` read it (a regular file inside the run
    directory, bounded); or the note saying why it is not embedded; or nothing when the run has none."""
    path, note = run.figures.get(key), run.figure_notes.get(key)
    if path is not None:
        rel = os.path.relpath(path, run_dir)
        try:
            return f'<div class="fig">{img_tag(path, _figure(run_dir, rel))}</div>'
        except (FileNotFoundError, Unreadable) as e:
            note = f"{rel}: {e}" if isinstance(e, Unreadable) else f"{rel}: gone"
    return f"<p>{html.escape(f'figure not embedded: {note}')}</p>" if note else ""


def _html_runs(p: Para) -> str:
    parts = []
    for r in p.runs:
        t = html.escape(r)
        parts.append(f"<b>{t}</b>" if type(r) is Bold else f"<code>{t}</code>" if type(r) is Code else t)
    return "".join(parts)


def render_html(run_dir: Path, run: RunData) -> str:
    body = [f"<h1>infertool report: {html.escape(str(run.manifest.recipe_name))}</h1>",
            f"<p>Run directory: <code>{html.escape(str(run_dir))}</code></p>"]
    for sec in _sections(run_dir, run):
        body.append(f'<section id="{html.escape(sec.id)}"><h2>{html.escape(sec.title)}</h2>')
        for b in sec.blocks:
            if isinstance(b, Para):
                text = _html_runs(b)
                if text:
                    body.append(f"<p>{text}</p>")
            elif isinstance(b, Table):
                body.append(html_table(b.rows))
            elif isinstance(b, Bullets):
                if b.items:
                    body.append("<ul>" + "".join(f"<li>{_html_runs(i)}</li>" for i in b.items) + "</ul>")
            elif isinstance(b, Figure):
                body.append(_html_figure(run_dir, run, b.key))
        body.append("</section>")
    return html_document(f"infertool report: {run.manifest.recipe_name}", body)


STYLE = ("body{font-family:system-ui,sans-serif;max-width:1100px;margin:2em auto;color:#222}"
         "table{border-collapse:collapse;margin:1em 0}td,th{border:1px solid #ccc;padding:4px 8px;text-align:right}"
         "th{background:#f4f4f4}td:first-child,th:first-child{text-align:left}.fig img,.fig svg{max-width:100%}"
         "#summary{border:2px solid #888;border-radius:6px;padding:0 1em;background:#fafafa}"
         "pre{background:#f7f7f7;padding:1em;overflow:auto}")


def html_table(rows: list[list[str]]) -> str:
    """A table from rows of strings (the first is the header), every cell escaped."""
    head, *rest = rows
    return ("<table><tr>" + "".join(f"<th>{html.escape(h)}</th>" for h in head) + "</tr>"
            + "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in r) + "</tr>" for r in rest) + "</table>")


def html_document(title: str, body: list[str]) -> str:
    """A self-contained page: the body parts (already escaped HTML) under an escaped title."""
    return (f"<!doctype html><html><head><meta charset=utf-8><title>{html.escape(title)}</title><style>{STYLE}</style>"
            f"</head><body>{''.join(body)}</body></html>\n")


REPORT_FILES = ("report.md", "report.html")


def _check_report_targets(d: Path) -> None:
    """report.md and report.html are replaced only when they are regular files (a report written before): a
    directory, a link, a fifo of that name is not infertool's to replace (nothing is deleted that it did not write)."""
    for name in REPORT_FILES:
        try:
            st = os.lstat(d / name)
        except FileNotFoundError:
            continue
        except OSError as e:
            raise UsageError(f"cannot write {d / name}: {e.strerror or e}") from None
        if not stat.S_ISREG(st.st_mode):
            what = file_kind(st.st_mode)
            raise UsageError(f"cannot write {d / name}: it is {what}, not a report infertool wrote; nothing was written",
                             hint=f"move {d / name} out of the run directory, then run `infertool report` again")


def write_report(run_dir: str | Path) -> dict:
    """report.md and report.html written into the run directory (each whole); the files and the figures embedded."""
    d, run = read_run(run_dir)
    _check_report_targets(d)
    texts = {"report.md": render_markdown(d, run), "report.html": render_html(d, run)}
    paths = {}
    for name, text in texts.items():
        try:
            write_text(d / name, text)
        except OSError as e:
            raise UsageError(f"cannot write {d / name}: {e.strerror or e}",
                             hint="report writes into the run directory: it must be writable") from None
        paths[name] = str(d / name)
    return {"run_dir": str(d), "files": paths, "figures": {k: str(v) for k, v in run.figures.items()},
            "not_read": run.unreadable, "figures_not_embedded": run.figure_notes}


# ------------------------------------------------------------------------------------------ compare
def headline(run: RunData) -> dict[str, object]:
    """The numbers worth comparing between two runs, flat: {row name: value}."""
    m = run.manifest
    h: dict[str, object] = {"recipe_sha256": m.recipe_sha256}
    if run.quantize is not None:
        for k, v in run.quantize.weight_size.to_dict().items():
            if as_float(v) is not None:
                h[f"quantize.{k}"] = v
    if run.eval is not None:
        h["eval.verdict"] = run.eval.verdict
        for g in run.eval.gates:
            if isinstance(g.name, str):
                h[f"eval.{g.name}"] = g.estimate
    for p in run.profile.timed if run.profile is not None else []:
        key = f"profile.{p.phase}.{p.tokens if p.phase == 'prefill' else 'b' + str(p.batch)}"
        h[key + ".ms"] = p.seconds * 1e3 if p.seconds is not None else None
        h[key + ".verdict"] = p.verdict
    be = run.bench
    for prefix, arm in (("bench", be), ("bench.original", be.original if be is not None else None)):
        for lv in arm.levels if arm is not None else []:
            for spec in compared():  # the metric table's compared figures, by their compare row name
                h[f"{prefix}.{lv.level.label or '?'}.{spec.compare}"] = spec.of(lv.summary)
    names = model_names(run)
    h["model.original"], h["model.candidate"] = names.original, names.candidate
    for r in speed(be).rows:  # what the candidate gains over the original, measured in this run
        h[f"bench.{r.level}.candidate_over_original.output_tok_s"] = r.output_tok_s.ratio
        h[f"bench.{r.level}.candidate_over_original.cost_per_1m_output_tokens"] = r.cost_per_1m.ratio
    for name, rec in m.stages.items():
        h[f"stage.{name}.status"] = rec.status
    return h


@dataclass
class CompareRow(Record):
    metric: str = ""
    a: object = None
    b: object = None
    ratio: float | None = None  # b / a
    changed: bool = False


@dataclass
class RecipeChange(Record):
    field: str = ""  # dotted path in the recipe
    a: object = None
    b: object = None


@dataclass
class Comparison(Record):
    """`infertool compare RUN_A RUN_B`: the recipe fields that differ, and every headline figure of both."""

    a: str = ""
    b: str = ""
    recipe_changes: list[RecipeChange] = field(default_factory=list)
    rows: list[CompareRow] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # files of either run that are there and were not read, and why
    traffic_differs: list[str] = field(default_factory=list)  # why the bench figures were not divided (empty: same)


def compare(run_a: str | Path, run_b: str | Path) -> Comparison:
    """Both runs' headline figures side by side, B / A; the bench's figures are not divided when the two runs
    sent different traffic (``traffic_differs`` and a note say what differs)."""
    from infertool.bench.results import traffic_differences

    da, ra = read_run(run_a)
    db, rb = read_run(run_b)
    ha, hb = headline(ra), headline(rb)
    differs = (traffic_differences(ra.bench, rb.bench, ra.manifest.recipe, rb.manifest.recipe)
               if ra.bench is not None and rb.bench is not None else [])
    rows = []
    for k in sorted(set(ha) | set(hb)):
        a, b = ha.get(k), hb.get(k)
        fa, fb = as_float(a), as_float(b)
        divide = fa and fb is not None and not (differs and k.startswith("bench."))
        rows.append(CompareRow(k, a, b, fb / fa if divide and fa and fb is not None else None, a != b))
    changes = _dict_diff(ra.manifest.recipe or {}, rb.manifest.recipe or {})
    notes = [note for side, run in (("A", ra), ("B", rb)) for note in
             [f"{side}: not read: {rel}: {why}" for rel, why in run.unreadable.items()]
             + [f"{side}: figure not embedded: {why}" for why in run.figure_notes.values()]]
    if differs:
        notes.append("bench figures are not divided (B/A left empty): the two runs sent different traffic: "
                     + "; ".join(differs))
    return Comparison(str(da), str(db), changes, rows, notes, differs)


def compare_runs(run_a: str | Path, run_b: str | Path) -> dict:
    """``compare(...)`` as the JSON `compare --json` prints (the old entry point)."""
    return compare(run_a, run_b).to_dict()


def _dict_diff(a: dict, b: dict, prefix: str = "") -> list[RecipeChange]:
    out = []
    for k in sorted(set(a) | set(b)):
        va, vb = a.get(k), b.get(k)
        path = f"{prefix}{k}"
        if isinstance(va, dict) and isinstance(vb, dict):
            out += _dict_diff(va, vb, path + ".")
        elif va != vb:
            out.append(RecipeChange(path, va, vb))
    return out
