//! `max_body SIZE` (a route's, or a proxy's own, which the route runs last): a declared
//! Content-Length over the limit gets 413 before anything is sent; a streamed body is
//! cut when it passes the limit, and the handler answers 413 if it still can. Neither
//! counts against a backend.

use http::header::CONTENT_LENGTH;
use http::{Request, StatusCode};
use http_body::Body as _;

use super::{Cx, Filter, Step};
use crate::body::Body;
use crate::reply::local_response;
use crate::stats::{bump, COUNTERS};

pub(crate) struct MaxBody {
    pub max: u64,
}

impl Filter for MaxBody {
    fn on_request(&self, req: &mut Request<Body>, _: &mut Cx<'_>) -> Step {
        let declared = req.body().size_hint().exact().or_else(|| {
            req.headers()
                .get(CONTENT_LENGTH)?
                .to_str()
                .ok()?
                .parse()
                .ok()
        });
        if declared.is_some_and(|n| n > self.max) {
            bump(&COUNTERS.body_too_large);
            return Step::answer(local_response(
                StatusCode::PAYLOAD_TOO_LARGE,
                "Request body too large\n",
            ));
        }
        if !req.body().is_end_stream() {
            let body = std::mem::replace(req.body_mut(), Body::Empty);
            *req.body_mut() = body.limited(self.max);
        }
        Step::Pass
    }
}
