"""``infertool-manifest.json``: what was made, from what, how, and how long it took; written beside the
weights (and read back by eval / serve to find the source model and the load-time settings)."""

from __future__ import annotations

import json
import platform
import sys
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from infertool.atomic import write_json
from infertool.quantize import MANIFEST_NAME
from infertool.records import Record

MANIFEST_VERSION = 1


def env_packages(name: str) -> dict:
    """The environment's recorded package versions (from its setup marker); {} when unknown."""
    from infertool.envs.state import EnvMarker, read_marker

    marker = read_marker(name) or EnvMarker()
    return {"name": name, "packages": marker.packages, "python": marker.python_version, "variant": marker.variant}


@dataclass
class WeightSize(Record):
    """``size_summary``'s answer read back by attribute (None: not measured)."""

    weight_bytes_before: int | None = None
    weight_bytes_after: int | None = None
    ratio: float | None = None
    reduction_pct: float | None = None


def size_summary(before: int, after: int | None) -> dict:
    return {
        "weight_bytes_before": before,
        "weight_bytes_after": after,
        "ratio": (after / before) if (after is not None and before) else None,
        "reduction_pct": (100.0 * (1 - after / before)) if (after is not None and before) else None,
    }


def layer_error_summary(layers: list[dict]) -> dict:
    losses = [l["loss"] for l in layers if isinstance(l.get("loss"), (int, float))]
    if not losses:
        return {"modules": len(layers), "mean_loss": None, "max_loss": None, "max_module": None}
    worst = max((l for l in layers if isinstance(l.get("loss"), (int, float))), key=lambda l: l["loss"])
    return {
        "modules": len(layers),
        "mean_loss": sum(losses) / len(losses),
        "max_loss": worst["loss"],
        "max_module": f"layer {worst.get('layer')} {worst.get('module')}",
    }


def build_manifest(**fields) -> dict:
    from infertool import __version__

    return {
        "infertool_manifest": MANIFEST_VERSION,
        "kind": "quantized-model",
        "created": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "infertool_version": __version__,
        "host": {"python": sys.version.split()[0], "platform": platform.platform(), "machine": platform.machine()},
        **fields,
    }


def write_manifest(directory: Path, manifest: dict) -> Path:
    return write_json(Path(directory) / MANIFEST_NAME, manifest)


def read_manifest(directory: str | Path) -> dict | None:
    """The manifest of a quantized (or load-time quantized) model directory, or None."""
    try:
        return json.loads((Path(directory) / MANIFEST_NAME).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
