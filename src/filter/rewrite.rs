//! `rewrite FROM TO`: on the normalised path. `rewrite /old /new` replaces a matching
//! path; `rewrite /old/* /new/*` replaces the prefix and keeps the rest. The target may
//! hold placeholders (of the request as received). `rewrite ~ "REGEX" TO` replaces a
//! path the regex matches with TO, whose `{re.N}` are the regex's groups. A target with
//! `?` replaces the query; one without keeps the request's.

use http::Request;

use super::{Cx, Filter, Step};
use crate::body::Body;
use crate::config::template::{Captures, Values};
use crate::config::{PathPattern, Template};

pub(crate) struct Rewrite {
    pub from: PathPattern,
    pub to: Template,
}

impl Rewrite {
    /// The new path (and query, when the target names one) for `path`, if it matches.
    fn target(&self, path: &str, cx: &Cx<'_>) -> Option<String> {
        let rendered = match &self.from {
            PathPattern::Regex(re) => {
                let own = Captures::of(&re.0, path)?;
                let values = Values {
                    captures: Some(&own),
                    ..cx.values()
                };
                self.to.render(&values)
            }
            from if from.matches(path) => self.to.render(&cx.values()),
            _ => return None,
        };
        let mut target = match (&self.from, rendered.strip_suffix("/*")) {
            (PathPattern::Prefix(p), Some(new_prefix)) => {
                format!("{new_prefix}{}", &path[p.len()..])
            }
            _ => rendered,
        };
        if target.is_empty() {
            target.push('/');
        }
        Some(target)
    }
}

impl Filter for Rewrite {
    fn on_request(&self, req: &mut Request<Body>, cx: &mut Cx<'_>) -> Step {
        let Some(target) = self.target(cx.path(req), cx) else {
            return Step::Pass;
        };
        match target.split_once('?') {
            Some((path, query)) => {
                let pq = format!("{}?{query}", req.uri().path());
                set_query(req, &pq);
                cx.set_path(path.to_string());
            }
            None => cx.set_path(target),
        }
        Step::Pass
    }

    fn uses_placeholders(&self) -> bool {
        self.to.has_placeholders()
    }
}

/// Keeps the target's path, replaces its query (the path is replaced at the handler).
fn set_query(req: &mut Request<Body>, path_and_query: &str) {
    let Ok(pq) = http::uri::PathAndQuery::try_from(path_and_query) else {
        return;
    };
    let mut parts = req.uri().clone().into_parts();
    parts.path_and_query = Some(pq);
    if let Ok(u) = http::Uri::from_parts(parts) {
        *req.uri_mut() = u;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::filter::Vars;

    #[test]
    fn rewrites() {
        let vars = Vars::default();
        let cx = Cx::new(None, Some(&vars), std::net::Ipv4Addr::LOCALHOST.into());
        let r = Rewrite {
            from: PathPattern::Prefix("/old".into()),
            to: Template::text("/new/*"),
        };
        assert_eq!(r.target("/old/a/b", &cx).as_deref(), Some("/new/a/b"));
        assert_eq!(r.target("/older", &cx), None);
        let r = Rewrite {
            from: PathPattern::Exact("/old".into()),
            to: Template::text("/new?y=2"),
        };
        assert_eq!(r.target("/old", &cx).as_deref(), Some("/new?y=2"));
    }
}
