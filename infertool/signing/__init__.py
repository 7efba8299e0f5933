"""Signed published folders (OpenSSF model-signing, key-based and offline): ``model.sig`` beside the model files,
a Sigstore bundle whose signed manifest holds every file's sha256.

    new_key_pair(dir, force) -> KeyPair              an EC P-256 pair: private.pem (0600), public.pem
    sign_folder(folder, private_key) -> Signature    signs every file of the folder but model.sig
    check_folder(folder, public_keys) -> SignatureCheck
                                                     unsigned | signed-unchecked | valid | invalid | other-key
    require_valid(check, what)                       a SignatureError (exit 6) unless the check is valid

A key is named by its fingerprint: the sha256 of its public key's PEM (SubjectPublicKeyInfo), the hint
model-signing writes into the bundle, so a folder says who signed it without any key at hand.
model_signing and cryptography are imported inside the functions that use them.
"""

from infertool.signing.check import (SIGNATURE_FILE, SignatureCheck, check_folder, remove_signature, require_keys,
                                     require_valid, sign_folder, signature_of, trusted_keys)
from infertool.signing.keys import KeyPair, key_fingerprint, new_key_pair
from infertool.summaries import Signature

__all__ = ["SIGNATURE_FILE", "KeyPair", "Signature", "SignatureCheck", "check_folder", "key_fingerprint",
           "new_key_pair", "remove_signature", "require_keys", "require_valid", "sign_folder", "signature_of", "trusted_keys"]
