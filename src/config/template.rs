//! Placeholders: `{host}`, `{path}`, `{query}`, `{uri}`, `{client_ip}`, `{scheme}` and
//! `{method}` in `respond`, `redirect`, `rewrite`, `header_up` and `header_down`
//! values. Split into parts once at load (an unknown placeholder is a load error);
//! rendered per request from plain values, so this module knows no request type.

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
}

impl Placeholder {
    pub const ALL: [(&'static str, Placeholder); 7] = [
        ("host", Placeholder::Host),
        ("path", Placeholder::Path),
        ("query", Placeholder::Query),
        ("uri", Placeholder::Uri),
        ("client_ip", Placeholder::ClientIp),
        ("scheme", Placeholder::Scheme),
        ("method", Placeholder::Method),
    ];
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TemplatePart {
    Text(String),
    Value(Placeholder),
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
}

/// Why a template was refused at load: the unknown placeholder's name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnknownPlaceholder(pub String);

impl Template {
    /// Splits `text` at its placeholders. A `{…}` that looks like a placeholder name but
    /// is none is refused; other braces are text.
    pub fn parse(text: &str) -> Result<Template, UnknownPlaceholder> {
        let mut parts = Vec::new();
        let mut lit = String::new();
        let mut rest = text;
        while let Some(open) = rest.find('{') {
            // The braces hold no other brace: in `{"ip":"{client_ip}"}` the placeholder
            // is the inner group.
            let Some(close) = rest[open + 1..].find(['{', '}']).map(|c| c + 1) else {
                break;
            };
            if rest.as_bytes()[open + close] == b'{' {
                lit.push_str(&rest[..open + close]);
                rest = &rest[open + close..];
                continue;
            }
            let name = &rest[open + 1..open + close];
            match Placeholder::ALL.iter().find(|(n, _)| *n == name) {
                Some((_, p)) => {
                    lit.push_str(&rest[..open]);
                    if !lit.is_empty() {
                        parts.push(TemplatePart::Text(std::mem::take(&mut lit)));
                    }
                    parts.push(TemplatePart::Value(*p));
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
            parts.push(TemplatePart::Text(lit));
        }
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
            .any(|p| matches!(p, TemplatePart::Value(_)))
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
                },
            }
        }
        out
    }
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
    pub fn has_placeholders(&self) -> bool {
        matches!(self, HeaderOp::Set(_, HeaderTemplate::Render(_)))
    }

    /// Applies the line. A rendered value that cannot be a header value (a control
    /// character from the request, say) is not set.
    pub fn apply(&self, h: &mut HeaderMap, v: &Values<'_>) {
        match self {
            HeaderOp::Set(n, HeaderTemplate::Fixed(value)) => {
                h.insert(n.clone(), value.clone());
            }
            HeaderOp::Set(n, HeaderTemplate::Render(t)) => {
                if let Ok(value) = HeaderValue::from_str(&t.render(v)) {
                    h.insert(n.clone(), value);
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
