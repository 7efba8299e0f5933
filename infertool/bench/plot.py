"""Latency against throughput across the sweep, as a PNG (matplotlib, imported only here)."""

from __future__ import annotations

from pathlib import Path
from typing import Iterable

from infertool.bench.results import ABRow, BenchReport, JsonObject, LevelResult, Summary
from infertool.metricspec import OUTPUT_TOKEN_THROUGHPUT, TPOT_P50_MS, TTFT_P50_MS

# a plotted level: output tok/s, (TTFT p50, TPOT p50) ms, its label
Point = tuple[float | None, tuple[float | None, float | None], str]


def plot_latency_throughput(report: BenchReport | JsonObject, path: str | Path) -> Path:
    """One point per load level: output tokens/s on x; TTFT p50 and TPOT p50 (ms) on y; one line per
    traffic pattern of the sweep, per experiment arm that is not the sweep itself and, when `run` measured
    the original beside the candidate (``report.original``), per traffic pattern of the original. Models
    are named as a person names them (``label``: source and quantization), never by a cache path.
    ``report``: a BenchReport or its JSON data (bench.json)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    report = BenchReport.from_dict(report)
    series = _series(report)
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for ax, key, title in ((axes[0], 0, "TTFT p50 (ms)"), (axes[1], 1, "TPOT p50 (ms)")):
        for name, points in series.items():
            pts = [(tok_s, lat[key], label) for tok_s, lat, label in points]
            pts = [p for p in pts if p[0] is not None and p[1] is not None]
            if not pts:
                continue
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=mpl_text(name))
            for x, y, label in pts:
                ax.annotate(label.split()[-1], (x, y), textcoords="offset points", xytext=(4, 4), fontsize=7)
        ax.set_xlabel("output tokens/s")
        ax.set_ylabel(title)
        ax.grid(True, alpha=0.3)
    axes[0].legend(fontsize=7)
    fig.suptitle(mpl_text(plot_title(report)), fontsize=10)
    fig.tight_layout()
    from infertool.atomic import atomic_path

    out = Path(path)
    try:
        with atomic_path(out, suffix=".png") as tmp:  # a whole PNG or none
            fig.savefig(tmp, dpi=110, format="png")
    finally:
        plt.close(fig)
    return out


def _series(report: BenchReport) -> dict[str, list[Point]]:
    """Each line of the plot: its name -> (output tok/s, (TTFT p50, TPOT p50), level label) per point."""
    original = report.original
    series: dict[str, list[Point]] = {}

    tput, ttft, tpot = OUTPUT_TOKEN_THROUGHPUT, TTFT_P50_MS, TPOT_P50_MS

    def point(s: Summary, label: str) -> Point:
        return tput.of(s), (ttft.of(s), tpot.of(s)), label

    for lv in report.levels:
        series.setdefault(f"candidate: {lv.level.kind}" if original else lv.level.kind, []).append(
            point(lv.summary, lv.level.label))
    for lv in (original.levels if original else []):
        series.setdefault(f"original: {lv.level.kind}", []).append(point(lv.summary, lv.level.label))
    main = [tput.of(lv.summary) for lv in report.levels if lv.level.kind == "concurrency"]
    for exp in report.experiments:
        for arm in ("a", "b"):  # the arm that IS the main sweep is drawn once, as the sweep
            pts = [(_figure(row, tput.name, arm), (_figure(row, ttft.name, arm), _figure(row, tpot.name, arm)),
                    row.b_level if arm == "b" else row.level) for row in exp.rows]
            if [p[0] for p in pts] != main:
                series[f"{exp.experiment}: {getattr(exp, arm)}"] = pts
    return series


def _figure(row: ABRow, key: str, arm: str) -> float | None:
    f = row.figures.get(key)
    return None if f is None else f.a if arm == "a" else f.b


def plot_title(report: BenchReport | JsonObject) -> str:
    """'latency vs throughput: <label>', with the original on a second line when it was measured too."""
    report = BenchReport.from_dict(report)
    label = report.label or report.served_model.label or report.model or ""
    original = report.original
    if not original:
        return f"latency vs throughput: {label}"
    orig = original.label or original.served_model.label or "the original"
    return f"latency vs throughput\ncandidate: {label}\noriginal: {orig}"


def mpl_text(text: str) -> str:
    """Text shown as it is by matplotlib: a '$' would start mathtext (and a lone one fails the plot)."""
    return text.replace("$", r"\$")


def lengths_path(plot_path: str | Path) -> Path:
    """Where the length histogram goes beside a latency-throughput plot: ``<stem>.lengths.svg``."""
    p = Path(plot_path)
    return p.with_name(p.stem + ".lengths.svg")


def length_histogram(levels: Iterable[LevelResult]) -> dict[str, tuple[list[int], list[int]]]:
    """The input and output token-length histograms of ``levels`` (LevelResult records) added up: {"input":
    (edges, counts), "output": ...}; the powers-of-two edges of every level line up, so counts add by index."""
    out: dict[str, tuple[list[int], list[int]]] = {}
    for side in ("input", "output"):
        edges: list[int] = []
        counts: list[int] = []
        for lv in levels:
            d = lv.summary.lengths
            h = getattr(d, side) if d is not None else None
            if h is None or not h.counts:
                continue
            if len(h.edges) > len(edges):
                edges = list(h.edges)
            counts += [0] * max(0, len(h.counts) - len(counts))
            for i, c in enumerate(h.counts):
                counts[i] += c
        out[side] = (edges, counts)
    return out


def plot_lengths(report: BenchReport | JsonObject, path: str | Path) -> Path | None:
    """The input / output token lengths the bench actually sent (the server's usage, every level together) as
    two bar charts over powers-of-two bins, an SVG; None when no level recorded lengths (an older report)."""
    report = BenchReport.from_dict(report)
    hist = length_histogram(report.levels)
    if not any(counts for _, counts in hist.values()):
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 3.4))
    for ax, side in zip(axes, ("input", "output")):
        edges, counts = hist[side]
        labels = [f"{edges[i]}-{edges[i + 1] - 1}" if edges[i + 1] - 1 > edges[i] else str(edges[i])
                  for i in range(len(counts))]
        ax.bar(range(len(counts)), counts, color="#4878a8")
        ax.set_xticks(range(len(counts)), labels, rotation=45, ha="right", fontsize=7)
        ax.set_xlabel(f"{side} tokens (server's usage)")
        ax.set_ylabel("requests")
        ax.grid(True, axis="y", alpha=0.3)
    label = report.label or report.model or ""
    fig.suptitle(mpl_text(f"token lengths sent: {label}"), fontsize=10)
    fig.tight_layout()
    from infertool.atomic import atomic_path

    out = Path(path)
    try:
        with atomic_path(out, suffix=".svg") as tmp:
            fig.savefig(tmp, format="svg")
    finally:
        plt.close(fig)
    return out
