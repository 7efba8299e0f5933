"""Preflight: everything that can be checked about a quantization BEFORE any weights are loaded.

Reads only ``config.json`` and the safetensors headers (``infertool.models.info``): the weight files are whole,
the backend's own rules (``QuantBackend.rules``: does it know the architecture, do ``group_size`` and the int32
packing fit every quantized layer, can this host run it), what vLLM on the recipe's target does with the format
(``QuantBackend.serving``), whether the serve section's tensor-parallel size splits heads and quantized shapes
evenly, and a memory / disk estimate. Pure Python: no torch.
"""

from __future__ import annotations

import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

from infertool import backends
from infertool.backends.base import Check, ModelFacts, QuantBackend, QuantizeConfig, platform
from infertool.backends.layers import ROW_PARALLEL, describe_layers, linear_layers, matches_ignore, valid_group_sizes
from infertool.errors import UsageError
from infertool.models.info import ModelInfo, open_regular, read_safetensors_header
from infertool.perf import host as hostfacts
from infertool.records import Record


@dataclass
class PreflightReport(Record):
    """What the preflight found (quantize.json's ``preflight``, with ``ok``): the model's quantized layers, valid
    group sizes, memory and disk estimates, and every check."""

    model_path: str
    method: str
    backend: str | None
    architecture: str | None
    quantized_linears: int = 0
    linears_total: int = 0
    valid_group_sizes: list[int] = field(default_factory=list)
    memory_estimate_bytes: int | None = None
    memory_available_bytes: int | None = None
    memory_device: str = "cpu"
    output_estimate_bytes: int | None = None
    disk_free_bytes: int | None = None
    weight_bytes: int = 0
    checks: list[Check] = field(default_factory=list)
    plan: dict = field(default_factory=dict)
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.errors

    @property
    def errors(self) -> list[Check]:
        return [c for c in self.checks if not c.ok and c.level == "error"]

    @property
    def warnings(self) -> list[Check]:
        return [c for c in self.checks if not c.ok and c.level == "warning"]

    def add(self, name: str, ok: bool, detail: str, level: str = "error") -> Check:
        check = Check(name, ok, detail, level if not ok else "info")
        self.checks.append(check)
        return check

    def to_dict(self) -> dict:
        return {**super().to_dict(), "ok": self.ok}


class PreflightFailed(UsageError):
    """The recipe cannot work with this model (exit 2): every failed check, one per line."""

    def __init__(self, report: PreflightReport, hint: str | None = None):
        lines = [f"preflight failed for {report.model_path} ({len(report.errors)} problem(s)):"]
        lines += [f"  • {c.name}: {c.detail}" for c in report.errors]
        super().__init__("\n".join(lines), hint=hint)
        self.report = report

    def to_dict(self) -> dict:
        d = super().to_dict()
        d["preflight"] = self.report.to_dict()
        return d


# ---------------------------------------------------------------------------------------------------
# Weight files and disk
# ---------------------------------------------------------------------------------------------------


def check_safetensors_files(files: list[Path]) -> list[str]:
    """Problems with the weight files that can be seen without reading tensor data (truncation, bad entries)."""
    problems: list[str] = []
    for file in files:  # the header's own checks (each tensor's bytes, none past the end) are the reader's
        try:
            end = max((t.end for t in read_safetensors_header(file).values()), default=0)
            with open_regular(file) as f:
                expected = 8 + int.from_bytes(f.read(8), "little") + end
        except UsageError as e:
            problems.append(e.message)
            continue
        except OSError as e:
            problems.append(f"{file.name}: malformed safetensors header entry ({e})")
            continue
        size = file.stat().st_size
        if size != expected:
            problems.append(
                f"{file.name} is corrupt or truncated: it is {size:,} bytes but its header describes {expected:,}"
            )
    return problems


def disk_free(path: Path) -> int | None:
    p = path.expanduser().resolve()
    while not p.exists() and p != p.parent:
        p = p.parent
    try:
        return shutil.disk_usage(p).free
    except OSError:
        return None


# ---------------------------------------------------------------------------------------------------
# The checks
# ---------------------------------------------------------------------------------------------------


def preflight(info: ModelInfo, q: QuantizeConfig, *, serve: dict | None, output: Path | None, has_cuda: bool | None = None,
              memory: tuple[str, int | None] | None = None, target=None, host=None,
              resources: bool = True) -> PreflightReport:
    """Every check of the quantize section ``q`` (a validated QuantizeConfig) on a model; never raises for a
    failed check (see ``report.errors``). ``memory``: (device, free bytes) instead of this host's.
    ``resources`` False: the model's shapes and vLLM's support only, not this host's memory and disk now (the
    check registry's view: the same on every machine, the quantize command adds the rest)."""
    t0 = time.monotonic()
    backend = backends.of(q)
    arch = next(iter(info.architectures or []), None) or info.model_type
    report = PreflightReport(info.path, q.method, backend.name if backend.in_recipe else None, arch,
                             weight_bytes=info.weight_bytes)
    files = [Path(info.path) / f for f in info.weight_files]
    problems = check_safetensors_files(files)
    report.add("weights", not problems, "; ".join(problems) if problems else f"{len(files)} safetensors file(s) consistent with their headers")
    if not problems:
        m = model_facts(info, q, has_cuda=hostfacts.has_cuda() if has_cuda is None else has_cuda, target=target,
                        host=host)
        report.linears_total = len(m.linears)
        report.quantized_linears = len(m.quantized) if backend.checkpoint else len(m.linears)
        report.valid_group_sizes = m.valid_group_sizes
        report.checks += backend.rules(m, q)
        if backend.checkpoint and not m.quantized:
            ignore = list(q.layout().ignore)
            report.add("layers", False, "no linear layer to quantize" + (f" after ignore={ignore}" if ignore else ""))
        report.plan.update(backend.plan(q, has_cuda=m.has_cuda))
        _vllm_check(report, backend, q, target, host)
        _tensor_parallel(report, m, q, backend, int((serve or {}).get("tensor_parallel_size") or 1))
        if resources:
            _memory_and_disk(report, m, q, backend, output, memory)
    report.seconds = time.monotonic() - t0
    return report


def model_facts(info: ModelInfo, q: QuantizeConfig, *, has_cuda: bool, target=None, host=None) -> ModelFacts:
    """The model's linear layers (from the safetensors headers) and those ``q`` quantizes."""
    linears = linear_layers([Path(info.path) / f for f in info.weight_files])
    ignore = list(q.layout().ignore)
    quantized = [lin for lin in linears if not matches_ignore(lin.name, ignore)]
    return ModelFacts(info, linears, quantized, valid_group_sizes(quantized), has_cuda, target, host)


def _vllm_check(report: PreflightReport, backend: QuantBackend, q: QuantizeConfig, target, host) -> None:
    verdict = backend.serving(q, platform(target, host)).verdict
    if verdict is not None:
        level, detail = verdict
        report.add("vllm", False, detail, level=level)


def _tensor_parallel(report: PreflightReport, m: ModelFacts, q: QuantizeConfig, backend: QuantBackend, tp: int) -> None:
    """vLLM splits heads, KV heads and every quantized shape across ``tp`` ranks: all must split evenly."""
    report.plan["tensor_parallel_size"] = tp
    if tp <= 1:
        return
    heads, kv = m.info.num_attention_heads, m.info.num_key_value_heads
    msgs = []
    if heads and heads % tp:
        msgs.append(f"{heads} attention heads are not divisible by tensor_parallel_size {tp}")
    if kv and kv % tp and tp % kv:
        msgs.append(f"{kv} KV heads neither divide nor are divisible by tensor_parallel_size {tp}")
    if backend.checkpoint:
        bits, group = backend.bits(q), q.layout().group_size
        pack = 32 // bits if bits and 32 % bits == 0 else 1
        row_bad = [lin for lin in m.quantized if lin.kind.split(".")[-1] in ROW_PARALLEL and (
            lin.in_features % tp or (group != -1 and (lin.in_features // tp) % group))]
        col_bad = [lin for lin in m.quantized if lin.kind.split(".")[-1] not in ROW_PARALLEL and (
            lin.out_features % tp or (lin.out_features // tp) % pack)]
        if row_bad:
            msgs.append(f"row-parallel layers split in_features into shards that group_size {group} does not divide: "
                        + describe_layers(row_bad))
        if col_bad:
            msgs.append(f"column-parallel layers have out_features that do not split into {tp} packed shards: "
                        + describe_layers(col_bad))
    report.add("tensor_parallel", not msgs, "; ".join(msgs) if msgs else
               f"tensor_parallel_size {tp} divides heads, KV heads and the quantized shapes per shard")


def _memory_and_disk(report: PreflightReport, m: ModelFacts, q: QuantizeConfig, backend: QuantBackend, output: Path | None,
                     memory: tuple[str, int | None] | None) -> None:
    """Memory where the quantization runs, disk for the output (and the original's offloaded layers)."""
    elsewhere = m.target is not None and not m.target.this_host
    need = backend.memory_estimate(m, q)
    if need is not None:
        est, what = need
        device, avail = memory if memory is not None else hostfacts.available_memory()
        report.memory_estimate_bytes, report.memory_available_bytes, report.memory_device = est, avail, device
        if avail is None:
            report.add("memory", True, f"about {est / 2**30:.1f} GiB needed ({device} free memory unknown)")
        elif elsewhere:
            report.add("memory", est <= avail, f"about {est / 2**30:.1f} GiB needed for {what}; this host has "
                       f"{avail / 2**30:.1f} GiB free ({device}): quantize on a machine with more (the recipe is for "
                       "another one)", level="warning")
        else:
            report.add("memory", est <= avail, f"about {est / 2**30:.1f} GiB needed for {what}, "
                       f"{avail / 2**30:.1f} GiB free ({device})"
                       + ("" if est <= avail else ": lower quantize.calibration.samples or seq_len"
                          if backend.calibration(q) is not None else ": quantize on a machine with more memory"))
    if backend.checkpoint:
        report.output_estimate_bytes = backend.output_estimate(m, q)
    if output is None:
        return
    free = disk_free(output)
    report.disk_free_bytes = free
    need_disk = (report.output_estimate_bytes or 0) + (m.info.weight_bytes if backend.checkpoint else 0)
    if free is not None:
        report.add("disk", need_disk <= free,
                   f"about {need_disk / 2**20:,.0f} MiB needed (output + offloaded original), {free / 2**20:,.0f} MiB "
                   f"free at {output.parent}"
                   + (" (the recipe is for another machine: quantize where there is room)" if elsewhere and need_disk > free else ""),
                   level="warning" if elsewhere else "error")


def fix_hint(report: PreflightReport) -> str | None:
    """What to change for the first failed check that has a known fix (a group size that divides every layer)."""
    for c in report.errors:
        if c.name == "held_out":
            return ("calibrate on other text (quantize.calibration.source), score another suite, or set "
                    "quantize.calibration.allow_eval_overlap: true to accept the overlap (recorded in the manifest)")
        if c.name == "group_size":
            valid = [g for g in report.valid_group_sizes if g != -1]
            if valid:
                pick = 64 if 64 in valid else valid[-1]
                return f"set a group size that divides every in_features, e.g. --set quantize.group_size={pick}"
    return "fix the recipe (or the model) and run `infertool quantize RECIPE --check` again"
