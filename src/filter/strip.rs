//! `strip PREFIX`: removes a leading path prefix at a segment boundary, on the
//! normalised path; an emptied path becomes `/`. The result has no dot segments, so
//! `strip /api` can never send `/../etc`.

use http::Request;

use super::{Cx, Filter, Step};
use crate::body::Body;
use crate::config::PathPattern;

pub(crate) struct Strip {
    pub prefix: String,
}

impl Filter for Strip {
    fn on_request(&self, req: &mut Request<Body>, cx: &mut Cx<'_>) -> Step {
        let path = cx.path(req);
        if PathPattern::is_under(&self.prefix, path) {
            let rest = &path[self.prefix.len()..];
            let new = if rest.is_empty() { "/" } else { rest };
            let new = new.to_string();
            cx.set_path(new);
        }
        Step::Pass
    }
}
