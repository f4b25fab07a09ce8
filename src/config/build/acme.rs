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
            // dns_update alone: every name is validated by DNS (it works where port
            // 80 and 443 are not reachable from the ACME server).
            (None, Some(_)) => (a.http01, a.tls_alpn01, a.dns01) = (false, false, true),
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
            Some(u) if !acme.http01 && !acme.tls_alpn01 && !in_zone(h, &u.zone) => {
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
    if !in_zone(base, &u.zone) {
        return Err(outside_zone(span, word, &u.zone));
    }
    Ok(())
}

/// Whether `_acme-challenge.NAME` lies in `zone`.
fn in_zone(name: &str, zone: &str) -> bool {
    name == zone || name.ends_with(&format!(".{zone}"))
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
    for item in items {
        if !b.known_here(item, Place::DnsUpdate) {
            continue;
        }
        let v = one_arg(item, &format!("{} VALUE", item.name.text))?;
        match item.name.text.as_str() {
            "zone" => zone = Some(dns_name(v)?),
            "key_name" => key_name = Some((dns_name(v)?, v)),
            "algorithm" => {
                let alg = TsigAlgorithm::from_name(&v.text)
                    .ok_or_else(|| expected(v, "hmac-sha256, hmac-sha384 or hmac-sha512"))?;
                algorithm = Some(alg);
            }
            _ => key = Some((read_key_file(b, item, v)?, v)),
        }
    }
    let need = |what: &str, example: &str| {
        Diagnostic::error(d.span(), format!("dns_update needs `{what}`"))
            .with_hint(format!("add {example} to the block"))
    };
    let zone = zone.ok_or_else(|| need("zone", "zone example.com"))?;
    let (file, at) = key.ok_or_else(|| need("key_file", "key_file acme.key"))?;
    let key_name = match (key_name, file.name) {
        (Some((n, w)), Some(f)) if n != f => {
            return Err(Diagnostic::error(
                w.span,
                format!("the key file names the key {f}, not {n}"),
            )
            .with_hint("the DNS server checks the name: leave key_name out to use the file's"))
        }
        (Some((n, _)), _) => n,
        (None, Some(f)) => f,
        (None, None) => {
            return Err(need(
                "key_name",
                "key_name NAME (the key's name on the DNS server)",
            ))
        }
    };
    let algorithm = match (algorithm, file.algorithm) {
        (Some(a), _) => a,
        (None, Some(f)) => TsigAlgorithm::from_name(&f).ok_or_else(|| {
            Diagnostic::error(
                at.span,
                format!("the key file's algorithm {f} is not one sluice signs with"),
            )
            .with_hint("use hmac-sha256, hmac-sha384 or hmac-sha512 (tsig-keygen -a hmac-sha256)")
        })?,
        (None, None) => TsigAlgorithm::HmacSha256,
    };
    Ok(DnsUpdate {
        server,
        zone,
        key_name,
        algorithm,
        secret: file.secret,
    })
}

/// `key_file F`, read and decoded now.
fn read_key_file(b: &Builder, item: &Directive, v: &Word) -> Res<KeyFile> {
    let path = b.dir_of(item.span()).join(&v.text);
    let text = std::fs::read_to_string(&path).map_err(|e| {
        Diagnostic::error(v.span, format!("{}: {e}", path.display()))
            .with_hint("the TSIG key the DNS server knows, as tsig-keygen writes it")
    })?;
    tsig_key_file(&text).map_err(|e| {
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

/// A TSIG key file: tsig-keygen's `key "NAME" { algorithm ALG; secret "B64"; };`, or
/// the bare base64 secret.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct KeyFile {
    pub name: Option<String>,
    pub algorithm: Option<String>,
    pub secret: Vec<u8>,
}

pub(crate) fn tsig_key_file(text: &str) -> Result<KeyFile, String> {
    use base64::Engine as _;
    let text: String = text
        .lines()
        .map(|l| l.trim())
        .filter(|l| !l.starts_with('#') && !l.starts_with("//"))
        .collect::<Vec<_>>()
        .join(" ");
    let quoted_after = |word: &str| -> Option<String> {
        let at = text.find(word)? + word.len();
        let rest = text[at..].trim_start().strip_prefix('"')?;
        Some(rest[..rest.find('"')?].to_string())
    };
    let (name, algorithm, b64) = if text.contains("secret") {
        let secret = quoted_after("secret").ok_or("no quoted secret after `secret`")?;
        let name = quoted_after("key").map(|n| n.trim_end_matches('.').to_ascii_lowercase());
        let algorithm = text.find("algorithm").map(|at| {
            let rest = &text[at + "algorithm".len()..];
            rest.split(';').next().unwrap_or("").trim().to_string()
        });
        (name, algorithm, secret)
    } else {
        (None, None, text.trim().to_string())
    };
    let secret = base64::engine::general_purpose::STANDARD
        .decode(b64.trim())
        .map_err(|e| format!("the secret is not base64: {e}"))?;
    if secret.len() < 16 {
        return Err(format!(
            "the secret is {} bytes; a TSIG key has at least 16",
            secret.len()
        ));
    }
    Ok(KeyFile {
        name,
        algorithm,
        secret,
    })
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
        let k = tsig_key_file(&keygen).unwrap();
        assert_eq!(k.name.as_deref(), Some("acme.example"));
        assert_eq!(k.algorithm.as_deref(), Some("hmac-sha512"));
        assert_eq!(k.secret, b"sluice-test-secret-32-bytes-!!!");
        let bare = tsig_key_file(&format!("{secret}\n")).unwrap();
        assert_eq!((bare.name, bare.algorithm), (None, None));
        assert_eq!(bare.secret, k.secret);
        for bad in ["", "key \"a\" { secret ; };", "!!!!", "c2hvcnQ="] {
            assert!(tsig_key_file(bad).is_err(), "{bad:?}");
        }
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
