//! A site's operator controls (DESIGN §15.2, §15.8): `maintenance` (on a site or a
//! route), `https_redirect`, `hsts` and `http_versions`.

use std::time::Duration;

use http::StatusCode;

use super::args::*;
use super::values::*;
use super::{Builder, Res};
use crate::config::diag::Diagnostic;
use crate::config::model::*;
use crate::config::parser::{Directive, Word};

const MAINTENANCE: &str = "maintenance [CODE] [BODY | file FILE] [allow CIDR...]";

impl Builder {
    /// `maintenance [CODE] [BODY | file FILE] [allow CIDR...]`; a FILE is read now,
    /// relative to the config file's folder.
    pub(super) fn maintenance(&self, d: &Directive) -> Res<Maintenance> {
        no_block(d)?;
        let mut m = Maintenance {
            span: d.span(),
            ..Maintenance::default_answer()
        };
        let mut rest = d.args.as_slice();
        if let Some((w, tail)) = rest.split_first().filter(|(w, _)| status_word(w).is_some()) {
            m.status = status(w, 400..=599)?;
            rest = tail;
        }
        let keyword = |w: &Word, k: &str| !w.quoted && w.text == k;
        match rest {
            [f, path, tail @ ..] if keyword(f, "file") && !keyword(path, "allow") => {
                let file = self.dir_of(d.span()).join(&path.text);
                let bytes = std::fs::read(&file).map_err(|e| {
                    Diagnostic::error(path.span, format!("{}: {e}", file.display()))
                        .with_hint("the maintenance page is read when the config loads; create it or fix the path")
                })?;
                m.body = bytes.into();
                m.content_type = mime_guess::from_path(&file)
                    .first_or_text_plain()
                    .essence_str()
                    .to_string();
                if m.content_type.starts_with("text/") {
                    m.content_type.push_str("; charset=utf-8");
                }
                rest = tail;
            }
            [f] if keyword(f, "file") => {
                return Err(missing(d, MAINTENANCE, "maintenance file maintenance.html"))
            }
            [body, tail @ ..] if !keyword(body, "allow") => {
                m.body = body.text.clone().into();
                rest = tail;
            }
            _ => {}
        }
        match rest {
            [] => {}
            [a] if keyword(a, "allow") => {
                return Err(missing(d, MAINTENANCE, "maintenance allow 10.0.0.0/8"))
            }
            [a, nets @ ..] if keyword(a, "allow") => {
                m.allow = nets.iter().map(cidr).collect::<Res<_>>()?;
            }
            [x, ..] => {
                return Err(expected(x, "`allow CIDR...` or the end of the line")
                    .with_hint(format!("write: {MAINTENANCE} (quote a body with spaces)")))
            }
        }
        Ok(m)
    }
}

/// `https_redirect [301|302|307|308]` (default 308); the port is filled in once the
/// listeners are known.
pub(super) fn https_redirect(d: &Directive) -> Res<HttpsRedirect> {
    no_block(d)?;
    let status = match d.args.as_slice() {
        [] => StatusCode::PERMANENT_REDIRECT,
        [w] => match status_word(w) {
            Some(301 | 302 | 307 | 308) => status(w, 301..=308)?,
            _ => return Err(expected(w, "301, 302, 307 or 308")),
        },
        [_, x, ..] => return Err(extra(x, "write: https_redirect [301|302|307|308]")),
    };
    Ok(HttpsRedirect {
        status,
        port: 0,
        span: d.span(),
    })
}

/// `hsts MAX_AGE [subdomains] [preload]`.
pub(super) fn hsts(d: &Directive) -> Res<Hsts> {
    no_block(d)?;
    let Some((age, flags)) = d.args.split_first() else {
        return Err(missing(
            d,
            "hsts MAX_AGE [subdomains] [preload]",
            "hsts 365d subdomains",
        ));
    };
    // A bare number here is days far more often than seconds: say so.
    if age.text.bytes().all(|b| b.is_ascii_digit()) && !age.text.is_empty() {
        return Err(expected(age, "a duration with its unit").with_hint(format!(
            "HSTS ages are long: hsts {}d (days), or {}s if seconds were meant",
            age.text, age.text
        )));
    }
    let mut h = Hsts {
        max_age: duration(age)?,
        subdomains: false,
        preload: false,
    };
    if h.max_age.subsec_nanos() != 0 {
        return Err(expected(age, "whole seconds (365d, 1h)"));
    }
    for w in flags {
        let flag = match w.text.as_str() {
            "subdomains" => &mut h.subdomains,
            "preload" => &mut h.preload,
            _ => return Err(expected(w, "`subdomains` or `preload`")),
        };
        if std::mem::replace(flag, true) {
            return Err(Diagnostic::error(
                w.span,
                format!("`{}` is given twice", w.text),
            ));
        }
    }
    if h.preload && (!h.subdomains || h.max_age < Duration::from_secs(31_536_000)) {
        return Err(Diagnostic::error(
            d.span(),
            "`preload` needs `subdomains` and a max age of a year or more",
        )
        .with_hint("browsers' preload lists accept only that: hsts 365d subdomains preload"));
    }
    Ok(h)
}

/// `http_versions 1.1 2 [3]`: at least one of `1.1` and `2`.
pub(super) fn http_versions(d: &Directive) -> Res<HttpVersions> {
    no_block(d)?;
    if d.args.is_empty() {
        return Err(missing(d, "http_versions 1.1 2 [3]", "http_versions 1.1 2"));
    }
    let mut v = HttpVersions {
        h1: false,
        h2: false,
        h3: false,
    };
    for w in &d.args {
        let on = match w.text.as_str() {
            "1.1" => &mut v.h1,
            "2" => &mut v.h2,
            "3" => &mut v.h3,
            _ => return Err(expected(w, "`1.1`, `2` or `3`")),
        };
        if std::mem::replace(on, true) {
            return Err(Diagnostic::error(
                w.span,
                format!("`{}` is given twice", w.text),
            ));
        }
    }
    if !v.h1 && !v.h2 {
        return Err(Diagnostic::error(d.span(), "a site needs HTTP/1.1 or HTTP/2")
            .with_hint("HTTP/3 is only offered beside them (Alt-Svc on a TCP response): http_versions 1.1 2 3"));
    }
    Ok(v)
}
