"""Signed published folders (issue 43, items 1 and 3): real model-signing, real EC keys made in tmp_path. publish
--sign-key writes model.sig (model-signing's standard file) over every file; verify --key checks it before anything
else and refuses (exit 6) a folder changed since, naming the file; serve --key (or verify.signing in the recipe)
refuses before anything starts; the model_signing CLI verifies our folder too; the private key goes nowhere."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from infertool import signing
from infertool.errors import EXIT_SIGNATURE, EXIT_USAGE, UsageError
from infertool.verify import evidence as E
from tests.test_publish import run_cli, setup  # noqa: F401  (a fixture: a recipe, stand-in stages, a fresh home)
from tests.test_verify import gathered, published, published_folder, servers  # noqa: F401  (fixtures)


@pytest.fixture
def keys(tmp_path):
    """Two key pairs, made by `infertool keys new`: ours and another's."""
    out = {}
    for who in ("ours", "theirs"):
        r = run_cli("keys", "new", str(tmp_path / "keys" / who), "--json")
        assert r.returncode == 0, r.stderr
        out[who] = signing.KeyPair.from_dict(json.loads(r.stdout))
    return out


@pytest.fixture
def shipped(setup, keys):  # noqa: F811
    """A run published (without evidence: the stand-in stages serve nothing) and that folder published again,
    signed with our key."""
    tmp, recipe = setup
    doc = json.loads(run_cli("run", str(recipe), "--out", "runs", "--publish", "first", "--no-evidence",
                             "--json").stdout)
    r = run_cli("publish", doc["published"]["path"], str(tmp / "signed"), "--sign-key", keys["ours"].private_key,
                "--json")
    assert r.returncode == 0, r.stderr
    return tmp / "signed", json.loads(r.stdout)


def _verify(folder: Path, *more: str):
    return run_cli("verify", str(folder), "--dry-run", "--json", *more)


def test_keys_new_writes_a_private_key_only_its_owner_reads_and_refuses_to_overwrite(keys, tmp_path):
    ours = keys["ours"]
    assert Path(ours.private_key).stat().st_mode & 0o777 == 0o600
    assert ours.fingerprint == signing.key_fingerprint(signing.keys.public_key(ours.public_key))
    before = Path(ours.private_key).read_bytes()
    r = run_cli("keys", "new", str(Path(ours.private_key).parent))
    assert r.returncode == EXIT_USAGE and "already there" in r.stderr
    assert Path(ours.private_key).read_bytes() == before
    r = run_cli("keys", "new", str(Path(ours.private_key).parent), "--force")
    assert r.returncode == 0 and Path(ours.private_key).read_bytes() != before
    assert r.stdout.startswith("fingerprint ") and len(r.stdout.split()[1]) == 64


def test_publish_signs_every_file_and_records_only_the_public_fingerprint(shipped, keys):
    folder, doc = shipped
    assert doc["published"]["signature"] == {"file": "model.sig", "key_fingerprint": keys["ours"].fingerprint}
    facts = json.loads((folder / "infertool.json").read_text())
    assert facts["signature"]["key_fingerprint"] == keys["ours"].fingerprint
    check = signing.check_folder(folder, [keys["ours"].public_key])
    assert check.status == "valid", check
    assert (folder / "model.sig").stat().st_mode & 0o777 == 0o644  # readable by whoever checks it, like the rest
    statement = signing.check._statement(signing.check._Bundle.from_dict(json.loads((folder / "model.sig").read_text())))
    signed = {r.name for r in statement.predicate.resources}
    on_disk = {p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()} - {"model.sig"}
    assert signed == on_disk and {"config.json", "model.safetensors", "MODEL_CARD.md", "infertool.json"} <= signed
    private = Path(keys["ours"].private_key).read_bytes()
    body = b"".join(private.splitlines()[1:-1])  # the key's base64, wherever a line break falls
    for f in [*folder.rglob("*"), *Path("runs").rglob("*")]:
        if f.is_file():
            data = f.read_bytes()
            assert private not in data and body[:40] not in data.replace(b"\n", b""), f
    assert body[:40] not in json.dumps(doc).encode()


def test_the_model_signing_cli_verifies_our_folder(shipped, keys):
    folder, _ = shipped
    ok = subprocess.run([sys.executable, "-m", "model_signing", "verify", "key", str(folder), "--signature",
                         str(folder / "model.sig"), "--public_key", keys["ours"].public_key],
                        capture_output=True, text=True, timeout=120)
    assert ok.returncode == 0 and "Verification succeeded" in ok.stdout, ok.stdout + ok.stderr
    (folder / "MODEL_CARD.md").write_text("another card")
    bad = subprocess.run([sys.executable, "-m", "model_signing", "verify", "key", str(folder), "--signature",
                          str(folder / "model.sig"), "--public_key", keys["ours"].public_key],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode != 0 and "MODEL_CARD.md" in bad.stdout + bad.stderr


@pytest.mark.parametrize("change, named", [
    ("flip a weight byte", "changed: model.safetensors"),
    ("edit the card", "changed: MODEL_CARD.md"),
    ("add a file", "added: evidence/extra.json"),
    ("remove an evidence file", f"removed: evidence/{E.DECODE}"),
])
def test_verify_refuses_a_folder_changed_since_it_was_signed_naming_the_file(published, keys, change, named):  # noqa: F811
    (published / "MODEL_CARD.md").write_text("the card")
    signing.sign_folder(published, keys["ours"].private_key)
    ok = _verify(published, "--key", keys["ours"].public_key)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert json.loads(ok.stdout)["signature"]["status"] == "valid"
    if change == "flip a weight byte":
        w = published / "model.safetensors"
        data = bytearray(w.read_bytes())
        data[len(data) // 2] ^= 1
        w.write_bytes(bytes(data))
    elif change == "edit the card":
        (published / "MODEL_CARD.md").write_text("a card written later")
    elif change == "add a file":
        (published / E.DIRNAME / "extra.json").write_text("{}")
    else:
        (published / E.DIRNAME / E.DECODE).unlink()
    r = _verify(published, "--key", keys["ours"].public_key)
    assert r.returncode == EXIT_SIGNATURE, r.stdout + r.stderr
    err = json.loads(r.stdout)
    assert err["error"] == "SignatureError" and named in err["message"], err


def test_another_key_unsigned_and_no_key(published, keys):  # noqa: F811
    r = _verify(published, "--key", keys["ours"].public_key)  # unsigned, a key asked
    assert r.returncode == EXIT_SIGNATURE and "unsigned" in json.loads(r.stdout)["message"]
    plain = _verify(published)  # no key: a note, and verify goes on
    assert plain.returncode == 0 and json.loads(plain.stdout)["signature"]["status"] == "unsigned"
    signing.sign_folder(published, keys["theirs"].private_key)
    other = _verify(published, "--key", keys["ours"].public_key)
    assert other.returncode == EXIT_SIGNATURE
    assert keys["theirs"].fingerprint[:16] in json.loads(other.stdout)["message"]
    either = _verify(published, "--key", keys["ours"].public_key, "--key", keys["theirs"].public_key)
    assert either.returncode == 0, either.stdout
    seen = json.loads(_verify(published).stdout)["signature"]
    assert seen["status"] == "signed-unchecked" and seen["key_fingerprint"] == keys["theirs"].fingerprint
    shown = run_cli("verify", str(published), "--dry-run")
    assert f"signed by {keys['theirs'].fingerprint[:16]}, not checked" in shown.stdout


def test_a_forged_bundle_is_invalid(published, keys):  # noqa: F811
    """A model.sig whose manifest was rewritten to match changed files (without the key) does not verify."""
    import base64

    signing.sign_folder(published, keys["ours"].private_key)
    (published / "config.json").write_text("{}")
    bundle = json.loads((published / "model.sig").read_text())
    stmt = json.loads(base64.b64decode(bundle["dsseEnvelope"]["payload"]))
    fresh = signing.check._hashing().hash(published)
    digests = {rd.identifier: rd.digest.digest_hex for rd in fresh.resource_descriptors()}
    for res in stmt["predicate"]["resources"]:
        res["digest"] = digests[res["name"]]
    bundle["dsseEnvelope"]["payload"] = base64.b64encode(json.dumps(stmt).encode()).decode()
    (published / "model.sig").write_text(json.dumps(bundle))
    r = _verify(published, "--key", keys["ours"].public_key)
    assert r.returncode == EXIT_SIGNATURE and "model.sig" in json.loads(r.stdout)["message"]
    (published / "model.sig").write_text("not a bundle")
    r = _verify(published, "--key", keys["ours"].public_key)
    assert r.returncode == EXIT_SIGNATURE and "not a model-signing bundle" in json.loads(r.stdout)["message"]


def test_bad_keys_are_usage_errors(tmp_path, published, keys):  # noqa: F811
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    rsa_key = tmp_path / "rsa.pem"
    rsa_key.write_bytes(rsa.generate_private_key(public_exponent=65537, key_size=2048).private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    enc = tmp_path / "enc.pem"
    from cryptography.hazmat.primitives.asymmetric import ec
    enc.write_bytes(ec.generate_private_key(ec.SECP256R1()).private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.BestAvailableEncryption(b"pw")))
    for key, words in ((rsa_key, "RSA key; model-signing signs with EC keys only"), (enc, "encrypted"),
                       (tmp_path / "nope.pem", "no such file"), (Path(keys["ours"].public_key), "a public key")):
        with pytest.raises(UsageError, match=words):
            signing.sign_folder(published, key)
    assert not (published / "model.sig").exists()
    r = _verify(published, "--key", keys["ours"].private_key)
    assert r.returncode == EXIT_USAGE and "a private key" in json.loads(r.stdout)["message"]


def test_publish_with_an_rsa_key_or_a_key_inside_the_source_exits_2(shipped, tmp_path, keys):
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    folder, _ = shipped
    rsa_key = tmp_path / "rsa.pem"
    rsa_key.write_bytes(rsa.generate_private_key(public_exponent=65537, key_size=2048).private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    r = run_cli("publish", str(folder), str(tmp_path / "again"), "--sign-key", str(rsa_key))
    assert r.returncode == EXIT_USAGE and "RSA key" in r.stderr and not (tmp_path / "again").exists()
    inside = folder / ".keys" / "key.pem"  # hidden: not in the fingerprint, still refused
    inside.parent.mkdir()
    inside.write_bytes(Path(keys["ours"].private_key).read_bytes())
    r = run_cli("publish", str(folder), str(tmp_path / "again"), "--sign-key", str(inside))
    assert r.returncode == EXIT_USAGE and "never goes into what is published" in r.stderr


def test_republishing_without_a_key_leaves_no_stale_signature(shipped, tmp_path, keys):
    folder, _ = shipped
    dry = run_cli("publish", str(folder), str(tmp_path / "copy"), "--sign-key", keys["ours"].private_key, "--dry-run",
                  "--json")
    plan = json.loads(dry.stdout)
    assert plan["signature"]["key_fingerprint"] == keys["ours"].fingerprint and "sign_key" not in plan
    assert not (tmp_path / "copy").exists()
    r = run_cli("publish", str(folder), str(tmp_path / "copy"), "--json")
    assert r.returncode == 0, r.stderr
    assert not (tmp_path / "copy" / "model.sig").exists() and "signature" not in json.loads(r.stdout)["published"]


def test_serve_with_a_key_refuses_an_unsigned_or_changed_checkpoint(setup, keys, monkeypatch):  # noqa: F811
    monkeypatch.setattr("infertool.serve.start_times.note_launch", lambda *a, **k: None)
    tmp, recipe = setup
    doc = json.loads(run_cli("run", str(recipe), "--out", "runs", "--no-evidence", "--json").stdout)
    run_dir = doc["run_dir"]
    pub = Path(doc["published"]["path"])
    for args in (("--dry-run",), ("--emit", "k8s")):
        r = run_cli("serve", run_dir, *args, "--key", keys["ours"].public_key)
        assert r.returncode == EXIT_SIGNATURE and "unsigned" in r.stderr, r.stderr
        assert "apiVersion" not in r.stdout
    r = run_cli("serve", run_dir, "--dry-run", "--set", "verify.signing.required=true")
    assert r.returncode == EXIT_USAGE and "no trusted public key" in r.stderr
    r = run_cli("serve", run_dir, "--dry-run", "--set", "verify.signing.required=true",
                "--set", f"verify.signing.trusted_keys=[{keys['ours'].public_key}]")
    assert r.returncode == EXIT_SIGNATURE, r.stderr
    signing.sign_folder(pub, keys["ours"].private_key)
    r = run_cli("serve", run_dir, "--emit", "k8s", "--key", keys["ours"].public_key)
    assert r.returncode == 0 and "apiVersion" in r.stdout, r.stderr
    (pub / "MODEL_CARD.md").write_text("changed")
    r = run_cli("serve", run_dir, "--emit", "k8s", "--key", keys["ours"].public_key)
    assert r.returncode == EXIT_SIGNATURE and "changed: MODEL_CARD.md" in r.stderr and "apiVersion" not in r.stdout


def test_run_signs_what_it_publishes_and_refuses_a_bad_key_before_any_work(setup, keys, tmp_path):  # noqa: F811
    tmp, recipe = setup
    bad = tmp_path / "pub-as-private.pem"
    bad.write_bytes(Path(keys["ours"].public_key).read_bytes())
    r = run_cli("run", str(recipe), "--out", "runs", "--publish", "shipped", "--no-evidence", "--sign-key", str(bad))
    assert r.returncode == EXIT_USAGE and "a public key" in r.stderr and not Path("runs").exists()
    doc = json.loads(run_cli("run", str(recipe), "--out", "runs", "--publish", "shipped", "--no-evidence",
                             "--sign-key", keys["ours"].private_key, "--json").stdout)
    assert doc["published"]["signature"]["key_fingerprint"] == keys["ours"].fingerprint
    assert signing.check_folder(tmp / "shipped", [keys["ours"].public_key]).valid
    again = json.loads(run_cli("run", str(recipe), "--out", "runs", "--publish", "shipped", "--no-evidence",
                               "--json").stdout)  # the weights are there already: the card is rewritten, unsigned
    assert "signature" not in again["published"] and not (tmp / "shipped" / "model.sig").exists()
    r = run_cli("verify", str(tmp / "shipped"), "--dry-run", "--key", keys["ours"].public_key)
    assert r.returncode == EXIT_SIGNATURE and "unsigned" in r.stderr
    run_cli("run", str(recipe), "--out", "runs", "--publish", "shipped", "--no-evidence", "--sign-key",
            keys["theirs"].private_key)  # over the same weights again, signed: the new card is signed too
    assert signing.check_folder(tmp / "shipped", [keys["theirs"].public_key]).valid


def test_serve_a_published_folder_with_its_cards_settings_none_that_loads_code(shipped, keys, setup, monkeypatch):  # noqa: F811
    """`infertool serve FOLDER`: a published folder (perhaps someone else's) served with the serve settings its card
    records, none that loads code or picks a secret (shown as "recorded, not taken"); --key refuses (exit 6) one
    not signed by that key, before anything is launched or emitted; the weights are checked against the card."""
    monkeypatch.setattr("infertool.serve.start_times.note_launch", lambda *a, **k: None)
    tmp, _ = setup
    folder, _ = shipped
    r = run_cli("serve", str(folder), "--dry-run", "--json", "--key", keys["ours"].public_key)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["argv"][doc["argv"].index("--model") + 1] == str(folder)
    assert any(n.startswith("signature: signature valid") for n in doc["resolution"]["notes"]), doc["resolution"]
    r = run_cli("serve", str(folder), "--emit", "k8s", "--key", keys["ours"].public_key)
    assert r.returncode == 0 and "apiVersion" in r.stdout, r.stderr
    for args in (("--dry-run",), ("--emit", "k8s")):
        r = run_cli("serve", str(folder), *args, "--key", keys["theirs"].public_key)
        assert r.returncode == EXIT_SIGNATURE and "not by a trusted key" in r.stderr and "apiVersion" not in r.stdout
    # an unsigned copy whose card records settings that load code: shown, never launched with
    plain = tmp / "plain"
    assert run_cli("publish", str(folder), str(plain)).returncode == 0
    facts = json.loads((plain / "infertool.json").read_text())
    facts["serve"] = {**(facts.get("serve") or {}), "allow_code": ["PYTHONPATH", "--middleware"],
                      "env": {"PYTHONPATH": str(plain)}, "extra_args": ["--middleware", "sitecustomize.evil"],
                      "api_key_env": "AWS_SECRET_ACCESS_KEY", "max_num_seqs": 3}
    (plain / "infertool.json").write_text(json.dumps(facts))
    r = run_cli("serve", str(plain), "--dry-run", "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    argv = " ".join(doc["argv"])
    assert "--middleware" not in argv and "PYTHONPATH" not in doc["env"] and doc["api_key_env"] != "AWS_SECRET_ACCESS_KEY"
    assert "--max-num-seqs 3" in argv  # a setting that loads nothing is taken
    notes = " ".join(doc["resolution"]["notes"])
    assert all(f"recorded, not taken: serve.{k}=" in notes for k in ("allow_code", "env", "extra_args", "api_key_env"))
    assert "signature: unsigned" in notes
    (plain / "model.safetensors").write_bytes(b"other weights")  # the weights checked against the card
    r = run_cli("serve", str(plain), "--dry-run")
    assert r.returncode == EXIT_USAGE and "another checkpoint" in r.stderr, r.stderr
