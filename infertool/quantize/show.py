"""`infertool quantize`'s answer on the terminal: the preflight's checks, then what the quantization made (sizes,
calibration, layer errors, greedy agreement, the vLLM load check)."""

from __future__ import annotations

from rich.text import Text

from infertool.backends.greedy import Agreement
from infertool.output import err, kv_table, out, plain
from infertool.quantize.core import QuantizeResult


def _mib(n: int | None) -> str:
    return "?" if n is None else f"{n / 2**20:,.1f} MiB"


def render(result: QuantizeResult) -> None:
    pf = result.preflight
    checks = [(c.name, Text.assemble(("ok ", "green") if c.ok else ("warning ", "yellow"), plain(c.detail)))
              for c in (pf.checks if pf else [])]
    out.print(kv_table(checks, title=f"preflight: {result.method} ({result.backend or 'load-time'}) on {result.source_model}"))
    if result.checked_only:
        err.print(f"[green]✓[/] preflight passed in {pf.seconds if pf else 0:.2f} s: no weights loaded (--check)")
        return
    rows = [("output", result.output)] + _rows(result)
    rows.append(("time", f"{result.timings.get('total', 0):.1f} s"))
    rows.append(("manifest", result.manifest_path))
    out.print(kv_table(rows, title=f"quantized {result.recipe}"))


def _rows(result: QuantizeResult) -> list[tuple[str, str | Text | None]]:
    """What the quantization made: sizes, calibration, layer errors, greedy agreement, the load check."""
    rows: list[tuple[str, str | Text | None]] = []
    s = result.weight_size
    if s.weight_bytes_after is not None:
        rows.append(("weights", f"{_mib(s.weight_bytes_before)} -> {_mib(s.weight_bytes_after)} "
                                f"({s.reduction_pct or 0:.1f} % smaller)"))
    c = result.calibration
    if c is not None and c.windows_sha256:
        rows.append(("calibration", f"{c.samples} x {c.seq_len} tokens from {c.kind} (seed {c.seed}), "
                                    f"sha256 {c.windows_sha256[:16]}"))
    le = result.layer_errors
    if le is not None and le.mean_loss is not None:
        rows.append(("layer error", f"mean {le.mean_loss:.3g}, max {le.max_loss or 0:.3g} ({le.max_module}) over "
                                    f"{le.modules} modules"))
    la = result.local_agreement
    if la is not None and la.agreement is not None:
        rows.append(("greedy agreement", f"{la.agreement:.1%} of {la.tokens} tokens vs the original "
                                         f"({la.identical}/{la.prompts} identical; {la.engine})"))
    v = result.verify
    if v is None:
        rows.append(("vLLM load check", "skipped (--no-verify, or the serve environment is not set up)"))
    elif v.generated and isinstance(a := v.agreement, Agreement):
        rows.append(("vLLM load check", Text.assemble(("loaded", "green"), f"; greedy token agreement {a.agreement or 0:.1%} "
                                                      f"over {a.tokens} tokens ({a.identical}/{a.prompts} completions "
                                                      "identical)")))
    elif v.loaded:
        rows.append(("vLLM load check", Text.assemble(("loaded", "green"), plain(f"; generation unavailable here: {v.reason}"))))
    else:
        rows.append(("vLLM load check", str(v.reason)))
    return rows
