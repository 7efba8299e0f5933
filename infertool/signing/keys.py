"""Keys: an EC key pair made (``new_key_pair``), a private key read for signing and a public key read for
checking, each refused with a clear UsageError (exit 2) when it cannot be one, and a key's ``key_fingerprint``."""

from __future__ import annotations

import hashlib
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from infertool.errors import UsageError
from infertool.records import Record

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ec import EllipticCurvePrivateKey, EllipticCurvePublicKey

PRIVATE, PUBLIC = "private.pem", "public.pem"
CURVES = ("secp256r1", "secp384r1", "secp521r1")  # what model-signing 1.x signs with (P-256 / P-384 / P-521)
OPENSSL = ("openssl ecparam -name prime256v1 -genkey -noout -out private.pem && "
           "openssl ec -in private.pem -pubout -out public.pem")
_KEY_HINT = f"an EC private key in PEM (P-256, P-384 or P-521): `infertool keys new DIR`, or {OPENSSL}"


@dataclass
class KeyPair(Record):
    """What `infertool keys new DIR` wrote: the two files and the public key's fingerprint."""

    private_key: str = ""
    public_key: str = ""
    fingerprint: str = ""


def _read(path: str | Path, what: str) -> bytes:
    p = Path(path).expanduser()
    try:
        return p.read_bytes()
    except FileNotFoundError:
        raise UsageError(f"{what} {p}: no such file", hint=_KEY_HINT if what == "private key" else
                         "the public.pem of the key pair the folder was signed with") from None
    except IsADirectoryError:
        raise UsageError(f"{what} {p}: a folder, not a key file", hint=f"name the .pem file, e.g. {p / PUBLIC}") from None
    except OSError as e:
        raise UsageError(f"{what} {p}: cannot read it: {e.strerror or e}") from None


def _curve_refusal(curve: str) -> str | None:
    return None if curve in CURVES else f"an EC key on curve {curve}: model-signing takes P-256, P-384 or P-521 only"


def private_key(path: str | Path) -> EllipticCurvePrivateKey:
    """The EC private key in the PEM file ``path`` (refused: missing, encrypted, not a private key, RSA, another
    curve)."""
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.hazmat.primitives.serialization import load_pem_private_key

    data = _read(path, "private key")
    try:
        key = load_pem_private_key(data, password=None)
    except TypeError:  # encrypted
        raise UsageError(f"private key {path}: it is encrypted, and infertool signs with an unencrypted key only",
                         hint="keep an unencrypted copy where only you can read it (mode 0600): "
                              "openssl ec -in KEY.pem -out plain.pem") from None
    except (ValueError, TypeError, UnicodeDecodeError):
        public = b"PUBLIC KEY" in data
        raise UsageError(f"private key {path}: " + ("a public key: signing needs the private one" if public else
                         "not a PEM private key"), hint=_KEY_HINT) from None
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        kind = type(key).__name__.removeprefix("_").replace("PrivateKey", "") or "non-EC"
        raise UsageError(f"private key {path}: an {kind} key; model-signing signs with EC keys only "
                         "(P-256, P-384, P-521)", hint=_KEY_HINT)
    why = _curve_refusal(key.curve.name)
    if why:
        raise UsageError(f"private key {path}: {why}", hint=_KEY_HINT)
    return key


def public_key(path: str | Path) -> EllipticCurvePublicKey:
    """The EC public key in the PEM file ``path`` (refused: missing, a private key, not EC, another curve)."""
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.hazmat.primitives.serialization import load_pem_public_key

    data = _read(path, "public key")
    hint = "the public.pem of the key pair the folder was signed with (`infertool keys new` writes one)"
    if b"PRIVATE KEY" in data:
        raise UsageError(f"public key {path}: a private key; checking takes the public one", hint=hint)
    try:
        key = load_pem_public_key(data)
    except (ValueError, TypeError, UnicodeDecodeError):
        raise UsageError(f"public key {path}: not a PEM public key", hint=hint) from None
    if not isinstance(key, ec.EllipticCurvePublicKey):
        raise UsageError(f"public key {path}: not an EC key; model-signing checks EC keys only (P-256, P-384, "
                         "P-521)", hint=hint)
    why = _curve_refusal(key.curve.name)
    if why:
        raise UsageError(f"public key {path}: {why}", hint=hint)
    return key


def key_fingerprint(key: EllipticCurvePublicKey | EllipticCurvePrivateKey) -> str:
    """sha256 of the public key's PEM (SubjectPublicKeyInfo), 64 hex digits: the ``hint`` model-signing writes
    into a bundle's verification material."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    pub = key.public_key() if isinstance(key, ec.EllipticCurvePrivateKey) else key
    pem = pub.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    return hashlib.sha256(pem).hexdigest()


def _write_new(target: Path, data: bytes, mode: int, replace: bool) -> None:
    """``data`` written whole to ``target`` (temp + rename: ``atomic.move_into_place``), with ``mode`` from the
    start (a private key is never readable by others, not for a moment); ``replace`` False: never over a file."""
    from infertool.atomic import move_into_place, remove_inside

    fd, name = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        move_into_place(name, target, replace=replace)
    finally:
        remove_inside(name, target.parent, ignore_errors=True)


def new_key_pair(folder: str | Path, force: bool = False) -> KeyPair:
    """An EC P-256 key pair in ``folder``: private.pem (mode 0600, unencrypted) and public.pem; an existing one
    is refused unless ``force``."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    d = Path(folder).expanduser()
    if d.exists() and not d.is_dir():
        raise UsageError(f"{d} is a file, not a folder", hint="name a folder for private.pem and public.pem")
    there = [p for p in (d / PRIVATE, d / PUBLIC) if p.exists() or p.is_symlink()]
    if there and not force:
        raise UsageError(f"{there[0]} is already there: a key pair is not replaced",
                         hint="name another folder, or --force to replace it (what it signed then checks with the "
                              "old public key only)")
    try:
        d.mkdir(parents=True, exist_ok=True)
        key = ec.generate_private_key(ec.SECP256R1())
        _write_new(d / PRIVATE, key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                  serialization.NoEncryption()), 0o600, force)
        _write_new(d / PUBLIC, key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo), 0o644, force)
    except FileExistsError as e:  # appeared meanwhile
        raise UsageError(f"{e.filename or d} is already there: a key pair is not replaced",
                         hint="name another folder, or --force to replace it") from None
    except OSError as e:
        raise UsageError(f"cannot write a key pair in {d}: {e.strerror or e}", hint="a folder you may write") from None
    return KeyPair(str(d / PRIVATE), str(d / PUBLIC), key_fingerprint(key))
