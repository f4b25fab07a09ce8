"""Keys, key sets and tokens for tests/jwt.rs, made by PyJWT (an independent JOSE
library) with `cryptography`'s keys.

    jwt_mint.py DIR

writes into DIR:
  jwks_a.json   the RSA, P-256, P-384 and Ed25519 public keys (kids rsa, ec256,
                ec384, ed), as a provider publishes them
  jwks_b.json   a rotated set: one new P-256 key (kid ec-b) beside ec256
  jwks_c.json   only the new key (kid ec-b)
  secret        a 32-byte HMAC secret
and prints a JSON object of named tokens.
"""

import base64
import hashlib
import hmac
import json
import os
import sys
import time

import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa
from jwt.algorithms import ECAlgorithm, OKPAlgorithm, RSAAlgorithm

out = sys.argv[1]
now = int(time.time())

keys = {
    "rsa": rsa.generate_private_key(public_exponent=65537, key_size=2048),
    "ec256": ec.generate_private_key(ec.SECP256R1()),
    "ec384": ec.generate_private_key(ec.SECP384R1()),
    "ed": ed25519.Ed25519PrivateKey.generate(),
    "ec-b": ec.generate_private_key(ec.SECP256R1()),
    # Never published: signs tokens whose signature must fail.
    "rogue": ec.generate_private_key(ec.SECP256R1()),
}


def public_jwk(kid):
    k = keys[kid].public_key()
    if kid == "rsa":
        d = json.loads(RSAAlgorithm.to_jwk(k))
    elif kid == "ed":
        d = json.loads(OKPAlgorithm.to_jwk(k))
    else:
        d = json.loads(ECAlgorithm.to_jwk(k))
    d["kid"] = kid
    d["use"] = "sig"
    return d


def write(name, kids, extra=()):
    with open(os.path.join(out, name), "w") as f:
        json.dump({"keys": [public_jwk(k) for k in kids] + list(extra)}, f)


# A provider's set also holds keys sluice must skip: an encryption key.
enc = public_jwk("rsa")
enc.update({"kid": "enc", "use": "enc", "alg": "RSA-OAEP"})
write("jwks_a.json", ["rsa", "ec256", "ec384", "ed"], [enc])
write("jwks_b.json", ["ec256", "ec-b"])
write("jwks_c.json", ["ec-b"])
secret = os.urandom(32).hex().encode()
with open(os.path.join(out, "secret"), "wb") as f:
    f.write(secret + b"\n")

good = {
    "iss": "https://id.example.test/",
    "aud": "api",
    "sub": "alice",
    "role": "admin",
    "groups": ["ops", "dev"],
    "email": "alice@example.test",
    "exp": now + 3600,
    "nbf": now - 10,
    "iat": now,
}


def sign(claims, alg, kid, key=None, headers=None):
    h = {"kid": kid} if kid else {}
    h.update(headers or {})
    if key is None:
        key = keys[kid]
    return jwt.encode(claims, key, algorithm=alg, headers=h)


def pem(kid):
    return (
        keys[kid]
        .public_key()
        .public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )


def b64(b):
    return base64.urlsafe_b64encode(b).rstrip(b"=").decode()


def forged_hs256_over(kid):
    """The algorithm-confusion attack: HS256 keyed with the public key's PEM."""
    head = b64(json.dumps({"alg": "HS256", "typ": "JWT", "kid": kid}).encode())
    body = b64(json.dumps(good).encode())
    mac = hmac.new(pem(kid), f"{head}.{body}".encode(), hashlib.sha256).digest()
    return f"{head}.{body}.{b64(mac)}"


def claims(**kw):
    c = dict(good)
    for k, v in kw.items():
        if v is None:
            c.pop(k, None)
        else:
            c[k] = v
    return c


tokens = {
    "RS256": sign(good, "RS256", "rsa"),
    "RS384": sign(good, "RS384", "rsa"),
    "RS512": sign(good, "RS512", "rsa"),
    "PS256": sign(good, "PS256", "rsa"),
    "ES256": sign(good, "ES256", "ec256"),
    "ES384": sign(good, "ES384", "ec384"),
    "EdDSA": sign(good, "EdDSA", "ed"),
    "HS256": jwt.encode(good, secret, algorithm="HS256"),
    "HS384": jwt.encode(good, secret, algorithm="HS384"),
    "HS512": jwt.encode(good, secret, algorithm="HS512"),
    "es256_no_kid": sign(good, "ES256", None, key=keys["ec256"]),
    "bob": sign(claims(sub="bob", role="user", groups=["qa"]), "ES256", "ec256"),
    "carol": sign(claims(sub="carol", role="user", groups=["dev"]), "ES256", "ec256"),
    "aud_list": sign(claims(aud=["other", "api"]), "ES256", "ec256"),
    "no_exp": sign(claims(exp=None), "ES256", "ec256"),
    "in_leeway": sign(claims(exp=now - 5), "ES256", "ec256"),
    # failures
    "expired": sign(claims(exp=now - 3600), "ES256", "ec256"),
    "not_yet": sign(claims(nbf=now + 3600), "ES256", "ec256"),
    "exp_text": sign(claims(exp="never"), "ES256", "ec256"),
    "wrong_iss": sign(claims(iss="https://evil.example/"), "ES256", "ec256"),
    "no_iss": sign(claims(iss=None), "ES256", "ec256"),
    "wrong_aud": sign(claims(aud="web"), "ES256", "ec256"),
    "bad_signature": sign(good, "ES256", "ec256", key=keys["rogue"]),
    "none": jwt.encode(good, None, algorithm="none"),
    "hs_confusion": forged_hs256_over("rsa"),
    "wrong_kind": sign(good, "ES256", "rsa", key=keys["ec256"]),
    "hs_here": jwt.encode(good, secret, algorithm="HS256", headers={"kid": "ec256"}),
    "unknown_kid": sign(good, "ES256", "nobody", key=keys["rogue"]),
    "rotated": sign(good, "ES256", "ec-b"),
    "huge": sign(claims(pad="x" * 17000), "ES256", "ec256"),
    "crit": sign(good, "ES256", "ec256", headers={"crit": ["exp"]}),
}
tokens["tampered"] = tokens["ES256"].split(".")[0] + "." + b64(
    json.dumps(claims(role="root")).encode()
) + "." + tokens["ES256"].split(".")[2]
json.dump(tokens, sys.stdout)
