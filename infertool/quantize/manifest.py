"""``infertool-manifest.json``: what was made, from what, how, and how long it took; written beside the
weights (and read back by resolve and publish to find the source model and the load-time settings)."""

from __future__ import annotations

import platform
import sys
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from infertool.atomic import write_json
from infertool.resolve import QUANTIZE_MANIFEST as MANIFEST_NAME
from infertool.records import Record, as_float

MANIFEST_VERSION = 1


def env_packages(name: str) -> dict:
    """The environment's recorded package versions (from its setup marker); {} when unknown."""
    from infertool.envs.state import EnvMarker, read_marker

    marker = read_marker(name) or EnvMarker()
    return {"name": name, "packages": marker.packages, "python": marker.python_version, "variant": marker.variant}


@dataclass
class WeightSize(Record):
    """The weights' bytes before and after quantizing (quantize.json's ``size``; None: not measured)."""

    weight_bytes_before: int | None = None
    weight_bytes_after: int | None = None
    ratio: float | None = None
    reduction_pct: float | None = None

    @classmethod
    def of(cls, before: int, after: int | None) -> WeightSize:
        share = after / before if after is not None and before else None
        return cls(before, after, share, 100.0 * (1 - share) if share is not None else None)


@dataclass
class LayerErrors(Record):
    """The backend's per-module quantization error, summarised (quantize.json's ``layer_errors``)."""

    modules: int = 0
    mean_loss: float | None = None
    max_loss: float | None = None
    max_module: str | None = None

    @classmethod
    def of(cls, layers: list[dict]) -> LayerErrors:
        """From the backend's per-module log (each row's ``loss``, ``layer`` and ``module``)."""
        losses = [(loss, row) for row in layers if (loss := as_float(row.get("loss"))) is not None]
        if not losses:
            return cls(len(layers))
        worst, row = max(losses, key=lambda x: x[0])
        return cls(len(layers), sum(x for x, _ in losses) / len(losses), worst,
                   f"layer {row.get('layer')} {row.get('module')}")


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
