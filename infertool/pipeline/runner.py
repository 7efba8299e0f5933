"""`run` itself: each stage of the graph through the stage cache into one run directory, its record in the
manifest, the run's servers, the published checkpoint."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from infertool.atomic import remove_inside, write_json
from infertool.errors import InfertoolError
from infertool.pipeline.evidence import RunEvidence, publish_checkpoint
from infertool.pipeline.graph import RunGraph, publish_destination, run_graph
from infertool.stages import Stage, StageContext, StageOutput, cached_stage
from infertool.summaries import ModelSummary, Published, RunManifest, StageRecord

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
    published: Published | None = None  # the checkpoint published, or why nothing was


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


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
                 on_stage: StageCallback | None = None, publish: str | None = None, evidence: bool = True,
                 res: Resolution | None = None, sign_key: str | None = None) -> RunResult:
    """Run the selected stages; reuse completed ones by key; publish the checkpoint the eval scored (to
    --publish, else quantize.output, else out/<recipe>-<method>), with its evidence while the run's servers
    still run (``evidence`` False: --no-evidence), signed with ``sign_key`` (--sign-key: an EC private key file,
    checked before any work). ``res``: the recipe's resolution, when the command made it (the run resolves its
    recipe once). Returns the run directory and manifest."""
    from infertool import __version__
    from infertool.data.fingerprint import digest
    from infertool.recipe import recipe_to_dict

    g = run_graph(recipe, stages=stages, out_dir=out_dir, force=force, res=res)
    dest = publish_destination(g, publish)  # refused before any work
    if sign_key:
        from infertool.signing import signature_of

        signature_of(sign_key)  # a key that cannot sign: refused before any work too
    g.cache.mkdir(parents=True, exist_ok=True)
    run_dir = _new_run_dir(g.root, recipe.name)
    rd = recipe_to_dict(recipe)
    manifest = RunManifest(infertool=__version__, recipe_name=recipe.name, recipe=rd, recipe_sha256=digest(rd),
                           inputs=g.res.inputs(), host=g.res.host.to_dict(), target=g.res.target.to_dict(),
                           envs=_env_versions(), started=_now(), stages={n: StageRecord() for n in g.names},
                           run_dir=str(run_dir))
    write_manifest(run_dir, manifest)
    pool = server_pool(run_dir, g.res.host.accelerator == "cuda", on_event)
    manifest.servers = pool.records
    spec = recipe.verify.evidence if recipe.verify is not None else None
    ev = RunEvidence(g, run_dir, pool, on_event, evidence and dest is not None and (spec is None or spec.enabled))
    runner = _Runner(g, run_dir, manifest, pool, on_event, on_stage, ev)
    try:
        exit_code = runner.run()
        manifest.published = publish_checkpoint(g, run_dir, manifest, runner.res, runner.upstream, dest, ev, evidence,
                                                sign_key)
    finally:
        pool.close()  # the end of the run, a failure or Ctrl-C: no server outlives it
        ev.discard()
        runner.finish()
    runner.write()
    return RunResult(str(run_dir), manifest, exit_code == 0, exit_code, manifest.stages, manifest.published)


def write_manifest(run_dir: Path, manifest: RunManifest) -> None:
    """THE writer of a run's manifest.json (its one reader: ``infertool.report.load_run``)."""
    write_json(run_dir / "manifest.json", manifest.to_dict())


class _Runner:
    """One run of a graph: each stage through the stage cache, its record in the manifest, the servers."""

    def __init__(self, g: RunGraph, run_dir: Path, manifest: RunManifest, pool, on_event, on_stage,
                 evidence: RunEvidence):
        self.g, self.run_dir, self.manifest, self.pool = g, run_dir, manifest, pool
        self.on_event, self.on_stage, self.evidence = on_event, on_stage, evidence
        self.upstream: dict[str, StageOutput] = {}
        self.res = g.res  # with the candidate once the quantize stage made it

    def write(self) -> None:
        write_manifest(self.run_dir, self.manifest)

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
        try:
            self.manifest.resolution = self.res.to_dict()  # what this run served and scored
        except InfertoolError:
            self.manifest.resolution = None
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
        rec.status, rec.summary, rec.seconds = st.status, st.summary, st.seconds
        if st.status == "reused":
            rec.completed, rec.started = st.completed, None
        else:
            self.note_servers(rec, name)
        self.upstream[name] = StageOutput(entry, st.summary, self.g.keys[name])
        if name == "quantize":
            from infertool.resolve import with_candidate

            self.res = with_candidate(self.res, entry / "model")
        self.evidence.capture_if_up(self.res, self.upstream)  # while the candidate's server is up: no start of its own
        if not any(s.uses_servers(self.g.recipe) for s in later):
            self.pool.stop_all("no later stage serves")
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
        ctx = StageContext(self.g.recipe, self.run_dir, work, dict(self.upstream), self.on_event, self.pool,
                           res=self.res)
        summary = stage.summarize(stage.run(ctx))
        if beside:
            summary.servers_beside = beside_servers(len(beside), self.pool.cpu_seconds() - cpu0,
                                                    time.monotonic() - t_body, self.on_event)
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
    """What an in-process stage needs on a CPU (``serve.pool.in_process_need`` of the model's weights)."""
    from infertool.serve.pool import in_process_need

    model = upstream.get("model")
    weights = model.summary.weight_bytes if model is not None and isinstance(model.summary, ModelSummary) else None
    return in_process_need(int(weights or 0))


def server_pool(run_dir: Path, gpu: bool, on_event: EventCallback | None):
    """The run's servers: one at a time on a GPU host, as memory allows on a CPU (infertool.serve.pool)."""
    from infertool.serve.pool import ServerPool

    return ServerPool(run_dir / "servers", gpu=gpu, on_event=on_event)


def _env_versions() -> dict:
    from infertool.envs.state import read_marker

    out = {}
    for name in ("quant", "serve", "llmcompressor"):
        m = read_marker(name)
        if m:
            out[name] = {"variant": m.variant, "packages": m.packages, "fingerprint": m.fingerprint}
    return out


BESIDE_WARN_SHARE = 0.02  # of one core: paused servers take none, idle vLLM servers measured under 0.01


def beside_servers(servers: int, cpu_s: float, stage_s: float, on_event: EventCallback | None) -> dict:
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


def _link(link: Path, target: Path) -> None:
    if link.is_symlink() or link.is_file():  # a folder there is never removed: os.symlink then fails, as unlink did
        remove_inside(link, link.parent)
    os.symlink(os.path.relpath(target, link.parent), link)
