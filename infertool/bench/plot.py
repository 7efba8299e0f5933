"""Latency against throughput across the sweep, as a PNG (matplotlib, imported only here)."""

from __future__ import annotations

from pathlib import Path


def plot_latency_throughput(report: dict, path: str | Path) -> Path:
    """One point per load level: output tokens/s on x; TTFT p50 and TPOT p50 (ms) on y; one line per arm."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series: dict[str, list[dict]] = {}
    for lv in report.get("levels", []):
        series.setdefault(lv["level"]["kind"], []).append(lv)
    for exp in report.get("experiments", []):
        for row in exp.get("rows", []):
            f = row["figures"]
            series.setdefault(f"{exp['experiment']}: {exp['b']}", []).append({
                "level": {"label": row["b_level"]},
                "summary": {"output_token_throughput": f["output_token_throughput"]["b"],
                            "ttft_ms": {"p50": f["ttft_p50_ms"]["b"]}, "tpot_ms": {"p50": f["tpot_p50_ms"]["b"]}},
            })
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for ax, key, title in ((axes[0], "ttft_ms", "TTFT p50 (ms)"), (axes[1], "tpot_ms", "TPOT p50 (ms)")):
        for name, levels in series.items():
            pts = [(lv["summary"]["output_token_throughput"], (lv["summary"].get(key) or {}).get("p50"),
                    lv["level"]["label"]) for lv in levels]
            pts = [p for p in pts if p[0] is not None and p[1] is not None]
            if not pts:
                continue
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=name)
            for x, y, label in pts:
                ax.annotate(label.split()[-1], (x, y), textcoords="offset points", xytext=(4, 4), fontsize=7)
        ax.set_xlabel("output tokens/s")
        ax.set_ylabel(title)
        ax.grid(True, alpha=0.3)
    axes[0].legend(fontsize=7)
    fig.suptitle(f"latency vs throughput: {report.get('model', '')}")
    fig.tight_layout()
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
