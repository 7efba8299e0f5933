"""Calibration data: the calibration part of the built-in corpus (``infertool.data.corpus``: disjoint from
the part the ``builtin-corpus`` eval suite scores), a ``.txt`` file or a ``.jsonl`` file with a text field,
cut into deterministic token windows.

The light half (``check_source``, ``read_texts``, ``select_windows``, ``windows_hash``) is pure Python and
runs anywhere; ``build_windows`` tokenizes with the model's tokenizer and runs inside the quantize stage
(the ``quant`` environment). Same recipe -> same text -> same token windows -> same hash.
"""

from __future__ import annotations

import hashlib
import random
import struct
import sys
from dataclasses import dataclass
from pathlib import Path

from infertool.errors import UsageError
from infertool.records import Record

BUILTIN = "builtin"
_HINT = "quantize.calibration.source is 'builtin', a .txt file, or a .jsonl file with one JSON object per line"


@dataclass
class CalibrationRequest(Record):
    """The recipe's calibration section as the quantize worker and the preflight read it (the JSON of
    ``backends.methods.CalibrationSpec``, its source made absolute)."""

    source: str = BUILTIN
    text_field: str = "text"
    samples: int | None = None
    seq_len: int | None = None
    seed: int | None = None
    allow_eval_overlap: bool = False
    base_dir: str | None = None  # where a relative source is looked up


@dataclass
class CalibrationInfo(Record):
    """What the calibration text was and which windows were cut from it (the manifest's ``calibration``)."""

    source: str
    kind: str  # builtin | txt | jsonl
    documents: int
    characters: int
    text_sha256: str
    python_version: str | None = None  # builtin only: the corpus changes between Python releases
    corpus_part: dict | None = None  # builtin only: which part of the corpus (its topics, size, hash)
    tokens_total: int | None = None
    samples: int | None = None
    seq_len: int | None = None
    seed: int | None = None
    overlapping: bool | None = None
    windows_sha256: str | None = None


def _resolve(source: str, base_dir: Path | None) -> Path:
    p = Path(source).expanduser()
    if not p.is_absolute() and base_dir is not None and not p.exists() and (base_dir / p).exists():
        p = base_dir / p
    return p


def read_texts(source: str, text_field: str = "text", base_dir: Path | None = None) -> tuple[list[str], str, Path | None]:
    """The calibration documents, their kind, and the resolved file (None for builtin). Raises UsageError
    naming the file and line for anything unreadable."""
    if source == BUILTIN:
        from infertool.data import corpus

        return list(corpus.part("calibration").docs), "builtin", None
    from infertool import inputs

    path = _resolve(source, base_dir)
    text = inputs.read_text(path, inputs.CALIBRATION, "quantize.calibration.source")
    if path.suffix.lower() == ".txt":
        return [text], "txt", path
    docs: list[str] = []
    bad: dict[int, str] = {}
    rows = inputs.parse_jsonl(text, path, "quantize.calibration.source", max_rows=None, bad=bad)
    stop = min(bad, default=None)  # the first line that is not JSON is refused, once the lines above it passed
    for n, obj in rows:
        if stop is not None and n > stop:
            break
        value = obj.get(text_field) if isinstance(obj, dict) else None
        if not isinstance(value, str):
            raise UsageError(
                f"{path}, line {n}: expected an object with a string field {text_field!r}",
                hint="set quantize.calibration.text_field to the field that holds the text",
            )
        if value.strip():
            docs.append(value)
    if stop is not None:
        raise UsageError(f"{path}, {bad[stop]}", hint=_HINT)
    if not docs:
        raise UsageError(f"calibration file {path} has no text in field {text_field!r}", hint=_HINT)
    return docs, "jsonl", path


def text_sha256(docs: list[str]) -> str:
    from infertool.data.corpus import docs_sha256

    return docs_sha256(docs)


def _builtin_part() -> dict:
    from infertool.data import corpus

    return {"corpus": f"builtin:{corpus.NAME}", "part": "calibration", "split": corpus.SPLIT_RULE,
            **corpus.part("calibration").facts()}


def check_source(spec: CalibrationRequest, base_dir: Path | None = None) -> CalibrationInfo:
    """Validate the calibration source before any model is loaded (light: reads the text only)."""
    docs, kind, path = read_texts(spec.source, spec.text_field, base_dir)
    return CalibrationInfo(
        source=str(path) if path else BUILTIN,
        kind=kind,
        documents=len(docs),
        characters=sum(len(d) for d in docs),
        text_sha256=text_sha256(docs),
        python_version=sys.version.split()[0] if kind == "builtin" else None,
        corpus_part=_builtin_part() if kind == "builtin" else None,
        samples=spec.samples,
        seq_len=spec.seq_len,
        seed=spec.seed,
    )


def select_windows(ids: list[int], samples: int, seq_len: int, seed: int) -> tuple[list[list[int]], bool]:
    """``samples`` windows of ``seq_len`` tokens from ``ids``, chosen by ``seed``.

    Non-overlapping windows (a seeded sample of the corpus cut into seq_len pieces) when the text is long
    enough; otherwise seeded random start positions, which may overlap (the second value says so).
    """
    n = len(ids)
    if n < seq_len:
        raise UsageError(
            f"the calibration text has {n} tokens, fewer than seq_len {seq_len}",
            hint="give a longer text, or lower quantize.calibration.seq_len",
        )
    rng = random.Random(seed)
    pieces = n // seq_len
    if pieces >= samples:
        chosen = sorted(rng.sample(range(pieces), samples))
        return [ids[i * seq_len:(i + 1) * seq_len] for i in chosen], False
    starts = [rng.randrange(0, n - seq_len + 1) for _ in range(samples)]
    return [ids[s:s + seq_len] for s in starts], True


def windows_sha256(windows: list[list[int]]) -> str:
    h = hashlib.sha256()
    for w in windows:
        h.update(struct.pack("<I", len(w)))
        h.update(struct.pack(f"<{len(w)}I", *w))
    return h.hexdigest()


def build_windows(spec: CalibrationRequest, tokenizer, events=None) -> tuple[list[dict], CalibrationInfo]:
    """Inside the stage: tokenize the calibration text, choose the windows, hash them.

    Returns GPTQModel-style samples (``{"input_ids": [...], "attention_mask": [...]}``) and the info
    recorded in the manifest.
    """
    base = Path(spec.base_dir) if spec.base_dir else None
    info = check_source(spec, base)
    docs, _, _ = read_texts(spec.source, spec.text_field, base)
    sep = "\n\n"
    ids = tokenizer(sep.join(docs), add_special_tokens=False)["input_ids"]
    samples, seq_len, seed = spec.samples or 0, spec.seq_len or 0, spec.seed or 0
    windows, overlapping = select_windows(ids, samples, seq_len, seed)
    if overlapping and events is not None:
        events.log(
            f"calibration text has {len(ids)} tokens, fewer than {samples} x {seq_len}: windows may overlap",
            "warning",
        )
    info.tokens_total = len(ids)
    info.overlapping = overlapping
    info.windows_sha256 = windows_sha256(windows)
    return [{"input_ids": w, "attention_mask": [1] * len(w)} for w in windows], info
