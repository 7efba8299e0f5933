"""The bench figures a published folder carries (``evidence/speed.json``, ``verify.speed``): from the run's bench
stage, with the hardware they were measured on, the engine and serve settings the evidence records, the workload.

    run_speed(run_dir, manifest) -> (SpeedRecord | None, why not)
    with_speed(writer, record, why) -> EvidenceWriter      the evidence writer, then speed.json beside its index
    copied_speed(writer, source) -> EvidenceWriter         a published folder's speed.json copied with its evidence
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from infertool.records import Record
from infertool.summaries import EvidenceBlock

if TYPE_CHECKING:
    from infertool.summaries import RunManifest
    from infertool.verify.speed import SpeedHardware, SpeedRecord


EvidenceWriter = Callable[[Path, str], EvidenceBlock]  # as publish.folder's: (the evidence folder, the fingerprint)


@dataclass
class RunHost(Record):
    """What a run's manifest says of its host, as far as speed.json compares it."""

    accelerator: str | None = None
    cpu_isa: str | None = None
    gpu_name: str | None = None
    gpu_count: int = 0


def _hardware(manifest: RunManifest) -> tuple[SpeedHardware, str | None]:
    """This host's hardware when it is the run's (the manifest's accelerator, CPU instruction set and GPU), else
    what the manifest says alone, with the reason."""
    from infertool.perf import host
    from infertool.verify.speed import SpeedHardware, hardware_now

    now, was = hardware_now(), RunHost.from_dict(manifest.host or {})
    same = (was.accelerator == now.accelerator and was.gpu_count == now.gpu_count
            and (was.cpu_isa in (None, host.cpu_isa()) if not now.gpu_model else was.gpu_name == now.gpu_model))
    if same:
        return now, None
    return SpeedHardware(was.accelerator, None, [was.cpu_isa] if was.cpu_isa else [], None, was.gpu_name,
                         was.gpu_count), "the run's host is not this one: its hardware as the manifest records it"


def run_speed(run_dir: Path, manifest: RunManifest) -> tuple[SpeedRecord | None, str | None]:
    """The speed record of a run's bench stage (the engine and serve settings are filled from the evidence when it
    is written: ``with_speed``), or why there is none."""
    from infertool.publish.served import recipe_of_run
    from infertool.report.rundir import collect
    from infertool.verify.evidence import EngineFacts
    from infertool.verify.speed import from_bench

    data = collect(run_dir, manifest)
    if data.bench is None or not data.bench.levels:
        return None, "the run has no bench stage results"
    try:
        recipe = recipe_of_run(run_dir, manifest)
    except Exception as e:  # noqa: BLE001 - an older run's recipe: the figures are still published without it
        return None, f"the run's recipe does not validate ({str(e)[:200]})"
    if recipe.bench is None:
        return None, "the run's recipe has no bench section"
    hw, note = _hardware(manifest)
    rec = from_bench(data.bench, bench=recipe.bench.model_dump(mode="json"), serve={}, engine=EngineFacts(),
                     hardware=hw, source=f"run {run_dir.name}" + (f" ({note})" if note else ""))
    return (rec, None) if rec.levels else (None, "the run's bench measured no concurrency or rate level")


def with_speed(writer: EvidenceWriter | None, record: SpeedRecord | None) -> EvidenceWriter | None:
    """``writer`` (the evidence), then ``record`` written beside its index with the engine and serve settings the
    evidence records (the server the answers were captured from ran the same launch as the bench's); nothing
    when there is no evidence (verify reads neither without the other)."""
    if writer is None or record is None:
        return writer
    inner = writer

    def write(folder: Path, fp: str) -> EvidenceBlock:
        from infertool.verify import evidence as E
        from infertool.verify import speed as S

        block = inner(folder, fp)
        if block.fingerprint:
            idx = E.read_index(folder)
            record.engine, record.serve = idx.engine, dict(idx.serve)
            S.write(folder, record)
        return block

    return write


def copied_speed(writer: EvidenceWriter | None, source: Path) -> EvidenceWriter | None:
    """A published source's evidence copied (``writer``), and its speed.json with it (read and checked)."""
    if writer is None:
        return None
    inner = writer

    def write(folder: Path, fp: str) -> EvidenceBlock:
        from infertool.verify import speed as S

        block = inner(folder, fp)
        rec = S.read(source)
        if block.fingerprint and rec is not None:
            S.write(folder, rec)
        return block

    return write
