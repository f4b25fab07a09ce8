//! `jwt { … }` (DESIGN §18.10) and the `when jwt.CLAIM …` condition.

use std::path::Path;
use std::time::Duration;

use http::HeaderName;

use super::args::*;
use super::values::*;
use super::Res;
use crate::config::diag::{Diagnostic, Span};
use crate::config::model::*;
use crate::config::parser::{Directive, Word};
use crate::jose::{Algorithm, KeySet};

const USAGE: &str = "jwt { jwks FILE|URL | secret_file FILE; issuer I; audience A; algorithms ES256 RS256; from header Authorization; leeway 30s; claims_to_headers { sub X-User } }";

/// Fields a claim may not be copied to: the message's framing and routing.
const FRAMING: [&str; 6] = [
    "host",
    "content-length",
    "transfer-encoding",
    "connection",
    "upgrade",
    "te",
];

/// `jwt { … }`; files are read relative to `dir`.
pub(super) fn jwt(d: &Directive, dir: &Path) -> Res<JwtConfig> {
    if let Some(x) = d.args.first() {
        return Err(extra(
            x,
            "a jwt block takes no arguments; its settings go inside",
        ));
    }
    let items = block(d, USAGE)?;
    let mut keys: Sourced = None;
    let mut algorithms: Listed = None;
    let mut c = JwtConfig {
        keys: JwtKeys::Secret(Vec::new()),
        issuers: Vec::new(),
        audiences: Vec::new(),
        algorithms: Vec::new(),
        from: Vec::new(),
        leeway: Duration::from_secs(30),
        refresh: Duration::from_secs(300),
        claims_to_headers: Vec::new(),
    };
    let mut seen: Vec<(&str, Span)> = Vec::new();
    for i in items {
        let name = i.name.text.as_str();
        if name != "from" {
            if let Some((_, first)) = seen.iter().find(|(n, _)| *n == name) {
                return Err(twice(i, *first));
            }
            seen.push((name, i.span()));
        }
        if name != "claims_to_headers" {
            no_block(i)?;
        }
        setting(i, dir, &mut c, &mut keys, &mut algorithms)?;
    }
    let Some((k, _)) = keys else {
        return Err(Diagnostic::error(d.span(), "a jwt block needs the keys that verify its tokens")
            .with_hint("add jwks https://id.example.com/.well-known/jwks.json (public keys), or secret_file FILE (an HMAC secret)"));
    };
    for (_, field) in &c.claims_to_headers {
        let read_here = *field == http::header::AUTHORIZATION
            || c.from
                .iter()
                .any(|f| *f == TokenSource::Header(field.clone()));
        if read_here {
            return Err(Diagnostic::error(d.span(), format!("claims_to_headers sets `{field}`, where the token is read"))
                .with_hint("a claim's field replaces the client's, so the token would be gone before it is read: pick another field"));
        }
    }
    c.algorithms = pinned(&k, algorithms)?;
    c.keys = k;
    if c.from.is_empty() {
        c.from
            .push(TokenSource::Header(http::header::AUTHORIZATION));
    }
    Ok(c)
}

/// The keys and the algorithms as listed, with where each was written.
type Sourced = Option<(JwtKeys, Span)>;
type Listed = Option<(Vec<(Algorithm, Span)>, Span)>;

/// One line of a `jwt` block.
fn setting(
    i: &Directive,
    dir: &Path,
    c: &mut JwtConfig,
    keys: &mut Sourced,
    algorithms: &mut Listed,
) -> Res<()> {
    let name = i.name.text.as_str();
    match name {
        "jwks" | "secret_file" => {
            if let Some((_, first)) = keys {
                return Err(Diagnostic::error(i.span(), "a jwt block has one source of keys")
                    .with_hint(format!("line {} gives them already: jwks for public keys, secret_file for an HMAC secret", first.line)));
            }
            let w = one_arg(i, &format!("{name} FILE"))?;
            let k = if name == "jwks" {
                jwks(w, dir)?
            } else {
                secret(w, dir)?
            };
            *keys = Some((k, i.span()));
        }
        "issuer" => c.issuers = words(i, "issuer https://id.example.com/")?,
        "audience" => c.audiences = words(i, "audience api.example.com")?,
        "algorithms" => {
            let list = words_of(i, "algorithms ES256 RS256")?
                .iter()
                .map(|w| algorithm(w).map(|a| (a, w.span)))
                .collect::<Res<Vec<_>>>()?;
            *algorithms = Some((list, i.span()));
        }
        "from" => c.from.push(source(i)?),
        "leeway" => {
            let w = one_arg(i, "leeway 30s")?;
            c.leeway = duration(w)?;
            if c.leeway > Duration::from_secs(600) {
                return Err(expected(w, "a leeway of at most 10m")
                    .with_hint("clocks drift by seconds; a long leeway keeps expired tokens alive"));
            }
        }
        "refresh" => {
            let w = one_arg(i, "refresh 5m")?;
            c.refresh = duration(w)?;
            if c.refresh < Duration::from_secs(1) {
                return Err(expected(w, "a refresh of 1s or more"));
            }
        }
        "claims_to_headers" => c.claims_to_headers = claims_to_headers(i)?,
        other => {
            return Err(Diagnostic::error(
                i.span(),
                format!("`{other}` is not a jwt setting"),
            )
            .with_hint("a jwt block takes: jwks, secret_file, issuer, audience, algorithms, from, leeway, refresh, claims_to_headers"))
        }
    }
    Ok(())
}

/// The algorithms accepted: as listed (each fitting the kind of key), else every one
/// the keys can verify.
fn pinned(keys: &JwtKeys, listed: Listed) -> Res<Vec<Algorithm>> {
    let hmac = matches!(keys, JwtKeys::Secret(_));
    let Some((list, _)) = listed else {
        return Ok(Algorithm::ALL
            .into_iter()
            .filter(|a| a.is_hmac() == hmac)
            .collect());
    };
    for (a, span) in &list {
        if a.is_hmac() && !hmac {
            return Err(Diagnostic::error(*span, format!("{} needs a shared secret, and this jwt block reads a JWKS of public keys", a.name()))
                .with_hint("list the algorithms the provider signs with (RS256, ES256, EdDSA…), or use secret_file for HS256"));
        }
        if !a.is_hmac() && hmac {
            return Err(Diagnostic::error(
                *span,
                format!(
                    "{} needs a public key, and this jwt block has an HMAC secret",
                    a.name()
                ),
            )
            .with_hint("with secret_file, list HS256, HS384 or HS512; for public keys use jwks"));
        }
    }
    Ok(list.into_iter().map(|(a, _)| a).collect())
}

fn algorithm(w: &Word) -> Res<Algorithm> {
    if w.text.eq_ignore_ascii_case("none") {
        return Err(Diagnostic::error(
            w.span,
            "`none` is never accepted: an unsigned token proves nothing",
        )
        .with_hint("list the algorithms the tokens are signed with, like ES256 or RS256"));
    }
    Algorithm::parse(&w.text).ok_or_else(|| {
        expected(
            w,
            "HS256, HS384, HS512, RS256, RS384, RS512, PS256, PS384, PS512, ES256, ES384 or EdDSA",
        )
    })
}

/// `jwks URL` (checked for shape; fetched at run time) or `jwks FILE` (read now).
fn jwks(w: &Word, dir: &Path) -> Res<JwtKeys> {
    if w.text.starts_with("http://") || w.text.starts_with("https://") {
        let ok = w
            .text
            .parse::<http::Uri>()
            .is_ok_and(|u| u.host().is_some_and(|h| !h.is_empty()));
        if !ok {
            return Err(expected(
                w,
                "a JWKS URL like https://id.example.com/.well-known/jwks.json",
            ));
        }
        return Ok(JwtKeys::Url(w.text.clone()));
    }
    let path = dir.join(&w.text);
    let text = std::fs::read_to_string(&path).map_err(|e| {
        Diagnostic::error(w.span, format!("{}: {e}", path.display()))
            .with_hint("a JWKS document ({\"keys\": [...]}) or its https:// URL")
    })?;
    KeySet::parse(text.as_bytes()).map_err(|e| {
        Diagnostic::error(w.span, format!("{}: {e}", path.display())).with_hint(
            "the provider's public keys as a JWKS document: {\"keys\": [{\"kty\": \"EC\", …}]}",
        )
    })?;
    Ok(JwtKeys::File { path, text })
}

/// `secret_file F`: its bytes, at least `MIN_SECRET`, and not a key.
fn secret(w: &Word, dir: &Path) -> Res<JwtKeys> {
    let raw = secret_file(w, dir, "the HMAC secret the tokens are signed with")?;
    if raw.starts_with(b"-----BEGIN") || raw.starts_with(b"{") {
        return Err(Diagnostic::error(
            w.span,
            format!("{}: this is a key or a key set, not an HMAC secret", dir.join(&w.text).display()),
        )
        .with_hint("a public key used as an HMAC secret lets anyone who has it sign tokens: for public keys write jwks FILE"));
    }
    Ok(JwtKeys::Secret(raw))
}

/// `from header NAME | cookie NAME | query NAME`.
fn source(i: &Directive) -> Res<TokenSource> {
    let (kind, name) = two_args(i, "from header Authorization | cookie NAME | query NAME")?;
    match kind.text.as_str() {
        "header" => HeaderName::from_bytes(name.text.as_bytes())
            .map(TokenSource::Header)
            .map_err(|_| expected(name, "a header name")),
        "cookie" => Ok(TokenSource::Cookie(name.text.clone())),
        "query" => Ok(TokenSource::Query(name.text.clone())),
        _ => Err(expected(kind, "`header`, `cookie` or `query`")),
    }
}

/// `claims_to_headers { CLAIM FIELD; … }`.
fn claims_to_headers(d: &Directive) -> Res<Vec<(String, HeaderName)>> {
    no_args(d)?;
    let mut out: Vec<(String, HeaderName)> = Vec::new();
    for i in block(d, "claims_to_headers { sub X-User; email X-User-Email }")? {
        no_block(i)?;
        let w = one_arg(i, "CLAIM FIELD, like sub X-User")?;
        let field =
            HeaderName::from_bytes(w.text.as_bytes()).map_err(|_| expected(w, "a header name"))?;
        if field.as_str().contains('_') {
            return Err(Diagnostic::error(w.span, format!("`{}` has a `_`", w.text))
                .with_hint("many backends read `_` and `-` as one, so a client could send its own spelling: write it with `-`, like X-User"));
        }
        if FRAMING.contains(&field.as_str()) {
            return Err(Diagnostic::error(w.span, format!("a claim cannot become `{}`", w.text))
                .with_hint("the message's framing and routing fields are sluice's; pick a field of your own, like X-User"));
        }
        if out.iter().any(|(_, f)| *f == field) {
            return Err(
                Diagnostic::error(w.span, format!("`{}` is given two claims", w.text))
                    .with_hint("one claim per field"),
            );
        }
        out.push((i.name.text.clone(), field));
    }
    if out.is_empty() {
        return Err(
            Diagnostic::error(d.span(), "claims_to_headers copies nothing")
                .with_hint("list CLAIM FIELD lines: claims_to_headers { sub X-User }"),
        );
    }
    Ok(out)
}

fn words_of<'a>(d: &'a Directive, example: &str) -> Res<&'a [Word]> {
    if d.args.is_empty() {
        return Err(missing(d, &format!("{} VALUE...", d.name.text), example));
    }
    Ok(&d.args)
}

fn words(d: &Directive, example: &str) -> Res<Vec<String>> {
    Ok(words_of(d, example)?
        .iter()
        .map(|w| w.text.clone())
        .collect())
}

/// `jwt.CLAIM == V`, `jwt.CLAIM != V` or `jwt.CLAIM in V...` after `when`/`unless`:
/// the test and whether it is negated (`!=`).
pub(super) fn claim_test(d: &Directive, kind: &Word) -> Res<(Test, bool)> {
    let lead = d.name.text.as_str();
    let usage = format!("{lead} jwt.CLAIM == VALUE | != VALUE | in VALUE...");
    let claim = kind.text.strip_prefix("jwt.").unwrap_or("");
    if claim.is_empty() {
        return Err(expected(kind, "a claim after `jwt.`, like jwt.role"));
    }
    let Some((op, values)) = d.args[1..].split_first() else {
        return Err(missing(d, &usage, &format!("{lead} jwt.role == admin")));
    };
    let negate = match op.text.as_str() {
        "==" | "!=" => {
            match values {
                [_] => {}
                [] => return Err(missing(d, &usage, &format!("{lead} jwt.role == admin"))),
                [_, x, ..] => {
                    return Err(extra(
                        x,
                        &format!(
                            "one value after `{}`; for several write: {lead} jwt.{claim} in A B",
                            op.text
                        ),
                    ))
                }
            }
            op.text == "!="
        }
        "in" if !values.is_empty() => false,
        "in" => return Err(missing(d, &usage, &format!("{lead} jwt.role in admin ops"))),
        _ => return Err(expected(op, "`==`, `!=` or `in`")),
    };
    let test = Test::Claim {
        claim: claim.to_string(),
        values: values.iter().map(|w| w.text.clone()).collect(),
    };
    Ok((test, negate))
}
