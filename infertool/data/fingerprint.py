"""Content fingerprints of the inputs: what tells `run` (and `tune`) that an input changed.

- ``model_identity(dir)``: a model directory by content, cheaply, also for a 100 GB checkpoint. Every
  small file (config, tokenizer, chat template, generation config, quantization manifest) is hashed whole;
  each weight file by its size, its header (safetensors: the JSON table of tensors) and 16 blocks of 64 KiB
  read at evenly spaced offsets, plus its modification time. Rewriting a weight file changes its mtime;
  changing its shapes or dtypes changes the header; a copy with other contents differs in the sampled
  blocks. A GGUF file (a model source that is one file) by ``content_sha256``: whole up to 1 GiB, sampled beyond
  (memoised by path, size and mtime).
- ``content_sha256``: a file's identity, read in a bounded time: its SHA-256 up to ``WHOLE_FILE`` bytes (the keys
  of such files are their plain SHA-256, as before), beyond that a sampled fingerprint of its size, its first and
  last MiB and 64 blocks of 64 KiB at evenly spaced offsets (~6 MiB read whatever the size: an 8 GiB GGUF took
  20 s to hash whole before the first message, a 1 TiB one ~40 min). Two big files of the same size that differ
  only between the samples share it: a file rewritten in place keeps its key; a real other model differs in
  every block.
- ``file_sha256`` / ``texts_sha256``: calibration files, suite data, bench prompt files, by content.

The standard library, and inputs.py's sampled reading.
"""

from __future__ import annotations

import hashlib
import json
import struct
from pathlib import Path

SMALL_FILE = 64 * 1024 * 1024  # files up to this size are hashed whole
SAMPLES = 16
SAMPLE_BYTES = 64 * 1024
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf")
IDENTITY_VERSION = 1
WHOLE_FILE = 1024**3  # files up to 1 GiB are hashed whole (about a second)
BIG_SAMPLES = 64


def file_sha256(path: str | Path, chunk: int = 8 * 1024 * 1024) -> str:
    from infertool.inputs import stream_sha256

    with open(path, "rb") as f:
        return stream_sha256(f, chunk)


def content_sha256(path: str | Path, size: int | None = None) -> str:
    """A file's identity in a bounded time (see the module docstring): its SHA-256 up to WHOLE_FILE bytes, a
    sampled fingerprint beyond."""
    size = Path(path).stat().st_size if size is None else size
    if size <= WHOLE_FILE:
        return file_sha256(path)
    from infertool.inputs import sampled_sha256

    with open(path, "rb") as f:
        return sampled_sha256(f, size, tag=b"infertool sampled file v1\0", samples=BIG_SAMPLES)


def texts_sha256(docs) -> str:
    """Content hash of a sequence of texts (length-prefixed, so boundaries count)."""
    h = hashlib.sha256()
    for d in docs:
        b = d.encode("utf-8")
        h.update(struct.pack("<Q", len(b)))
        h.update(b)
    return h.hexdigest()


def digest(obj) -> str:
    """A short stable hash of JSON-able data."""
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _sampled_sha256(path: Path, size: int) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        if size <= SAMPLES * SAMPLE_BYTES:
            h.update(f.read())
        else:
            step = (size - SAMPLE_BYTES) // (SAMPLES - 1)
            for i in range(SAMPLES):
                f.seek(i * step)
                h.update(f.read(SAMPLE_BYTES))
    return h.hexdigest()


def _safetensors_header_sha256(path: Path) -> str | None:
    try:
        with open(path, "rb") as f:
            n = struct.unpack("<Q", f.read(8))[0]
            if n > 100 * 1024 * 1024:
                return None
            return hashlib.sha256(f.read(n)).hexdigest()
    except (OSError, struct.error):
        return None


def weight_file_identity(path: Path) -> dict:
    st = path.stat()
    ident = {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "sampled_sha256": _sampled_sha256(path, st.st_size)}
    if path.suffix == ".safetensors":
        ident["header_sha256"] = _safetensors_header_sha256(path)
    return ident


def model_identity(path: str | Path) -> dict:
    """The identity of a model directory (see the module docstring); ``{"missing": path}`` when absent."""
    p = Path(path).expanduser()
    if p.is_file():
        st = p.stat()
        ident = {"v": IDENTITY_VERSION, "file": p.name, "size": st.st_size, "sha256": content_sha256(p, st.st_size)}
        return ident if st.st_size <= WHOLE_FILE else {**ident, "sampled": True}
    if not p.is_dir():
        return {"missing": str(p)}
    files: dict[str, dict | str] = {}
    for f in sorted(p.rglob("*")):
        if not f.is_file() or any(part.startswith(".") for part in f.relative_to(p).parts):
            continue
        rel = f.relative_to(p).as_posix()
        size = f.stat().st_size
        if f.suffix in WEIGHT_SUFFIXES or size > SMALL_FILE:
            files[rel] = weight_file_identity(f)
        else:
            files[rel] = file_sha256(f)
    return {"v": IDENTITY_VERSION, "files": files, "sha256": digest(files)}


def identity_digest(identity: dict) -> str:
    """One short string for an identity (what stage keys and manifests compare)."""
    return identity.get("sha256") or digest(identity)


def adapter_fingerprints(adapters: dict[str, str]) -> dict[str, dict[str, str | None]]:
    """Each LoRA adapter folder (serve.lora: name -> folder) by content: its absolute path and the SHA-256 of its
    adapter_config.json and adapter_model.safetensors (bounded for huge files), so a changed adapter is never a
    cached answer (the launch key and the recipe's inputs hold these)."""
    from infertool.inputs import fingerprint

    out: dict[str, dict[str, str | None]] = {}
    for name, folder in adapters.items():
        path = Path(folder).expanduser().resolve()
        out[name] = {"path": str(path), **{f: fingerprint(path / f) for f in ("adapter_config.json",
                                                                                 "adapter_model.safetensors")}}
    return out
