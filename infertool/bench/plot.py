"""Latency against throughput across the sweep, as a PNG (matplotlib, imported only here)."""

from __future__ import annotations

from pathlib import Path


def plot_latency_throughput(report: dict, path: str | Path) -> Path:
    """One point per load level: output tokens/s on x; TTFT p50 and TPOT p50 (ms) on y; one line per
    traffic pattern of the sweep, per experiment arm that is not the sweep itself and, when `run` measured
    the original beside the candidate (``report["original"]``), per traffic pattern of the original. Models
    are named as a person names them (``label``: source and quantization), never by a cache path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    original = report.get("original")
    series: dict[str, list[dict]] = {}
    for lv in report.get("levels", []):
        series.setdefault(f"candidate: {lv['level']['kind']}" if original else lv["level"]["kind"], []).append(lv)
    for lv in (original or {}).get("levels", []):
        series.setdefault(f"original: {lv['level']['kind']}", []).append(lv)
    main = [lv["summary"]["output_token_throughput"] for lv in report.get("levels", [])
            if lv["level"]["kind"] == "concurrency"]
    for exp in report.get("experiments", []):
        for arm in ("a", "b"):  # the arm that IS the main sweep is drawn once, as the sweep
            rows = exp.get("rows", [])
            if [row["figures"]["output_token_throughput"][arm] for row in rows] == main:
                continue
            series[f"{exp['experiment']}: {exp[arm]}"] = [{
                "level": {"label": row["b_level"] if arm == "b" else row["level"]},
                "summary": {"output_token_throughput": row["figures"]["output_token_throughput"][arm],
                            "ttft_ms": {"p50": row["figures"]["ttft_p50_ms"][arm]},
                            "tpot_ms": {"p50": row["figures"]["tpot_p50_ms"][arm]}},
            } for row in rows]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for ax, key, title in ((axes[0], "ttft_ms", "TTFT p50 (ms)"), (axes[1], "tpot_ms", "TPOT p50 (ms)")):
        for name, levels in series.items():
            pts = [(lv["summary"]["output_token_throughput"], (lv["summary"].get(key) or {}).get("p50"),
                    lv["level"]["label"]) for lv in levels]
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


def plot_title(report: dict) -> str:
    """'latency vs throughput: <label>', with the original on a second line when it was measured too."""
    label = report.get("label") or (report.get("served") or {}).get("label") or report.get("model") or ""
    original = report.get("original")
    if not original:
        return f"latency vs throughput: {label}"
    orig = original.get("label") or (original.get("served") or {}).get("label") or "the original"
    return f"latency vs throughput\ncandidate: {label}\noriginal: {orig}"


def mpl_text(text: str) -> str:
    """Text shown as it is by matplotlib: a '$' would start mathtext (and a lone one fails the plot)."""
    return text.replace("$", r"\$")
