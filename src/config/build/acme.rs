//! `global { acme { … } }` and `tls auto` (DESIGN §15.5, §15.8): every option checked
//! now, and the whole-config rules a managed certificate needs — a `tls` listener to
//! serve it, a challenge the listeners can answer, names the ACME server can validate.

use super::args::*;
use super::values::*;
use super::vocab::Place;
use super::{Builder, Res};
use crate::config::diag::{Diagnostic, Span};
use crate::config::model::*;
use crate::config::parser::Directive;

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
            let r = no_block(item).and_then(|()| self.acme_option(item, &mut a));
            self.push(r);
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
                    let usage = "challenge http-01|tls-alpn-01...";
                    return Err(missing(item, usage, "challenge tls-alpn-01"));
                }
                (a.http01, a.tls_alpn01) = (false, false);
                for w in &item.args {
                    match w.text.as_str() {
                        "http-01" => a.http01 = true,
                        "tls-alpn-01" => a.tls_alpn01 = true,
                        "dns-01" => {
                            return Err(Diagnostic::error(w.span, "dns-01 is not offered")
                                .with_hint("sluice answers http-01 on plain listeners and tls-alpn-01 on tls ones"))
                        }
                        _ => return Err(expected(w, "`http-01` or `tls-alpn-01`")),
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
                match host {
                    HostPattern::Exact(h) if h.parse::<std::net::IpAddr>().is_err() => {
                        if !orderable(h) {
                            self.errors.push(
                                Diagnostic::error(*span, format!("`tls auto` cannot get a certificate for {word}"))
                                    .with_hint("an ACME server issues for public DNS names: two or more labels of letters, digits and inner hyphens"),
                            );
                        } else if !names.contains(h) {
                            names.push(h.clone());
                        }
                    }
                    HostPattern::Exact(_) => self.errors.push(
                        Diagnostic::error(*span, format!("`tls auto` cannot get a certificate for the address {word}"))
                            .with_hint("certificates are ordered for DNS names; give this address its own site with tls CERT KEY"),
                    ),
                    _ => self.errors.push(
                        Diagnostic::error(*span, format!("`tls auto` cannot get a certificate for {word}"))
                            .with_hint("a wildcard certificate needs the dns-01 challenge, which sluice does not offer: name the hosts, or give this site tls CERT KEY"),
                    ),
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
            if !g.acme.tls_alpn01 && !plain_listener {
                self.errors.push(
                    Diagnostic::error(at, "`tls auto` with only the http-01 challenge needs a plain listener")
                        .with_hint("the ACME server asks for the challenge over plain HTTP on port 80: add listen :80, or allow tls-alpn-01 in global { acme { challenge … } }"),
                );
            }
        }
    }
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
    use super::orderable;

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
