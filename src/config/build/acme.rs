//! `global { acme { … } }` and `tls auto` (DESIGN §15.5, §15.8): every option checked
//! now, and the whole-config rules a managed certificate needs — a `tls` listener to
//! serve it, a challenge the listeners can answer, names the ACME server can validate.

use super::args::*;
use super::values::*;
use super::vocab::Place;
use super::{Builder, Res};
use crate::config::diag::{Diagnostic, Span};
use crate::config::model::*;
use crate::config::parser::{Directive, Word};

impl Builder {
    /// The default storage: `sluice-data/acme` beside the main config file.
    fn default_acme_storage(&self) -> AcmeStorage {
        AcmeStorage::Folder(self.dir_of(Span::default()).join("sluice-data/acme"))
    }

    /// `acme { directory URL; email ADDR; ca_root FILE; storage DIR|redis://…;
    /// challenge http-01 tls-alpn-01; renew_before D }`.
    pub(super) fn acme(&mut self, d: &Directive, g: &mut Global) -> Res<()> {
        no_args(d)?;
        let items = block(d, "acme { email ops@example.com }")?;
        let mut a = AcmeConfig {
            storage: self.default_acme_storage(),
            span: d.span(),
            ..AcmeConfig::default()
        };
        let mut seen = std::collections::HashMap::new();
        for item in items {
            if !self.known_here(item, Place::Acme) {
                continue;
            }
            if let Some(first) = seen.insert(item.name.text.clone(), item.span()) {
                self.errors.push(twice(item, first));
                continue;
            }
            let r = if item.name.text == "dns_update" {
                dns_update(self, item).map(|u| a.dns_update = Some(u))
            } else {
                no_block(item).and_then(|()| self.acme_option(item, &mut a))
            };
            self.push(r);
        }
        match (seen.get("challenge"), &a.dns_update) {
            // dns_update alone: names in its zone are validated by DNS first (it works
            // where ports 80 and 443 are not reachable from the ACME server); others
            // (on-demand customers' names) keep TLS-ALPN-01 and HTTP-01.
            (None, Some(_)) => a.dns01 = true,
            (Some(at), None) if a.dns01 => self.errors.push(
                Diagnostic::error(*at, "the dns-01 challenge needs somewhere to put its TXT records")
                    .with_hint("add dns_update SERVER:PORT { zone example.com; key_name NAME; key_file FILE } to the acme block"),
            ),
            _ => {}
        }
        g.acme = a;
        Ok(())
    }

    fn acme_option(&self, item: &Directive, a: &mut AcmeConfig) -> Res<()> {
        match item.name.text.as_str() {
            "directory" => {
                let w = one_arg(item, "directory URL")?;
                let ok = w.text.parse::<http::Uri>().is_ok_and(|u| {
                    matches!(u.scheme_str(), Some("https" | "http")) && u.host().is_some()
                });
                if !ok {
                    return Err(expected(w, "the ACME server's directory URL").with_hint(
                        "e.g. directory https://acme-staging-v02.api.letsencrypt.org/directory",
                    ));
                }
                a.directory = w.text.clone();
            }
            "email" => {
                let w = one_arg(item, "email ADDR")?;
                let ok = w.text.split_once('@').is_some_and(|(u, h)| {
                    !u.is_empty() && h.contains('.') && !w.text.contains(char::is_whitespace)
                });
                if !ok {
                    return Err(expected(w, "an email address like ops@example.com"));
                }
                a.email = Some(w.text.clone());
            }
            "ca_root" => {
                let w = one_arg(item, "ca_root FILE")?;
                let path = self.dir_of(item.span()).join(&w.text);
                crate::config::certs::load_chain(&path).map_err(|e| {
                    Diagnostic::error(w.span, format!("{}: {e}", path.display())).with_hint(
                        "a PEM file with the root the ACME server's certificate chains to",
                    )
                })?;
                a.ca_root = Some(path);
            }
            "storage" => {
                let w = one_arg(item, "storage DIR | storage redis://HOST:PORT")?;
                a.storage = if w.text.starts_with("redis://") {
                    AcmeStorage::Redis(super::filters::redis_url(w)?)
                } else {
                    let path = self.dir_of(item.span()).join(&w.text);
                    super::cache::writable(&path).map_err(|e| {
                        Diagnostic::error(w.span, format!("{}: {e}", path.display())).with_hint(
                            "the folder must exist or be creatable, and be writable by sluice",
                        )
                    })?;
                    AcmeStorage::Folder(path)
                };
            }
            "challenge" => {
                if item.args.is_empty() {
                    let usage = "challenge http-01|tls-alpn-01|dns-01...";
                    return Err(missing(item, usage, "challenge tls-alpn-01"));
                }
                (a.http01, a.tls_alpn01, a.dns01) = (false, false, false);
                for w in &item.args {
                    match w.text.as_str() {
                        "http-01" => a.http01 = true,
                        "tls-alpn-01" => a.tls_alpn01 = true,
                        "dns-01" => a.dns01 = true,
                        _ => return Err(expected(w, "`http-01`, `tls-alpn-01` or `dns-01`")),
                    }
                }
            }
            "renew_before" => a.renew_before = positive(one_arg(item, "renew_before 30d")?)?,
            _ => unreachable!("known_here checked the name"),
        }
        Ok(())
    }

    /// A `tls on_demand` site: names that match a pattern, never an exact name (those
    /// are `tls auto`'s), and a `tls` listener to hand them out on.
    fn on_demand_site(&mut self, site: &Site, tls_listener: bool) {
        let Some(t) = &site.tls else { return };
        for (host, (word, span)) in site.hosts.iter().zip(&site.host_words) {
            if let HostPattern::Exact(_) = host {
                self.errors.push(
                    Diagnostic::error(*span, format!("`tls on_demand` is for names not known in advance, and {word} is one"))
                        .with_hint("give on_demand to a `site *` or `site *.example.com`, and named hosts their own site with tls auto"),
                );
            }
        }
        if !tls_listener {
            self.errors.push(
                Diagnostic::error(
                    t.span,
                    format!(
                        "site `{}` has `tls on_demand` but there is no `tls` listener",
                        site.name
                    ),
                )
                .with_hint("add one: listen :443 tls"),
            );
        }
    }

    /// After the whole file is read: each `tls auto` site's names, and what its
    /// certificate needs from the listeners and the `acme` settings.
    pub(super) fn acme_sites(&mut self, g: &mut Global, listeners: &[Listen], sites: &mut [Site]) {
        if g.acme.span == Span::default() {
            g.acme.storage = self.default_acme_storage();
        }
        let auto = sites.iter().any(|s| {
            s.tls.as_ref().is_some_and(|t| {
                matches!(
                    t.source,
                    CertSource::Auto { .. } | CertSource::OnDemand { .. }
                )
            })
        });
        // A folder written in the block was checked there; the default is checked here.
        let default = g.acme.storage == self.default_acme_storage();
        if let (true, true, AcmeStorage::Folder(dir)) = (auto, default, &g.acme.storage) {
            if let Err(e) = super::cache::writable(dir) {
                self.errors.push(
                    Diagnostic::error(g.acme.span, format!("ACME storage {}: {e}", dir.display()))
                        .with_hint("certificates are kept there: make it writable by sluice, or set global { acme { storage DIR } }"),
                );
            }
        }
        let tls_listener = listeners.iter().any(|l| l.tls);
        let plain_listener = listeners.iter().any(|l| !l.tls);
        for site in sites.iter_mut() {
            let Some(t) = site.tls.as_mut() else { continue };
            if let CertSource::OnDemand { .. } = t.source {
                self.on_demand_site(site, tls_listener);
                continue;
            }
            let CertSource::Auto { names } = &mut t.source else {
                continue;
            };
            let at = t.span;
            for (host, (word, span)) in site.hosts.iter().zip(&site.host_words) {
                match auto_name(&g.acme, host, word, *span) {
                    Ok(name) if !names.contains(&name) => names.push(name),
                    Ok(_) => {}
                    Err(e) => self.errors.push(e),
                }
            }
            if !tls_listener {
                self.errors.push(
                    Diagnostic::error(
                        at,
                        format!(
                            "site `{}` has `tls auto` but there is no `tls` listener",
                            site.name
                        ),
                    )
                    .with_hint("add one: listen :443 tls"),
                );
            }
            if !g.acme.tls_alpn01 && !g.acme.dns01 && !plain_listener {
                self.errors.push(
                    Diagnostic::error(at, "`tls auto` with only the http-01 challenge needs a plain listener")
                        .with_hint("the ACME server asks for the challenge over plain HTTP on port 80: add listen :80, or allow tls-alpn-01 in global { acme { challenge … } }"),
                );
            }
        }
    }
}

/// The name a `tls auto` host orders, or why it cannot be ordered.
fn auto_name(acme: &AcmeConfig, host: &HostPattern, word: &str, span: Span) -> Res<String> {
    match host {
        HostPattern::Exact(h) if h.parse::<std::net::IpAddr>().is_ok() => Err(
            Diagnostic::error(span, format!("`tls auto` cannot get a certificate for the address {word}"))
                .with_hint("certificates are ordered for DNS names; give this address its own site with tls CERT KEY"),
        ),
        HostPattern::Exact(h) if !orderable(h) => Err(
            Diagnostic::error(span, format!("`tls auto` cannot get a certificate for {word}"))
                .with_hint("an ACME server issues for public DNS names: two or more labels of letters, digits and inner hyphens"),
        ),
        HostPattern::Exact(h) => match &acme.dns_update {
            Some(u) if !acme.http01 && !acme.tls_alpn01 && !u.covers(h) => {
                Err(outside_zone(span, word, &u.zone))
            }
            _ => Ok(h.clone()),
        },
        HostPattern::Suffix(suffix) => {
            wildcard(acme, word, span, &suffix[1..])?;
            Ok(word.to_ascii_lowercase())
        }
        HostPattern::Any => Err(
            Diagnostic::error(span, "`tls auto` cannot get a certificate for every name")
                .with_hint("name the hosts (or *.example.com with dns_update), or use tls on_demand { ask URL } for names not known in advance"),
        ),
    }
}

/// A wildcard `tls auto` name: dns-01 validates it (the only challenge an ACME server
/// offers for one), so it needs `dns_update` and a base name inside its zone.
fn wildcard(acme: &AcmeConfig, word: &str, span: Span, base: &str) -> Res<()> {
    if !orderable(base) || word.matches('*').count() != 1 {
        return Err(Diagnostic::error(
            span,
            format!("`tls auto` cannot get a certificate for {word}"),
        )
        .with_hint("a wildcard certificate covers one label: *.app.example.com"));
    }
    let Some(u) = &acme.dns_update else {
        return Err(Diagnostic::error(span, format!("`tls auto` for {word} needs the dns-01 challenge, and no `dns_update` says where its TXT record goes"))
            .with_hint("add global { acme { dns_update SERVER:PORT { zone example.com; key_name NAME; key_file FILE } } }, or name the hosts"));
    };
    if !u.covers(base) {
        return Err(outside_zone(span, word, &u.zone));
    }
    Ok(())
}

fn outside_zone(span: Span, word: &str, zone: &str) -> Diagnostic {
    Diagnostic::error(
        span,
        format!("the dns-01 record of {word} is outside the zone {zone} that dns_update changes"),
    )
    .with_hint("set dns_update's zone to the zone this name is in")
}

/// `dns_update SERVER:PORT { zone Z; key_name N; key_file F; algorithm hmac-sha256 }`;
/// the key file is read now, so a missing or malformed one is an error at its line.
fn dns_update(b: &mut Builder, d: &Directive) -> Res<DnsUpdate> {
    const USAGE: &str = "dns_update SERVER:PORT { zone example.com; key_name NAME; key_file FILE }";
    let w = match d.args.as_slice() {
        [w] => w,
        [_, x, ..] => return Err(extra(x, USAGE)),
        [] => return Err(missing(d, USAGE, "dns_update 192.0.2.53:53 { … }")),
    };
    let server = dns_server(w)?;
    let items = block(
        d,
        "dns_update 192.0.2.53:53 { zone example.com; key_name acme; key_file acme.key }",
    )?;
    let (mut zone, mut key_name, mut algorithm, mut key) = (None, None, None, None);
    let mut seen = std::collections::HashMap::new();
    for item in items {
        if !b.known_here(item, Place::DnsUpdate) {
            continue;
        }
        if let Some(first) = seen.insert(item.name.text.as_str(), item.span()) {
            return Err(twice(item, first));
        }
        let v = one_arg(item, &format!("{} VALUE", item.name.text))?;
        match item.name.text.as_str() {
            "zone" => zone = Some(dns_name(v)?),
            "key_name" => key_name = Some((dns_name(v)?, v)),
            "algorithm" => {
                let alg = TsigAlgorithm::from_name(&v.text)
                    .ok_or_else(|| expected(v, "hmac-sha256, hmac-sha384 or hmac-sha512"))?;
                algorithm = Some((alg, v));
            }
            _ => key = Some((item, v)),
        }
    }
    let need = |what: &str, example: &str| {
        Diagnostic::error(d.span(), format!("dns_update needs `{what}`"))
            .with_hint(format!("add {example} to the block"))
    };
    let zone = zone.ok_or_else(|| need("zone", "zone example.com"))?;
    let (item, at) = key.ok_or_else(|| need("key_file", "key_file acme.key"))?;
    let want = key_name.as_ref().map(|(n, _): &(String, &Word)| n.as_str());
    let file = read_key_file(b, item, at, want)?;
    let (key_name, algorithm) = key_of(file.name, key_name, file.algorithm, algorithm, at)
        .map_err(|e| {
            e.unwrap_or_else(|| {
                need(
                    "key_name",
                    "key_name NAME (the key's name on the DNS server)",
                )
            })
        })?;
    Ok(DnsUpdate {
        server,
        zone,
        key_name,
        algorithm,
        secret: file.secret,
    })
}

/// The key's name and algorithm: from the block, else from the key file (the file's
/// must agree with the block's), else the default algorithm. `Err(None)`: no name.
fn key_of(
    file_name: Option<String>,
    key_name: Option<(String, &Word)>,
    file_alg: Option<String>,
    algorithm: Option<(TsigAlgorithm, &Word)>,
    at: &Word,
) -> Result<(String, TsigAlgorithm), Option<Diagnostic>> {
    let key_name = match (key_name, file_name) {
        (Some((n, w)), Some(f)) if n != f => {
            let e = Diagnostic::error(w.span, format!("the key file names the key {f}, not {n}"));
            return Err(Some(e.with_hint(
                "the DNS server checks the name: leave key_name out to use the file's",
            )));
        }
        (Some((n, _)), _) => n,
        (None, Some(f)) => f,
        (None, None) => return Err(None),
    };
    let from_file = match file_alg {
        Some(f) => match TsigAlgorithm::from_name(&f) {
            Some(a) => Some(a),
            None => {
                let e = Diagnostic::error(
                    at.span,
                    format!("the key file's algorithm {f} is not one sluice signs with"),
                );
                return Err(Some(e.with_hint(
                    "use hmac-sha256, hmac-sha384 or hmac-sha512 (tsig-keygen -a hmac-sha256)",
                )));
            }
        },
        None => None,
    };
    let algorithm = match (algorithm, from_file) {
        (Some((a, w)), Some(f)) if a != f => {
            let e = Diagnostic::error(
                w.span,
                format!("the key file's algorithm is {}, not {}", f.name(), a.name()),
            );
            return Err(Some(e.with_hint(
                "the DNS server checks it: leave algorithm out to use the file's",
            )));
        }
        (Some((a, _)), _) => a,
        (None, Some(f)) => f,
        (None, None) => TsigAlgorithm::HmacSha256,
    };
    Ok((key_name, algorithm))
}

/// `key_file F`, read and decoded now.
fn read_key_file(b: &Builder, item: &Directive, v: &Word, want: Option<&str>) -> Res<KeyFile> {
    let path = b.dir_of(item.span()).join(&v.text);
    let text = std::fs::read_to_string(&path).map_err(|e| {
        Diagnostic::error(v.span, format!("{}: {e}", path.display()))
            .with_hint("the TSIG key the DNS server knows, as tsig-keygen writes it")
    })?;
    tsig_key_file(&text, want).map_err(|e| {
        Diagnostic::error(v.span, format!("{}: {e}", path.display()))
            .with_hint("write it with tsig-keygen NAME > FILE, or put the bare base64 secret in it")
    })
}

/// A DNS name as written: lower case, no final dot, labels of 1 to 63 bytes.
fn dns_name(w: &Word) -> Res<String> {
    let name = w.text.trim_end_matches('.').to_ascii_lowercase();
    let ok = !name.is_empty()
        && name.len() <= 253
        && name.split('.').all(|l| {
            !l.is_empty()
                && l.len() <= 63
                && l.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"-_".contains(&b))
        });
    if !ok {
        return Err(expected(w, "a DNS name like example.com"));
    }
    Ok(name)
}

/// A TSIG key file: tsig-keygen's `key "NAME" { algorithm ALG; secret "B64"; };` (one
/// or more; comments `#`, `//` and `/* */`), or the bare base64 secret.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct KeyFile {
    pub name: Option<String>,
    pub algorithm: Option<String>,
    pub secret: Vec<u8>,
}

/// The key named `want` in the file (any key when it holds one).
pub(crate) fn tsig_key_file(text: &str, want: Option<&str>) -> Result<KeyFile, String> {
    let tokens = key_tokens(text);
    if tokens.first().map(String::as_str) != Some("key") {
        let b64: String = tokens.concat();
        return Ok(KeyFile {
            name: None,
            algorithm: None,
            secret: secret(&b64)?,
        });
    }
    let mut keys = Vec::new();
    let mut t = tokens.iter().map(String::as_str).peekable();
    while let Some(word) = t.next() {
        match word {
            ";" => continue,
            "key" => {}
            other => return Err(format!("expected `key`, found `{other}`")),
        }
        let name = t.next().ok_or("a `key` without a name")?;
        let name = name
            .trim_matches('"')
            .trim_end_matches('.')
            .to_ascii_lowercase();
        if t.next() != Some("{") {
            return Err(format!("expected `{{` after key \"{name}\""));
        }
        let (mut algorithm, mut b64) = (None, None);
        loop {
            match t.next() {
                Some("}") => break,
                Some("algorithm") => algorithm = t.next().map(|v| v.trim_matches('"').to_string()),
                Some("secret") => b64 = t.next().map(|v| v.trim_matches('"').to_string()),
                Some(_) => {}
                None => return Err(format!("key \"{name}\" has no closing `}}`")),
            }
        }
        let b64 = b64.ok_or_else(|| format!("key \"{name}\" has no `secret`"))?;
        keys.push((name, algorithm, b64));
    }
    let names: Vec<&str> = keys.iter().map(|k| k.0.as_str()).collect();
    let pick = match want {
        Some(w) => keys.iter().position(|k| k.0 == w),
        None if keys.len() == 1 => Some(0),
        None => {
            return Err(format!(
                "it holds {} keys ({}): say which with key_name",
                keys.len(),
                names.join(", ")
            ))
        }
    };
    // A file of one key whose name differs is left for the caller to report.
    let i = pick.or((keys.len() == 1).then_some(0)).ok_or_else(|| {
        format!(
            "it has no key {}; it has {}",
            want.unwrap_or(""),
            names.join(", ")
        )
    })?;
    let (name, algorithm, b64) = keys.swap_remove(i);
    Ok(KeyFile {
        name: Some(name),
        algorithm,
        secret: secret(&b64)?,
    })
}

/// The words of a key file: quoted strings (quotes kept), `{`, `}`, `;`, and bare
/// words, comments left out.
fn key_tokens(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = text;
    loop {
        rest = rest.trim_start();
        let Some(c) = rest.chars().next() else {
            return out;
        };
        let end = if rest.starts_with('#') || rest.starts_with("//") {
            rest.find('\n').unwrap_or(rest.len())
        } else if let Some(body) = rest.strip_prefix("/*") {
            body.find("*/").map_or(rest.len(), |i| i + 4)
        } else if c == '"' {
            let close = rest[1..].find('"').map_or(rest.len(), |i| i + 2);
            out.push(rest[..close].to_string());
            close
        } else if "{};".contains(c) {
            out.push(c.to_string());
            1
        } else {
            let n = rest
                .find(|c: char| c.is_whitespace() || "{};\"".contains(c))
                .unwrap_or(rest.len());
            out.push(rest[..n].to_string());
            n
        };
        rest = &rest[end..];
    }
}

/// A TSIG secret: standard base64 of at least 16 bytes.
fn secret(b64: &str) -> Result<Vec<u8>, String> {
    use base64::Engine as _;
    let secret = base64::engine::general_purpose::STANDARD
        .decode(b64.trim())
        .map_err(|e| format!("the secret is not base64: {e}"))?;
    if secret.len() < 16 {
        return Err(format!(
            "the secret is {} bytes; a TSIG key has at least 16",
            secret.len()
        ));
    }
    Ok(secret)
}

/// A name an ACME server can issue for: two or more labels, each of letters, digits
/// and hyphens, neither starting nor ending with a hyphen (no `_`, no single label
/// such as `localhost`).
pub(crate) fn orderable(name: &str) -> bool {
    let labels: Vec<&str> = name.split('.').collect();
    labels.len() >= 2
        && labels.iter().all(|l| {
            !l.is_empty()
                && l.len() <= 63
                && !l.starts_with('-')
                && !l.ends_with('-')
                && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
        })
}

#[cfg(test)]
mod tests {
    use super::{orderable, tsig_key_file};

    #[test]
    fn tsig_key_files_are_read_as_tsig_keygen_writes_them_or_bare() {
        let secret = "c2x1aWNlLXRlc3Qtc2VjcmV0LTMyLWJ5dGVzLSEhIQ==";
        let keygen = format!(
            "# made by tsig-keygen\nkey \"Acme.Example.\" {{\n\talgorithm hmac-sha512;\n\tsecret \"{secret}\";\n}};\n"
        );
        let k = tsig_key_file(&keygen, None).unwrap();
        assert_eq!(k.name.as_deref(), Some("acme.example"));
        assert_eq!(k.algorithm.as_deref(), Some("hmac-sha512"));
        assert_eq!(k.secret, b"sluice-test-secret-32-bytes-!!!");
        let bare = tsig_key_file(&format!("{secret}\n"), None).unwrap();
        assert_eq!((bare.name, bare.algorithm), (None, None));
        assert_eq!(bare.secret, k.secret);
        for bad in [
            "",
            "key \"a\" { secret ; };",
            "!!!!",
            "c2hvcnQ=",
            "key \"a\" { algorithm hmac-sha256;",
        ] {
            assert!(tsig_key_file(bad, None).is_err(), "{bad:?}");
        }
        // Words inside names, comments of every kind, quoted values, several keys.
        let two = format!(
            "/* rotated\n keys */ key \"old-secret\" {{ algorithm \"hmac-sha256\"; secret \"{secret}\"; }};\n\
             key acme {{ # the current one\n algorithm hmac-sha384; // strong\n secret \"{secret}\"; }};"
        );
        let k = tsig_key_file(&two, Some("acme")).unwrap();
        assert_eq!(
            (k.name.as_deref(), k.algorithm.as_deref()),
            (Some("acme"), Some("hmac-sha384"))
        );
        let k = tsig_key_file(&two, Some("old-secret")).unwrap();
        assert_eq!(k.algorithm.as_deref(), Some("hmac-sha256"));
        let e = tsig_key_file(&two, None).unwrap_err();
        assert!(e.contains("old-secret, acme"), "{e}");
        let e = tsig_key_file(&two, Some("other")).unwrap_err();
        assert!(e.contains("no key other"), "{e}");
    }

    #[test]
    fn orderable_names_are_dns_names_of_two_labels_or_more() {
        for ok in ["a.test", "www.app.example.com", "x-1.y2.test"] {
            assert!(orderable(ok), "{ok}");
        }
        for bad in [
            "localhost",
            "a_b.test",
            "-a.test",
            "a-.test",
            "a..test",
            "a.test.",
        ] {
            assert!(!orderable(bad), "{bad}");
        }
    }
}
