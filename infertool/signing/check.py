"""A folder signed (``sign_folder``: model-signing's key signer, every file but ``model.sig``) and checked
(``check_folder``: which key signed it, and with a trusted one whether every file is as signed, naming each file
added, removed or changed)."""

from __future__ import annotations

import base64
import binascii
import json
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Iterable

from infertool.errors import RuntimeFailure, SignatureError, UsageError
from infertool.records import Record
from infertool.signing.keys import key_fingerprint, private_key, public_key
from infertool.summaries import Signature

if TYPE_CHECKING:
    from model_signing.hashing import Config as HashingConfig

SIGNATURE_FILE = "model.sig"
STATUSES = ("unsigned", "signed-unchecked", "valid", "invalid", "other-key")
MAX_NAMED = 20  # files named in a message
MAX_BUNDLE = 64 * 1024 * 1024  # a model.sig larger than this is not read (a manifest line per file: far below)


def short(fp: str | None) -> str:
    return (fp or "?")[:16]


@dataclass
class SignatureCheck(Record):
    """What ``check_folder`` found: ``status`` (``STATUSES``), the signing key's fingerprint as the signature
    names it, the files that differ from the signed manifest ("added: x", "removed: y", "changed: z") and one
    line for people."""

    status: str = "unsigned"
    key_fingerprint: str | None = None
    differs: list[str] = field(default_factory=list)
    message: str = ""
    keys: int = 0  # trusted public keys it was checked against

    @property
    def valid(self) -> bool:
        return self.status == "valid"


# model.sig as read back (a Sigstore bundle, model-signing's shape): only what a check needs
@dataclass
class _PublicKeyId(Record):
    hint: str = ""


@dataclass
class _Material(Record):
    publicKey: _PublicKeyId = field(default_factory=_PublicKeyId)  # noqa: N815 - the bundle's own key


@dataclass
class _Envelope(Record):
    payload: str = ""


@dataclass
class _Bundle(Record):
    verificationMaterial: _Material = field(default_factory=_Material)  # noqa: N815 - the bundle's own key
    dsseEnvelope: _Envelope = field(default_factory=_Envelope)  # noqa: N815 - the bundle's own key


@dataclass
class _Resource(Record):
    name: str = ""
    digest: str = ""


@dataclass
class _Serialization(Record):
    method: str = ""
    hash_type: str = ""
    ignore_paths: list[str] = field(default_factory=list)


@dataclass
class _Predicate(Record):
    serialization: _Serialization = field(default_factory=_Serialization)
    resources: list[_Resource] = field(default_factory=list)


@dataclass
class _Statement(Record):
    predicate: _Predicate = field(default_factory=_Predicate)


def _hashing() -> HashingConfig:
    """How infertool signs and checks: sha256 of every file (git's files and hidden ones too), model.sig aside."""
    from model_signing import hashing

    return (hashing.Config().use_file_serialization(hashing_algorithm="sha256", allow_symlinks=False)
            .set_ignored_paths(paths=[SIGNATURE_FILE], ignore_git_paths=False))


def sign_folder(folder: str | Path, key: str | Path) -> Signature:
    """Sign every file of ``folder`` (but model.sig) with the EC private key file ``key``: ``folder/model.sig``
    written whole (beside the folder first, then renamed in). The key goes nowhere else."""
    from model_signing import signing

    from infertool.atomic import fault, move_into_place, remove_inside

    root = Path(folder)
    fp = key_fingerprint(private_key(key))  # refused here, clearly, before model-signing reads it
    _sweep_signatures(root.parent)
    fd, name = tempfile.mkstemp(prefix=f".{root.name}.", suffix=".sig", dir=root.parent)
    os.close(fd)
    try:
        try:
            signing.Config().use_elliptic_key_signer(private_key=Path(key).expanduser()).set_hashing_config(
                _hashing()).sign(root, Path(name))
        except OSError:
            raise
        except Exception as e:  # noqa: BLE001 - model-signing's own errors (a link in the folder, ...): said
            raise RuntimeFailure(f"cannot sign {root}: {type(e).__name__}: {str(e)[:300]}",
                                 hint="a published folder holds regular files only") from None
        os.chmod(name, 0o644)  # published like the files it signs (mkstemp made it 0600): anyone may check it
        fault("sign", name)  # a test's fault: the signature whole beside the folder, not yet moved into it
        move_into_place(name, root / SIGNATURE_FILE)
    finally:
        remove_inside(name, root.parent, ignore_errors=True)
    return Signature(SIGNATURE_FILE, fp)


def _sweep_signatures(parent: Path) -> None:
    """Remove the temporary signatures a killed publish left beside the temporary folder it was signing
    (``..<DEST>.<8>.tmp.<8>.sig``): those whose folder is gone (``atomic.sweep`` removed it: no live process held
    it). One a live publish is writing has its folder still there, and is kept."""
    import re

    from infertool.atomic import remove_inside

    left = re.compile(r"(\.[^/]+\.tmp)\.[a-z0-9_]{8}\.sig")
    try:
        names = os.listdir(parent)
    except OSError:
        return
    for name in names:
        m = left.fullmatch(name)
        if m and not os.path.lexists(parent / m.group(1)):
            remove_inside(parent / name, parent, ignore_errors=True)


def signature_of(key: str | Path) -> Signature:
    """The signature a folder signed with the private key file ``key`` will carry (the key checked here)."""
    return Signature(SIGNATURE_FILE, key_fingerprint(private_key(key)))


def remove_signature(folder: str | Path) -> None:
    """A stale model.sig gone (the folder is about to change)."""
    from infertool.atomic import remove_inside

    remove_inside(Path(folder) / SIGNATURE_FILE, folder)


def _statement(bundle: _Bundle) -> _Statement | None:
    try:
        return _Statement.from_dict(json.loads(base64.b64decode(bundle.dsseEnvelope.payload, validate=True)))
    except (binascii.Error, ValueError):
        return None


def _differs(root: Path, statement: _Statement) -> list[str]:
    """Each file that is not as the signed manifest has it: added, removed, changed (sorted by name)."""
    signed = {r.name: r.digest for r in statement.predicate.resources}
    try:
        now = {rd.identifier: rd.digest.digest_hex for rd in _hashing().hash(root).resource_descriptors()}
    except (ValueError, OSError) as e:  # a link, an unreadable file
        return [f"unreadable: {str(e)[:200]}"]
    out = [f"added: {n}" for n in now if n not in signed]
    out += [f"removed: {n}" for n in signed if n not in now]
    out += [f"changed: {n}" for n in now if n in signed and signed[n] != now[n]]
    return sorted(out, key=lambda s: s.split(": ", 1)[1])


def check_folder(folder: str | Path, keys: Iterable[str | Path] = ()) -> SignatureCheck:
    """Who signed ``folder`` (its model.sig's key fingerprint) and, with trusted public ``keys``, whether every
    file is as signed: valid, invalid (naming each file that differs), other-key; unsigned without model.sig;
    signed-unchecked without keys. Bad key files: a UsageError (exit 2)."""
    root = Path(folder)
    trusted = {key_fingerprint(public_key(k)): Path(k).expanduser() for k in keys}
    sig = root / SIGNATURE_FILE
    n = len(trusted)
    if sig.is_symlink() or not sig.is_file():
        what = "a link" if sig.is_symlink() else "not a file" if sig.exists() else "no model.sig"
        return SignatureCheck("unsigned", None, [], f"unsigned ({what})", n)
    try:
        big = sig.stat().st_size > MAX_BUNDLE
        bundle = _Bundle() if big else _Bundle.from_dict(json.loads(sig.read_bytes()))
    except (ValueError, OSError):
        bundle = _Bundle()
    fp = bundle.verificationMaterial.publicKey.hint or None
    statement = _statement(bundle)
    if fp is None or statement is None:
        return SignatureCheck("invalid", fp, [SIGNATURE_FILE], f"{SIGNATURE_FILE} is not a model-signing bundle", n)
    if not trusted:
        return SignatureCheck("signed-unchecked", fp, [], f"signed by {short(fp)}, not checked (no --key)", 0)
    if fp not in trusted:
        return SignatureCheck("other-key", fp, [], f"signed by {short(fp)}, not by a trusted key "
                              f"({', '.join(short(k) for k in trusted)})", n)
    ignored = [p for p in statement.predicate.serialization.ignore_paths if p != SIGNATURE_FILE]
    if ignored or statement.predicate.serialization.method != "files":
        return SignatureCheck("invalid", fp, [f"not signed: {p}" for p in ignored],
                              "signed with files left out of the signature" if ignored else
                              f"signed as {statement.predicate.serialization.method or '?'}, not file by file", n)
    from model_signing import verifying

    try:
        verifying.Config().use_elliptic_key_verifier(public_key=trusted[fp]).set_hashing_config(
            _hashing()).verify(root, sig)
    except Exception:  # noqa: BLE001 - model-signing says why in words; the files are named from the manifest
        differs = _differs(root, statement)
        if not differs:
            return SignatureCheck("invalid", fp, [SIGNATURE_FILE],
                                  f"{SIGNATURE_FILE}: its signature does not match its manifest (the bundle was "
                                  "altered)", n)
        more = f" and {len(differs) - MAX_NAMED} more" if len(differs) > MAX_NAMED else ""
        return SignatureCheck("invalid", fp, differs, "not as signed: " + "; ".join(differs[:MAX_NAMED]) + more, n)
    return SignatureCheck("valid", fp, [], f"signature valid, by {short(fp)}", n)


def trusted_keys(flags: Iterable[str | Path] | None, recipe_keys: Iterable[str] | None = None) -> list[Path]:
    """The public keys to check with: --key flags, then the recipe's ``verify.signing.trusted_keys``."""
    out: list[Path] = []
    for k in [*(flags or []), *(recipe_keys or [])]:
        p = Path(k).expanduser()
        if p not in out:
            out.append(p)
    return out


def require_valid(check: SignatureCheck, folder: str | Path) -> None:
    """A SignatureError (exit 6) unless ``check`` is valid: unsigned, invalid (naming the files) or another key."""
    if check.valid:
        return
    hint = {"unsigned": "publish it with --sign-key PRIVATE.pem, or check it without --key",
            "other-key": "give the public key of whoever signed it with --key, if you trust it",
            "signed-unchecked": "give a trusted public key with --key (or verify.signing.trusted_keys)"}.get(
        check.status, "the folder changed since it was signed: publish it again from its run")
    raise SignatureError(f"{folder}: signature refused: {check.message}", hint=hint)


def require_keys(keys: list[Path], why: str) -> None:
    """A signature required with no key to check it by: a UsageError."""
    if not keys:
        raise UsageError(f"{why} requires a valid signature, and no trusted public key is named",
                         hint="--key PUBLIC.pem, or verify.signing.trusted_keys in the recipe")
