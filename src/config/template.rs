//! Placeholders: `{host}`, `{path}`, `{query}`, `{uri}`, `{client_ip}`, `{scheme}` and
//! `{method}` in `respond`, `redirect`, `rewrite`, `header_up` and `header_down`
//! values, and a regex's groups `{re.N}` / `{re.NAME}`. Split into parts once at load
//! (an unknown placeholder is a load error; a group's name becomes its number once the
//! route's regex is known, [`Template::resolve_groups`]); rendered per request from
//! plain values, so this module knows no request type.

use http::header::{HeaderMap, HeaderName, HeaderValue};

/// Text with placeholders, split at load.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Template {
    pub parts: Vec<TemplatePart>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Placeholder {
    /// The Host without port.
    Host,
    /// The path as received, still percent-encoded.
    Path,
    /// The query as received, without its `?` (empty when there is none).
    Query,
    /// Path and query as received.
    Uri,
    ClientIp,
    Scheme,
    Method,
    /// The verified client certificate's subject (RFC 4514); empty without one.
    TlsClientSubject,
    /// Its subject alternative names, joined by `, ` (a `,` or `\` in one escaped).
    TlsClientSan,
    /// SHA-256 of its DER, lower-case hex.
    TlsClientFingerprint,
}

impl Placeholder {
    pub const ALL: [(&'static str, Placeholder); 10] = [
        ("host", Placeholder::Host),
        ("path", Placeholder::Path),
        ("query", Placeholder::Query),
        ("uri", Placeholder::Uri),
        ("client_ip", Placeholder::ClientIp),
        ("scheme", Placeholder::Scheme),
        ("method", Placeholder::Method),
        ("tls_client_subject", Placeholder::TlsClientSubject),
        ("tls_client_san", Placeholder::TlsClientSan),
        ("tls_client_fingerprint", Placeholder::TlsClientFingerprint),
    ];
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TemplatePart {
    Text(String),
    Value(Placeholder),
    /// `{re.N}` / `{re.NAME}`: a group of the regex the template belongs to.
    Group(Group),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Group {
    Index(usize),
    /// Until [`Template::resolve_groups`] turns it into its index.
    Name(String),
}

/// The groups a regex matched in one path: what `{re.N}` renders to.
#[derive(Debug, Clone, Default)]
pub struct Captures {
    text: String,
    spans: Vec<Option<(usize, usize)>>,
}

impl Captures {
    /// The groups of `re`'s first match in `text`, if it matches.
    pub fn of(re: &regex::Regex, text: &str) -> Option<Captures> {
        let caps = re.captures(text)?;
        Some(Captures {
            text: text.to_string(),
            spans: caps
                .iter()
                .map(|m| m.map(|m| (m.start(), m.end())))
                .collect(),
        })
    }

    /// Group `i`'s text; empty when it did not take part in the match.
    pub fn get(&self, i: usize) -> &str {
        match self.spans.get(i) {
            Some(Some((a, b))) => &self.text[*a..*b],
            _ => "",
        }
    }
}

/// What placeholders render to, for one request.
#[derive(Debug, Clone, Copy, Default)]
pub struct Values<'a> {
    pub host: &'a str,
    pub path: &'a str,
    pub query: Option<&'a str>,
    pub method: &'a str,
    pub client_ip: &'a str,
    pub scheme: &'a str,
    /// The groups of the regex the rendered template belongs to.
    pub captures: Option<&'a Captures>,
    /// The connection's verified client certificate.
    pub(crate) client_cert: Option<&'a crate::net::identity::PeerIdentity>,
}

/// Why a template was refused at load: the unknown placeholder's name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnknownPlaceholder(pub String);

impl Template {
    /// Splits `text` at its placeholders. A `{…}` that looks like a placeholder name but
    /// is none is refused; other braces are text.
    pub fn parse(text: &str) -> Result<Template, UnknownPlaceholder> {
        let parts = split(text, TemplatePart::Text, |name| {
            Ok(match name.strip_prefix("re.") {
                Some(g) => Some(group(g).ok_or_else(|| UnknownPlaceholder(name.to_string()))?),
                None => Placeholder::ALL
                    .iter()
                    .find(|(n, _)| *n == name)
                    .map(|(_, p)| TemplatePart::Value(*p)),
            })
        })?;
        Ok(Template { parts })
    }

    pub fn text(s: &str) -> Template {
        Template {
            parts: vec![TemplatePart::Text(s.to_string())],
        }
    }

    /// Whether rendering needs any request value.
    pub fn has_placeholders(&self) -> bool {
        self.parts
            .iter()
            .any(|p| matches!(p, TemplatePart::Value(_) | TemplatePart::Group(_)))
    }

    /// Turns each `{re.NAME}` into its group's number in `re` (the regex the template
    /// belongs to), and checks every group exists; `Err` is the first that does not
    /// (`None` when there is no regex at all).
    pub fn resolve_groups(&mut self, re: Option<&regex::Regex>) -> Result<(), String> {
        for part in &mut self.parts {
            let TemplatePart::Group(g) = part else {
                continue;
            };
            let shown = match g {
                Group::Index(i) => i.to_string(),
                Group::Name(n) => n.clone(),
            };
            let Some(re) = re else {
                return Err(format!("`{{re.{shown}}}` has no regex here"));
            };
            let index = match g {
                Group::Index(i) => Some(*i).filter(|i| *i < re.captures_len()),
                Group::Name(n) => re.capture_names().position(|c| c == Some(n.as_str())),
            };
            match index {
                Some(i) => *g = Group::Index(i),
                None => {
                    return Err(format!(
                        "`{{re.{shown}}}`: `{}` has no such group",
                        re.as_str()
                    ))
                }
            }
        }
        Ok(())
    }

    pub fn render(&self, v: &Values<'_>) -> String {
        let mut out = String::new();
        for p in &self.parts {
            match p {
                TemplatePart::Text(s) => out.push_str(s),
                TemplatePart::Value(p) => match p {
                    Placeholder::Host => out.push_str(v.host),
                    Placeholder::Path => out.push_str(v.path),
                    Placeholder::Query => out.push_str(v.query.unwrap_or("")),
                    Placeholder::Uri => {
                        out.push_str(v.path);
                        if let Some(q) = v.query {
                            out.push('?');
                            out.push_str(q);
                        }
                    }
                    Placeholder::ClientIp => out.push_str(v.client_ip),
                    Placeholder::Scheme => out.push_str(v.scheme),
                    Placeholder::Method => out.push_str(v.method),
                    Placeholder::TlsClientSubject => {
                        out.push_str(v.client_cert.map_or("", |c| &c.subject))
                    }
                    Placeholder::TlsClientSan => out.push_str(v.client_cert.map_or("", |c| &c.san)),
                    Placeholder::TlsClientFingerprint => {
                        out.push_str(v.client_cert.map_or("", |c| &c.fingerprint))
                    }
                },
                TemplatePart::Group(Group::Index(i)) => {
                    out.push_str(v.captures.map_or("", |c| c.get(*i)))
                }
                TemplatePart::Group(Group::Name(_)) => {}
            }
        }
        out
    }
}

/// Splits `text` at its `{…}` groups whose braces hold no other brace (in
/// `{"ip":"{client_ip}"}` the placeholder is the inner group): `known(name)` makes a
/// part of one, `None` when it is no placeholder; one that looks like a name (lower case
/// and `_`) but is none is refused; everything else is text, made a part by `text_part`.
fn split<P>(
    text: &str,
    text_part: impl Fn(String) -> P,
    mut known: impl FnMut(&str) -> Result<Option<P>, UnknownPlaceholder>,
) -> Result<Vec<P>, UnknownPlaceholder> {
    let mut parts = Vec::new();
    let mut lit = String::new();
    let mut rest = text;
    while let Some(open) = rest.find('{') {
        let Some(close) = rest[open + 1..].find(['{', '}']).map(|c| c + 1) else {
            break;
        };
        if rest.as_bytes()[open + close] == b'{' {
            lit.push_str(&rest[..open + close]);
            rest = &rest[open + close..];
            continue;
        }
        let name = &rest[open + 1..open + close];
        match known(name)? {
            Some(part) => {
                lit.push_str(&rest[..open]);
                if !lit.is_empty() {
                    parts.push(text_part(std::mem::take(&mut lit)));
                }
                parts.push(part);
            }
            None if !name.is_empty()
                && name.bytes().all(|b| b.is_ascii_lowercase() || b == b'_') =>
            {
                return Err(UnknownPlaceholder(name.to_string()));
            }
            None => lit.push_str(&rest[..open + close + 1]),
        }
        rest = &rest[open + close + 1..];
    }
    lit.push_str(rest);
    if !lit.is_empty() {
        parts.push(text_part(lit));
    }
    Ok(parts)
}

/// `N` or `NAME` of `{re.…}`.
fn group(g: &str) -> Option<TemplatePart> {
    if !g.is_empty() && g.bytes().all(|b| b.is_ascii_digit()) {
        return g.parse().ok().map(|i| TemplatePart::Group(Group::Index(i)));
    }
    let name_like = g
        .bytes()
        .enumerate()
        .all(|(k, b)| b == b'_' || b.is_ascii_alphabetic() || (k > 0 && b.is_ascii_digit()));
    (!g.is_empty() && name_like).then(|| TemplatePart::Group(Group::Name(g.to_string())))
}

/// A `header_up` / `header_down` line.
#[derive(Debug, Clone)]
pub enum HeaderOp {
    Set(HeaderName, HeaderTemplate),
    Remove(HeaderName),
}

/// A header value: fixed, encoded once at load, or rendered per request.
#[derive(Debug, Clone)]
pub enum HeaderTemplate {
    Fixed(HeaderValue),
    Render(Template),
}

impl HeaderOp {
    /// The template to render, if the value has placeholders.
    pub fn template_mut(&mut self) -> Option<&mut Template> {
        match self {
            HeaderOp::Set(_, HeaderTemplate::Render(t)) => Some(t),
            _ => None,
        }
    }

    pub fn has_placeholders(&self) -> bool {
        matches!(self, HeaderOp::Set(_, HeaderTemplate::Render(_)))
    }

    /// The field the line sets or removes.
    pub fn name(&self) -> &HeaderName {
        match self {
            HeaderOp::Set(n, _) | HeaderOp::Remove(n) => n,
        }
    }

    /// Applies the line. A rendered value that cannot be a header value (a control
    /// character from the request, say) is not set, and the field is removed: what
    /// the request brought under that name never passes for the rendered value.
    pub fn apply(&self, h: &mut HeaderMap, v: &Values<'_>) {
        match self {
            HeaderOp::Set(n, HeaderTemplate::Fixed(value)) => {
                h.insert(n.clone(), value.clone());
            }
            HeaderOp::Set(n, HeaderTemplate::Render(t)) => {
                match HeaderValue::from_str(&t.render(v)) {
                    Ok(value) => {
                        h.insert(n.clone(), value);
                    }
                    // Never let the client's own field of that name stand in for it.
                    Err(_) => {
                        h.remove(n);
                    }
                }
            }
            HeaderOp::Remove(n) => {
                h.remove(n);
            }
        }
    }
}

/// Applies header lines in order.
pub fn apply_all(h: &mut HeaderMap, ops: &[HeaderOp], v: &Values<'_>) {
    for op in ops {
        op.apply(h, v);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn placeholders_render_from_values() {
        let t = Template::parse("https://{host}{path}?{query} {client_ip} {method} {scheme} {x")
            .unwrap();
        let v = Values {
            host: "a.test",
            path: "/p",
            query: Some("q=1"),
            method: "GET",
            client_ip: "10.0.0.1",
            scheme: "http",
            captures: None,
            client_cert: None,
        };
        assert_eq!(t.render(&v), "https://a.test/p?q=1 10.0.0.1 GET http {x");
        let uri = Template::parse("{uri}").unwrap();
        assert_eq!(uri.render(&v), "/p?q=1");
        assert_eq!(uri.render(&Values { query: None, ..v }), "/p");
        assert_eq!(
            Template::parse("{remote}"),
            Err(UnknownPlaceholder("remote".into()))
        );
        assert!(!Template::parse("{}").unwrap().has_placeholders());
    }

    /// Found by the `template` fuzz target: a placeholder inside other braces (a JSON
    /// body) was left as text.
    #[test]
    fn placeholders_inside_other_braces() {
        let t = Template::parse(r#"{"ip":"{client_ip}","n":{"m":"{method}"}} {{host}}"#).unwrap();
        let v = Values {
            host: "a.test",
            method: "GET",
            client_ip: "10.0.0.1",
            ..Values::default()
        };
        assert_eq!(
            t.render(&v),
            r#"{"ip":"10.0.0.1","n":{"m":"GET"}} {a.test}"#
        );
    }
}

/// An access log line written as a template: `access_log FILE "TEMPLATE"`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct LogTemplate {
    pub parts: Vec<LogPart>,
    /// The request headers `{header.NAME}` asks for, in the order of their parts.
    pub headers: Vec<HeaderName>,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum LogPart {
    Text(String),
    Field(LogField),
    /// `{header.NAME}`: the request header's value, by its index in `headers`.
    Header(usize),
}

/// A value an access log line can show.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LogField {
    Host,
    Path,
    Query,
    Uri,
    ClientIp,
    Scheme,
    Method,
    Status,
    Bytes,
    DurationMs,
    Pool,
    Peer,
    Attempts,
    Protocol,
    RequestId,
    Tls,
    UpstreamMs,
    Time,
    GrpcStatus,
}

impl LogField {
    pub const ALL: [(&'static str, LogField); 19] = [
        ("host", LogField::Host),
        ("path", LogField::Path),
        ("query", LogField::Query),
        ("uri", LogField::Uri),
        ("client_ip", LogField::ClientIp),
        ("scheme", LogField::Scheme),
        ("method", LogField::Method),
        ("status", LogField::Status),
        ("bytes", LogField::Bytes),
        ("duration_ms", LogField::DurationMs),
        ("pool", LogField::Pool),
        ("peer", LogField::Peer),
        ("attempts", LogField::Attempts),
        ("protocol", LogField::Protocol),
        ("request_id", LogField::RequestId),
        ("tls", LogField::Tls),
        ("upstream_ms", LogField::UpstreamMs),
        ("time", LogField::Time),
        ("grpc_status", LogField::GrpcStatus),
    ];
}

impl LogTemplate {
    /// Splits `text` at its placeholders; `Err` names the first unknown one (a `{…}`
    /// that looks like a name but is none, or a `{header.…}` that is no header name).
    /// Other braces are text, as in [`Template::parse`].
    pub fn parse(text: &str) -> Result<LogTemplate, UnknownPlaceholder> {
        let mut headers = Vec::new();
        let parts = split(text, LogPart::Text, |name| {
            Ok(match name.strip_prefix("header.") {
                Some(h) => {
                    let h = HeaderName::from_bytes(h.as_bytes())
                        .map_err(|_| UnknownPlaceholder(name.to_string()))?;
                    headers.push(h);
                    Some(LogPart::Header(headers.len() - 1))
                }
                None => LogField::ALL
                    .iter()
                    .find(|(n, _)| *n == name)
                    .map(|(_, f)| LogPart::Field(*f)),
            })
        })?;
        Ok(LogTemplate { parts, headers })
    }
}
