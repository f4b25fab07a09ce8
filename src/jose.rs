//! JSON Web Tokens' parts (RFC 7515, 7517, 7519): the signing algorithms a `jwt`
//! filter accepts, a key set read from a JWKS document, and a compact token taken
//! apart. A leaf both the config check (a JWKS file is read at load) and the filter
//! (a JWKS URL is fetched at run time) use, so the two read a key set one way.
//!
//! Signatures are checked by `jsonwebtoken` (on ring). The token is taken apart here,
//! not by it: the algorithm is pinned by the config and the key before anything is
//! verified (never chosen by the token alone), and the registered claims are checked
//! on the JSON itself, so a claim of the wrong type (`"exp": "never"`) is refused
//! rather than skipped.

use base64::Engine as _;
use jsonwebtoken::DecodingKey;
use serde_json::{Map, Value};

/// The most a JWKS document may weigh.
pub const MAX_JWKS: usize = 1024 * 1024;

/// A JWS algorithm a `jwt` filter accepts (`none` is not one).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Algorithm {
    HS256,
    HS384,
    HS512,
    RS256,
    RS384,
    RS512,
    PS256,
    PS384,
    PS512,
    ES256,
    ES384,
    EdDSA,
}

impl Algorithm {
    pub const ALL: [Algorithm; 12] = [
        Algorithm::HS256,
        Algorithm::HS384,
        Algorithm::HS512,
        Algorithm::RS256,
        Algorithm::RS384,
        Algorithm::RS512,
        Algorithm::PS256,
        Algorithm::PS384,
        Algorithm::PS512,
        Algorithm::ES256,
        Algorithm::ES384,
        Algorithm::EdDSA,
    ];

    /// As a token's header names it.
    pub fn name(self) -> &'static str {
        match self {
            Algorithm::HS256 => "HS256",
            Algorithm::HS384 => "HS384",
            Algorithm::HS512 => "HS512",
            Algorithm::RS256 => "RS256",
            Algorithm::RS384 => "RS384",
            Algorithm::RS512 => "RS512",
            Algorithm::PS256 => "PS256",
            Algorithm::PS384 => "PS384",
            Algorithm::PS512 => "PS512",
            Algorithm::ES256 => "ES256",
            Algorithm::ES384 => "ES384",
            Algorithm::EdDSA => "EdDSA",
        }
    }

    pub fn parse(name: &str) -> Option<Algorithm> {
        Algorithm::ALL.into_iter().find(|a| a.name() == name)
    }

    /// An HMAC algorithm (a shared secret, not a public key).
    pub fn is_hmac(self) -> bool {
        matches!(self, Algorithm::HS256 | Algorithm::HS384 | Algorithm::HS512)
    }

    /// The kind of public key that verifies it (`None`: a shared secret).
    fn key_kind(self) -> Option<KeyKind> {
        Some(match self {
            Algorithm::HS256 | Algorithm::HS384 | Algorithm::HS512 => return None,
            Algorithm::RS256
            | Algorithm::RS384
            | Algorithm::RS512
            | Algorithm::PS256
            | Algorithm::PS384
            | Algorithm::PS512 => KeyKind::Rsa,
            Algorithm::ES256 => KeyKind::P256,
            Algorithm::ES384 => KeyKind::P384,
            Algorithm::EdDSA => KeyKind::Ed25519,
        })
    }

    fn library(self) -> jsonwebtoken::Algorithm {
        use jsonwebtoken::Algorithm as A;
        match self {
            Algorithm::HS256 => A::HS256,
            Algorithm::HS384 => A::HS384,
            Algorithm::HS512 => A::HS512,
            Algorithm::RS256 => A::RS256,
            Algorithm::RS384 => A::RS384,
            Algorithm::RS512 => A::RS512,
            Algorithm::PS256 => A::PS256,
            Algorithm::PS384 => A::PS384,
            Algorithm::PS512 => A::PS512,
            Algorithm::ES256 => A::ES256,
            Algorithm::ES384 => A::ES384,
            Algorithm::EdDSA => A::EdDSA,
        }
    }
}

/// What kind of public key a JWK holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum KeyKind {
    Rsa,
    P256,
    P384,
    Ed25519,
}

/// One public signing key of a set.
#[derive(Clone)]
pub struct Key {
    pub kid: Option<String>,
    /// The key's own `alg`, when it names one: then only that algorithm.
    alg: Option<Algorithm>,
    kind: KeyKind,
    key: DecodingKey,
}

impl Key {
    /// Whether this key may verify a token signed with `alg`.
    fn fits(&self, alg: Algorithm) -> bool {
        alg.key_kind() == Some(self.kind) && self.alg.is_none_or(|a| a == alg)
    }
}

/// The public signing keys of a JWKS document. Keys that cannot sign a token sluice
/// accepts (`"use": "enc"`, symmetric `oct` keys, P-521, unknown types) are left out,
/// not an error: a provider's set often holds some.
#[derive(Clone, Default)]
pub struct KeySet {
    pub keys: Vec<Key>,
}

impl KeySet {
    /// Reads a JWKS document; `Err` says what is wrong with it for a log line or a
    /// load error. A set without one usable key is an error.
    pub fn parse(text: &[u8]) -> Result<KeySet, String> {
        if text.len() > MAX_JWKS {
            return Err(format!("over {} KiB", MAX_JWKS / 1024));
        }
        let doc: Value = serde_json::from_slice(text).map_err(|e| format!("not JSON: {e}"))?;
        let Some(Value::Array(entries)) = doc.get("keys") else {
            return Err("not a JWKS document (no \"keys\" list)".into());
        };
        let keys: Vec<Key> = entries.iter().filter_map(key).collect();
        if keys.is_empty() {
            return Err(format!(
                "none of its {} keys is a public signing key sluice can use (RSA, EC P-256/P-384, Ed25519)",
                entries.len()
            ));
        }
        Ok(KeySet { keys })
    }

    /// The keys that may verify a token of `alg` naming `kid` (every fitting key when
    /// the token names none).
    pub fn candidates<'a>(
        &'a self,
        alg: Algorithm,
        kid: Option<&'a str>,
    ) -> impl Iterator<Item = &'a Key> + 'a {
        self.keys
            .iter()
            .filter(move |k| k.fits(alg) && kid.is_none_or(|id| k.kid.as_deref() == Some(id)))
    }

    /// Whether the set holds a key named `kid`, of any kind.
    pub fn has_kid(&self, kid: &str) -> bool {
        self.keys.iter().any(|k| k.kid.as_deref() == Some(kid))
    }
}

/// One JWK, if it is a public signing key of a kind sluice verifies.
fn key(v: &Value) -> Option<Key> {
    let obj = v.as_object()?;
    if obj.get("use").is_some_and(|u| u != "sig") {
        return None;
    }
    let alg = match obj.get("alg") {
        None => None,
        Some(a) => Some(Algorithm::parse(a.as_str()?).filter(|a| !a.is_hmac())?),
    };
    let kind = match (
        obj.get("kty")?.as_str()?,
        obj.get("crv").and_then(Value::as_str),
    ) {
        ("RSA", _) => KeyKind::Rsa,
        ("EC", Some("P-256")) => KeyKind::P256,
        ("EC", Some("P-384")) => KeyKind::P384,
        ("OKP", Some("Ed25519")) => KeyKind::Ed25519,
        _ => return None,
    };
    // The library's JWK type, for the key material only: "alg" and "use" were read
    // above (its own enums refuse values it does not know, which would drop the key).
    let mut bare = obj.clone();
    bare.remove("alg");
    bare.remove("use");
    bare.remove("key_ops");
    let jwk: jsonwebtoken::jwk::Jwk = serde_json::from_value(Value::Object(bare)).ok()?;
    let key = DecodingKey::from_jwk(&jwk).ok()?;
    Some(Key {
        kid: obj.get("kid").and_then(Value::as_str).map(str::to_string),
        alg,
        kind,
        key,
    })
}

/// A compact JWS taken apart, its signature not yet checked.
pub struct Token<'a> {
    pub alg: Option<Algorithm>,
    /// As the header names it, for a log line when it is not one sluice accepts.
    pub alg_name: String,
    pub kid: Option<String>,
    /// `header.payload`, what the signature covers.
    signed: &'a str,
    signature: &'a str,
    payload: &'a str,
}

/// Why a token is refused, as the metrics and the `error_description` name it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    Malformed,
    Algorithm,
    UnknownKey,
    Signature,
    Expired,
    NotYetValid,
    Issuer,
    Audience,
}

impl Refusal {
    pub fn description(self) -> &'static str {
        match self {
            Refusal::Malformed => "malformed token",
            Refusal::Algorithm => "algorithm not accepted",
            Refusal::UnknownKey => "unknown signing key",
            Refusal::Signature => "bad signature",
            Refusal::Expired => "token expired",
            Refusal::NotYetValid => "token not yet valid",
            Refusal::Issuer => "wrong issuer",
            Refusal::Audience => "wrong audience",
        }
    }
}

fn b64(part: &str) -> Result<Vec<u8>, Refusal> {
    base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(part)
        .map_err(|_| Refusal::Malformed)
}

impl<'a> Token<'a> {
    /// A compact JWS (three base64url parts); its header read. A JWE (five parts) or a
    /// header that asks for extensions (`crit`) is malformed. An unsigned token (`alg`
    /// `none`, an empty signature) parses, and is refused for its algorithm.
    pub fn parse(text: &'a str) -> Result<Token<'a>, Refusal> {
        let mut parts = text.split('.');
        let (Some(h), Some(p), Some(s), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(Refusal::Malformed);
        };
        let header: Map<String, Value> =
            serde_json::from_slice(&b64(h)?).map_err(|_| Refusal::Malformed)?;
        if header.contains_key("crit") {
            return Err(Refusal::Malformed);
        }
        let alg_name = header
            .get("alg")
            .and_then(Value::as_str)
            .ok_or(Refusal::Malformed)?;
        let kid = match header.get("kid") {
            None => None,
            Some(Value::String(k)) => Some(k.clone()),
            Some(_) => return Err(Refusal::Malformed),
        };
        Ok(Token {
            alg: Algorithm::parse(alg_name),
            alg_name: alg_name.to_string(),
            kid,
            signed: &text[..h.len() + 1 + p.len()],
            signature: s,
            payload: p,
        })
    }

    /// Whether `key` signed it with `alg` (which the caller checked is accepted and
    /// fits the key).
    pub fn signed_by(&self, alg: Algorithm, key: &Key) -> bool {
        key.fits(alg) && self.verify(alg, &key.key)
    }

    /// Whether the HMAC `secret` signed it with `alg`.
    pub fn signed_with(&self, alg: Algorithm, secret: &DecodingKey) -> bool {
        alg.is_hmac() && self.verify(alg, secret)
    }

    fn verify(&self, alg: Algorithm, key: &DecodingKey) -> bool {
        jsonwebtoken::crypto::verify(self.signature, self.signed.as_bytes(), key, alg.library())
            .unwrap_or(false)
    }

    /// The claims, once the signature is known good: a JSON object.
    pub fn claims(&self) -> Result<Map<String, Value>, Refusal> {
        serde_json::from_slice(&b64(self.payload)?).map_err(|_| Refusal::Malformed)
    }
}

/// What a token's registered claims must satisfy.
pub struct Rules<'a> {
    pub issuers: &'a [String],
    pub audiences: &'a [String],
    pub leeway: u64,
    /// Seconds since the Unix epoch.
    pub now: u64,
}

/// Checks `exp`, `nbf`, `iss` and `aud` (RFC 7519 §4.1). A claim of the wrong type is
/// a refusal. A configured issuer or audience must be present; `exp` need not be.
pub fn check(claims: &Map<String, Value>, r: &Rules<'_>) -> Result<(), Refusal> {
    let time = |name: &str, bad: Refusal| match claims.get(name) {
        None => Ok(None),
        Some(v) => v.as_f64().filter(|t| t.is_finite()).map(Some).ok_or(bad),
    };
    let now = r.now as f64;
    let leeway = r.leeway as f64;
    if time("exp", Refusal::Expired)?.is_some_and(|exp| now >= exp + leeway) {
        return Err(Refusal::Expired);
    }
    if time("nbf", Refusal::NotYetValid)?.is_some_and(|nbf| nbf > now + leeway) {
        return Err(Refusal::NotYetValid);
    }
    if !r.issuers.is_empty() {
        let iss = claims.get("iss").and_then(Value::as_str);
        if !iss.is_some_and(|i| r.issuers.iter().any(|w| w == i)) {
            return Err(Refusal::Issuer);
        }
    }
    if !r.audiences.is_empty() {
        let named = |a: &str| r.audiences.iter().any(|w| w == a);
        let ok = match claims.get("aud") {
            Some(Value::String(a)) => named(a),
            Some(Value::Array(list)) => list.iter().any(|a| a.as_str().is_some_and(named)),
            _ => false,
        };
        if !ok {
            return Err(Refusal::Audience);
        }
    }
    Ok(())
}

/// A claim by name: the whole name first (`https://example.com/roles`), else a dotted
/// path into objects (`realm_access.roles`).
pub fn claim<'c>(claims: &'c Map<String, Value>, name: &str) -> Option<&'c Value> {
    if let Some(v) = claims.get(name) {
        return Some(v);
    }
    let mut parts = name.split('.');
    let mut v = claims.get(parts.next()?)?;
    for p in parts {
        v = v.as_object()?.get(p)?;
    }
    Some(v)
}

/// Whether a claim's value is `want`: a string as is (a `scope`/`scp` string word by
/// word, RFC 8693 §4.2), a number or a boolean as JSON writes it, a list when any
/// element is.
pub fn claim_is(name: &str, v: &Value, want: &str) -> bool {
    match v {
        Value::String(s) if name == "scope" || name == "scp" => s.split(' ').any(|w| w == want),
        Value::String(s) => s == want,
        Value::Number(n) => n.to_string() == want,
        Value::Bool(b) => want == if *b { "true" } else { "false" },
        Value::Array(list) => list.iter().any(|e| !e.is_array() && claim_is("", e, want)),
        _ => false,
    }
}

/// A claim as a request field's value: a string as is, a list's elements joined with
/// `, ` (compact JSON when one holds a `,` or a `"`, which a reader would split on),
/// anything else as compact JSON.
pub fn claim_text(v: &Value) -> String {
    let plain = |e: &Value| e.as_str().is_none_or(|s| !s.contains([',', '"']));
    match v {
        Value::String(s) => s.clone(),
        Value::Array(list) if list.iter().all(plain) => list
            .iter()
            .map(|e| match e {
                Value::String(s) => s.clone(),
                other => other.to_string(),
            })
            .collect::<Vec<_>>()
            .join(", "),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rules<'a>(iss: &'a [String], aud: &'a [String]) -> Rules<'a> {
        Rules {
            issuers: iss,
            audiences: aud,
            leeway: 30,
            now: 1_000_000,
        }
    }

    fn claims(v: Value) -> Map<String, Value> {
        v.as_object().unwrap().clone()
    }

    #[test]
    fn registered_claims_are_checked_on_their_type() {
        let none: [String; 0] = [];
        let r = rules(&none, &none);
        assert_eq!(check(&claims(serde_json::json!({})), &r), Ok(()));
        assert_eq!(
            check(&claims(serde_json::json!({"exp": 1_000_029})), &r),
            Ok(())
        );
        assert_eq!(
            check(&claims(serde_json::json!({"exp": 999_970})), &r),
            Err(Refusal::Expired)
        );
        assert_eq!(
            check(&claims(serde_json::json!({"exp": "never"})), &r),
            Err(Refusal::Expired)
        );
        assert_eq!(
            check(&claims(serde_json::json!({"nbf": 1_000_030})), &r),
            Ok(())
        );
        assert_eq!(
            check(&claims(serde_json::json!({"nbf": 1_000_031})), &r),
            Err(Refusal::NotYetValid)
        );
        let iss = ["a".to_string(), "b".to_string()];
        let r = rules(&iss, &iss);
        let ok = serde_json::json!({"iss": "b", "aud": ["x", "a"]});
        assert_eq!(check(&claims(ok), &r), Ok(()));
        let no_iss = serde_json::json!({"aud": "a"});
        assert_eq!(check(&claims(no_iss), &r), Err(Refusal::Issuer));
        let bad_aud = serde_json::json!({"iss": "a", "aud": ["x"]});
        assert_eq!(check(&claims(bad_aud), &r), Err(Refusal::Audience));
        let no_aud = serde_json::json!({"iss": "a"});
        assert_eq!(check(&claims(no_aud), &r), Err(Refusal::Audience));
    }

    #[test]
    fn claims_compare_as_written() {
        let c = claims(serde_json::json!({
            "role": "admin", "n": 7, "ok": true, "groups": ["a", "b"],
            "scope": "read write", "realm_access": {"roles": ["ops"]},
            "https://x.example/roles": ["r"]
        }));
        let is = |name: &str, want: &str| claim(&c, name).is_some_and(|v| claim_is(name, v, want));
        assert!(is("role", "admin") && !is("role", "adm"));
        assert!(is("n", "7") && is("ok", "true") && !is("ok", "false"));
        assert!(is("groups", "b") && !is("groups", "a, b"));
        assert!(is("scope", "write") && !is("scope", "read write"));
        assert!(is("realm_access.roles", "ops"));
        assert!(is("https://x.example/roles", "r"));
        assert!(!is("missing", "x"));
        assert_eq!(claim_text(&c["groups"]), "a, b");
        assert_eq!(claim_text(&c["n"]), "7");
        let dn = serde_json::json!(["CN=a,OU=b", "c"]);
        assert_eq!(claim_text(&dn), r#"["CN=a,OU=b","c"]"#);
    }

    #[test]
    fn tokens_are_three_parts_with_a_plain_header() {
        let enc = |v: &str| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(v);
        let h = enc(r#"{"alg":"ES256","kid":"k1"}"#);
        let t = format!("{h}.{}.c2ln", enc("{}"));
        let tok = Token::parse(&t).unwrap();
        assert_eq!(
            (tok.alg, tok.kid.as_deref()),
            (Some(Algorithm::ES256), Some("k1"))
        );
        assert!(Token::parse(&format!("{h}.e30")).is_err());
        assert!(Token::parse(&format!("{h}.e30.")).is_ok_and(|t| t.signature.is_empty()));
        assert!(Token::parse(&format!("{h}.e30.a.b.c")).is_err());
        let crit = enc(r#"{"alg":"ES256","crit":["exp"]}"#);
        assert!(Token::parse(&format!("{crit}.e30.c2ln")).is_err());
        let none = enc(r#"{"alg":"none"}"#);
        assert_eq!(Token::parse(&format!("{none}.e30.c2ln")).unwrap().alg, None);
    }

    #[test]
    fn a_key_set_keeps_only_public_signing_keys() {
        let set = serde_json::json!({"keys": [
            {"kty": "oct", "k": "c2VjcmV0"},
            {"kty": "RSA", "use": "enc", "n": "AQAB", "e": "AQAB"},
            {"kty": "EC", "crv": "P-521", "x": "AA", "y": "AA"},
            {"kty": "OKP", "crv": "Ed25519", "kid": "ed", "alg": "EdDSA",
             "x": "11qYAYKxCrfVS_7TyWQHOg7hcvPapiMlrwIaaPcHURo"}
        ]});
        let ks = KeySet::parse(set.to_string().as_bytes()).unwrap();
        assert_eq!(ks.keys.len(), 1);
        assert_eq!(ks.candidates(Algorithm::EdDSA, Some("ed")).count(), 1);
        assert_eq!(ks.candidates(Algorithm::EdDSA, Some("other")).count(), 0);
        assert_eq!(ks.candidates(Algorithm::ES256, None).count(), 0);
        assert!(KeySet::parse(b"{\"keys\": []}").is_err());
        assert!(KeySet::parse(b"[]").is_err());
        assert!(KeySet::parse(&vec![b' '; MAX_JWKS + 1]).is_err());
    }
}
