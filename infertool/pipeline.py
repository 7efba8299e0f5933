"""`infertool run`: the run graph (model -> quantize -> eval -> profile -> serve -> bench, as the stage registry
declares them) into one run directory with one manifest.

The graph comes from ``infertool.stages``: the stages the recipe asks for (or ``--stages`` / run.stages) with
the stages they depend on, each with its key (the recipe sections it reads, its inputs by content, its upstream
stages' keys; ``infertool.stages.stage_key``) and its entry in the stage cache ``<out_dir>/.stages/<stage>-<key>/``
(``infertool.stages.cache``): written to a temporary directory and renamed when complete, so an interruption
never leaves a half-written entry; a re-run reuses completed entries by key and continues where the last run
stopped. The run directory ``<out_dir>/<recipe>-<timestamp>/`` links each stage's entry and holds
``manifest.json`` (``infertool.summaries.RunManifest``: resolved recipe, input hashes, environment versions,
each stage's status, timings and summary).

The stages that serve (declared ``server``: serve's check, bench's arms, eval's and profile's vllm engines)
share the run's servers (``infertool.serve.pool``): one vLLM start per distinct launch, quantize's load check
included (its server serves the checkpoint the stage publishes, with the recipe's serve settings: serve's check
and bench share it). A stage that runs an engine in-process (declared ``device``: quantize, hf eval, hf profile)
gets the device first: on a GPU every pooled server stops before it; on a CPU idle servers stay while memory
allows, paused (SIGSTOP) until a stage asks for a server (a ``times_host`` stage records the CPU time they took
beside it). The manifest's ``servers`` lists each server started (who started it, who used it, its start-up
seconds and log, where its model moved, what it was paused for), and each stage's record says which servers it
used (started or reused).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from infertool.atomic import remove_inside, write_json
from infertool.errors import InfertoolError, UsageError
from infertool.stages import Stage, StageContext, StageOutput, cached_stage
from infertool.summaries import ModelSummary, RunManifest, StageRecord

if TYPE_CHECKING:
    from infertool.recipe import Recipe
    from infertool.resolve import Resolution

EventCallback = Callable[[dict], None]
StageCallback = Callable[[str, str, StageRecord], None]


@dataclass
class RunResult:
    run_dir: str
    manifest: RunManifest
    ok: bool
    exit_code: int
    stages: dict[str, StageRecord] = field(default_factory=dict)
    published: dict | None = None  # {path, fingerprint}, or {why} nothing was published


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


# ------------------------------------------------------------------------------------------- graph
@dataclass
class RunGraph:
    """What `run` does for a recipe: the stages in graph order, their keys and entries, what runs again, and
    the resolution before any stage ran (its inputs and host facts are the keys')."""

    recipe: Recipe
    stages: list[Stage]
    keys: dict[str, str]
    root: Path
    force: set[str]
    res: Resolution

    @property
    def cache(self) -> Path:
        return self.root / ".stages"

    def entry(self, name: str) -> Path:
        return self.cache / f"{name}-{self.keys[name]}"

    @property
    def names(self) -> list[str]:
        return [s.name for s in self.stages]


def selected_stages(recipe: Recipe, stages: list[str] | None) -> list[str]:
    """The stages `run` runs, in graph order: ``stages`` (else run.stages, else what the recipe's sections ask
    for) with the stages they depend on."""
    from infertool.stages import check_recipe, select

    check_recipe(recipe)
    if not stages and recipe.run is not None and recipe.run.stages:
        stages = list(recipe.run.stages)
    return [s.name for s in select(recipe, stages or None)]


def _stages_to_rerun(force: list[str] | None) -> set[str]:
    from infertool.stages import names

    bad = sorted(set(force or []) - set(names()))
    if bad:
        raise UsageError(f"unknown stage(s) to re-run: {', '.join(bad)}", hint=f"stages: {', '.join(names())}")
    return set(force or [])


def run_graph(recipe: Recipe, *, stages: list[str] | None = None, out_dir: str | Path | None = None,
              force: list[str] | None = None) -> RunGraph:
    from infertool.resolve import resolve
    from infertool.stages import get, keys

    chosen = [get(n) for n in selected_stages(recipe, stages)]
    again = _stages_to_rerun(force)
    root = Path(out_dir or (recipe.run.out_dir if recipe.run is not None else "runs")).expanduser()
    res0 = resolve(recipe)
    return RunGraph(recipe, chosen, keys(recipe, chosen, res0.inputs(), res0.host.to_dict()), root, again, res0)


def plan_pipeline(recipe: Recipe, *, stages: list[str] | None = None, out_dir: str | Path | None = None,
                  force: list[str] | None = None, publish: str | None = None) -> dict:
    """What `run` would do, without doing it: the stages, their keys and whether a completed entry would be
    reused, the resolution (with the candidate where the quantize stage's entry will be), the server
    launches of the stages that serve, and which of them share one server (``servers``)."""
    from infertool.resolve import resolve
    from infertool.serve.pool import launch_key

    g = run_graph(recipe, stages=stages, out_dir=out_dir, force=force)
    cand = g.entry("quantize") / "model" if "quantize" in g.keys else None
    res = resolve(recipe, candidate_path=cand)
    out: dict = {"stages": {n: {"key": k, "entry": str(g.entry(n)),
                                "reuse": n not in g.force and (g.entry(n) / "stage.json").is_file()}
                            for n, k in g.keys.items()},
                 "resolution": res.to_dict(), "inputs": g.res.inputs(), "launches": {}}
    notes: list[str] = []
    for st in g.stages:
        out["launches"].update(st.planned_launches(res))
        notes += st.planned_notes(res)
    if notes:
        out["notes"] = notes
    servers: dict[str, list[str]] = {}  # launches of the same key share one server in the run
    for label, launch in out["launches"].items():
        servers.setdefault(launch_key(launch), []).append(label)
    out["servers"] = [{"key": k, "used_by": v} for k, v in servers.items()]
    dest = publish_destination(g, publish)
    out["publish"] = {"path": str(dest)} if dest is not None else {"why": _why_not_published(g, None)}
    return out


def publish_destination(g: RunGraph, publish: str | None) -> Path | None:
    """Where the run will publish its evaluated checkpoint (``infertool.publish.run_destination``), checked now,
    before any stage runs: a DEST inside the stage cache, the source model or the environments, or one that may
    not be replaced, is refused (exit 2). None: the run publishes nothing (no quantize or eval stage)."""
    from infertool import publish as pub

    if "quantize" not in g.keys or "eval" not in g.keys:
        if publish:
            raise UsageError(f"--publish {publish}: {_why_not_published(g, None)}",
                             hint="publishing needs the quantize and eval stages (--stages quantize,eval)")
        return None
    dest = pub.run_destination(g.recipe, publish)
    if dest is not None:
        pub.check_dest(dest, pub.forbidden_for_run(g.cache, g.root / f"{g.recipe.name}-<time>", g.res))
    return dest


def _why_not_published(g: RunGraph, upstream: dict | None) -> str:
    if "quantize" not in g.keys:
        return "the run has no quantize stage: there is no checkpoint to publish"
    if "eval" not in g.keys:
        return "the run has no eval stage: nothing scored the checkpoint, so nothing is published"
    if upstream is not None and ("quantize" not in upstream or "eval" not in upstream):
        return "the run stopped before its eval scored the checkpoint"
    return "the recipe quantizes when loading (no checkpoint of its own to publish)"


def _publish(g: RunGraph, run_dir: Path, manifest: RunManifest, upstream: dict, dest: Path | None, pool=None,
             on_event: EventCallback | None = None, evidence: bool = True) -> dict:
    """The run's evaluated checkpoint published with its card (a FAIL verdict too: the card says so) and its
    evidence (``infertool.verify.capture``: the candidate served with the recipe's settings, the pool's server
    eval scored it on when it still runs; ``evidence`` False: --no-evidence); the manifest's ``published``
    record either way."""
    from infertool import publish as pub

    if dest is None or "quantize" not in upstream or "eval" not in upstream:
        return {"why": _why_not_published(g, upstream)}
    checkpoint = upstream["quantize"].dir / "model"
    if not (checkpoint / "config.json").is_file():
        return {"why": f"the quantize stage left no checkpoint ({checkpoint} has no config.json)"}
    writer, why = None, "published with --no-evidence"
    spec = g.recipe.verify.evidence if g.recipe.verify is not None else None
    if evidence and spec is not None and not spec.enabled:
        why = "verify.evidence.enabled is false in the recipe"
    elif evidence:
        from infertool.resolve import resolve
        from infertool.verify.capture import lmeval_source, writer as evidence_writer

        answer, lm_why = lmeval_source(g.recipe, upstream["eval"].dir)
        writer = evidence_writer(resolve(g.recipe, candidate_path=checkpoint), checkpoint, pool=pool,
                                 on_event=on_event, log_dir=run_dir / "logs", lmeval_answer=answer,
                                 lmeval_why=lm_why, strict=False)
    return pub.publish_run(run_dir, manifest, checkpoint, dest, pub.forbidden_for_run(g.cache, run_dir, g.res),
                           writer, why)


# ------------------------------------------------------------------------------------------ run
def _new_run_dir(root: Path, name: str) -> Path:
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    run_dir, n = root / f"{name}-{stamp}", 1
    while True:
        try:
            run_dir.mkdir(parents=True)
            return run_dir
        except FileExistsError:  # two runs in the same second
            n += 1
            run_dir = root / f"{name}-{stamp}-{n}"


def run_pipeline(recipe: Recipe, *, stages: list[str] | None = None, force: list[str] | None = None,
                 out_dir: str | Path | None = None, on_event: EventCallback | None = None,
                 on_stage: StageCallback | None = None, publish: str | None = None, evidence: bool = True) -> RunResult:
    """Run the selected stages; reuse completed ones by key; publish the checkpoint the eval scored (to
    --publish, else quantize.output, else out/<recipe>-<method>), with its evidence while the run's servers
    still run (``evidence`` False: --no-evidence). Returns the run directory and manifest."""
    from infertool import __version__
    from infertool.data.fingerprint import digest
    from infertool.recipe import recipe_to_dict

    g = run_graph(recipe, stages=stages, out_dir=out_dir, force=force)
    dest = publish_destination(g, publish)  # refused before any work
    g.cache.mkdir(parents=True, exist_ok=True)
    run_dir = _new_run_dir(g.root, recipe.name)
    rd = recipe_to_dict(recipe)
    host = g.res.host.to_dict()
    manifest = RunManifest(infertool=__version__, recipe_name=recipe.name, recipe=rd, recipe_sha256=digest(rd),
                           inputs=g.res.inputs(), host=host, target=g.res.target.to_dict(), envs=_env_versions(),
                           started=_now(), stages={n: StageRecord() for n in g.names}, run_dir=str(run_dir))
    write_json(run_dir / "manifest.json", manifest.to_dict())
    pool = server_pool(run_dir, host, on_event)
    manifest.servers = pool.records
    runner = _Runner(g, run_dir, manifest, pool, on_event, on_stage)
    try:
        exit_code = runner.run()
        manifest.published = _publish(g, run_dir, manifest, runner.upstream, dest, pool, on_event, evidence)
    finally:
        pool.close()  # the end of the run, a failure or Ctrl-C: no server outlives it
        runner.finish()
    runner.write()
    return RunResult(str(run_dir), manifest, exit_code == 0, exit_code, manifest.stages, manifest.published)


class _Runner:
    """One run of a graph: each stage through the stage cache, its record in the manifest, the servers."""

    def __init__(self, g: RunGraph, run_dir: Path, manifest: RunManifest, pool, on_event, on_stage):
        self.g, self.run_dir, self.manifest, self.pool = g, run_dir, manifest, pool
        self.on_event, self.on_stage = on_event, on_stage
        self.upstream: dict[str, StageOutput] = {}

    def write(self) -> None:
        write_json(self.run_dir / "manifest.json", self.manifest.to_dict())

    def finish(self) -> None:
        self.manifest.finished = _now()
        self.write()

    def tell(self, name: str, status: str, rec: StageRecord) -> None:
        if self.on_stage:
            self.on_stage(name, status, rec)

    def run(self) -> int:
        exit_code = 0
        for i, stage in enumerate(self.g.stages):
            summary = self.run_stage(stage, self.g.stages[i + 1:])
            if summary.verdict_failed:
                exit_code = 1  # the verdict gates the run (documented): the other stages still run
        self.manifest.resolution = _final_resolution(self.g.recipe, self.upstream)
        return exit_code

    def run_stage(self, stage: Stage, later: list[Stage]):
        name, entry = stage.name, self.g.entry(stage.name)
        self.pool.user = name
        rec = self.manifest.stages[name]
        rec.key, rec.dir, rec.status, rec.started = self.g.keys[name], str(entry), "running", _now()

        def started() -> None:
            if stage.uses_device(self.g.recipe):
                self.pool.before_device_stage(name, _device_need(self.upstream))
            self.write()
            self.tell(name, "running", rec)

        t0 = time.monotonic()
        try:
            st = cached_stage(self.g.cache, name, self.g.keys[name], lambda work: self.body(stage, work),
                              force=name in self.g.force, on_start=started, summary_type=stage.summary)
        except BaseException as e:
            self.failed(stage, rec, e, round(time.monotonic() - t0, 1))
            raise
        if st.work is not None:
            self.pool.moved(st.work, entry)  # a server started from the stage's files (quantize's load check) follows them
        if not any(s.uses_servers(self.g.recipe) for s in later):
            self.pool.stop_all("no later stage serves")
        rec.status, rec.summary, rec.seconds = st.status, st.summary, st.seconds
        if st.status == "reused":
            rec.completed, rec.started = st.completed, None
        else:
            self.note_servers(rec, name)
        self.upstream[name] = StageOutput(entry, st.summary, self.g.keys[name])
        _link(self.run_dir / name, entry)
        self.write()
        self.tell(name, st.status, rec)
        return st.summary

    def body(self, stage: Stage, work: Path):
        """The stage's work in its temporary directory, with the run's servers; a timing stage that runs
        in-process (hf profile) gets the CPU time the idle servers beside it took."""
        beside = self.pool.running() if stage.times_host and stage.uses_device(self.g.recipe) else []
        cpu0 = self.pool.cpu_seconds() if beside else 0.0
        t_body = time.monotonic()
        ctx = StageContext(self.g.recipe, self.run_dir, work, dict(self.upstream), self.on_event, self.pool)
        summary = stage.summarize(stage.run(ctx))
        if beside:
            summary.servers_beside = _beside(len(beside), self.pool.cpu_seconds() - cpu0, time.monotonic() - t_body,
                                             self.on_event)
        summary.servers = self.pool.uses_by(stage.name) or None
        return summary

    def failed(self, stage: Stage, rec: StageRecord, e: BaseException, seconds: float) -> None:
        """A stage interrupted (Ctrl-C) or failed: its record says so; an InfertoolError names the stage."""
        rec.seconds = seconds
        rec.status = "interrupted" if isinstance(e, KeyboardInterrupt) else "failed"
        self.note_servers(rec, stage.name)
        if isinstance(e, InfertoolError):
            rec.error = e.to_dict()
            self.finish()
            self.tell(stage.name, "failed", rec)
            e.message = f"stage {stage.name} failed: {e.message}"
            e.log_path = e.log_path or str(self.run_dir / "manifest.json")

    def note_servers(self, rec: StageRecord, name: str) -> None:
        """The servers a stage used in this run: started by it, or shared (started by an earlier stage)."""
        used = self.pool.uses_by(name)
        if used:
            rec.servers = used


def _device_need(upstream: dict[str, StageOutput]) -> int:
    """What an in-process stage needs on a CPU, with margin: three times the model's weights (base and
    candidate side by side, a 16-bit checkpoint computed in float32) and 2 GiB of runtime."""
    model = upstream.get("model")
    weights = model.summary.weight_bytes if model is not None and isinstance(model.summary, ModelSummary) else None
    return 3 * int(weights or 0) + 2 * 1024**3


def server_pool(run_dir: Path, host: dict, on_event: EventCallback | None):
    """The run's servers: one at a time on a GPU host, as memory allows on a CPU (infertool.serve.pool)."""
    from infertool.serve.pool import ServerPool

    return ServerPool(run_dir / "servers", gpu=host.get("accelerator") == "cuda", on_event=on_event)


def _env_versions() -> dict:
    from infertool.envs.state import read_marker

    out = {}
    for name in ("quant", "serve", "llmcompressor"):
        m = read_marker(name)
        if m:
            out[name] = {"variant": m.variant, "packages": m.packages, "fingerprint": m.fingerprint}
    return out


BESIDE_WARN_SHARE = 0.02  # of one core: paused servers take none, idle vLLM servers measured under 0.01


def _beside(servers: int, cpu_s: float, stage_s: float, on_event: EventCallback | None) -> dict:
    """The idle servers that ran beside a timing stage, and the CPU time they took meanwhile (said when it is
    more than an idle server takes: the stage's figures may then be low)."""
    share = cpu_s / stage_s if stage_s > 0 else 0.0
    d = {"servers": servers, "cpu_s": round(cpu_s, 2), "stage_s": round(stage_s, 1), "core_share": round(share, 4)}
    if share > BESIDE_WARN_SHARE and on_event:
        on_event({"event": "log", "level": "warning",
                  "message": f"{servers} idle vLLM server(s) beside profile used {cpu_s:.1f} CPU-s in its {stage_s:.0f} s "
                             f"({share:.0%} of a core): its timings may be low; `infertool profile` alone measures "
                             "without them"})
    return d


def _final_resolution(recipe: Recipe, upstream: dict[str, StageOutput]) -> dict | None:
    """What this run served and scored: the resolution with the candidate this run made."""
    from infertool.resolve import resolve

    q = upstream.get("quantize")
    try:
        return resolve(recipe, candidate_path=q.dir / "model" if q else None).to_dict()
    except InfertoolError:
        return None


def _link(link: Path, target: Path) -> None:
    if link.is_symlink() or link.is_file():  # a folder there is never removed: os.symlink then fails, as unlink did
        remove_inside(link, link.parent)
    os.symlink(os.path.relpath(target, link.parent), link)
