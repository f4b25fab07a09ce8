//! Renders `{host}`, `{path}`, `{query}`, `{uri}` for redirects, responses and rewrites.
//! Values come from the request as received (path still percent-encoded).

use http::Uri;

use crate::config::{Template, TemplatePart};

pub struct Values<'a> {
    pub host: &'a str,
    pub uri: &'a Uri,
}

pub fn render(t: &Template, v: &Values<'_>) -> String {
    let mut out = String::new();
    for p in &t.parts {
        match p {
            TemplatePart::Text(s) => out.push_str(s),
            TemplatePart::Host => out.push_str(v.host),
            TemplatePart::Path => out.push_str(v.uri.path()),
            TemplatePart::Query => {
                if let Some(q) = v.uri.query() {
                    out.push('?');
                    out.push_str(q);
                }
            }
            TemplatePart::Uri => out.push_str(v.uri.path_and_query().map_or("/", |pq| pq.as_str())),
        }
    }
    out
}
